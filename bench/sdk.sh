#!/bin/sh
# sdk.sh - make bench S=sdk (installed as build/bench/bench/bench_sdk): creates per second
# from one Python process (the SDK's asyncio interface, one event loop) against the same
# cell driven from C (libdsec's dsec_create_async), the same window in flight.
# The cell: `dsec up` with one sim node with room for every create and no modelled
# start-up latency (time_scale 0), so the figures are client + control-plane cost.
# Python runs in two shapes of trainer code (bench/sdk.py): "workers" (WINDOW tasks,
# each awaiting one create after another: the headline figure) and "tasks" (one task
# per create under an asyncio.Semaphore, which adds asyncio's cost per task).
# Rounds alternate C, Python workers and Python tasks; each reports its best round,
# with the process's CPU per create in that round. Last line: JSON.
set -eu
DSEC="@DSEC_BIN@"
CBENCH="@CBENCH_BIN@"
LIB="@DSEC_LIB@"
SRC="@DSEC_SRC@"
PY="@DSEC_PY@"
N="${SDK_BENCH_N:-10000}"
WINDOW="${SDK_BENCH_WINDOW:-256}"
ROUNDS="${SDK_BENCH_ROUNDS:-5}"

TMP=$(mktemp -d /tmp/dsec-bench-sdk-XXXXXX)
UP_PID=""
cleanup() {
    if [ -n "$UP_PID" ]; then kill -INT "$UP_PID" 2>/dev/null || true; wait "$UP_PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL="nats://127.0.0.1:$PORT"
cat > "$TMP/cell.yaml" <<YAML
cell: local
nodes:
  - name: local-0
    cpu_milli: 1000000
    memory_mb: 1048576
    slots: 100000
    types: [sim]
    backend: sim
    sim: {time_scale: 0}
YAML
"$DSEC" up --config "$TMP/cell.yaml" --port "$PORT" --state-dir "$TMP/state" > "$TMP/up.log" 2>&1 &
UP_PID=$!
i=0
until grep -q "Ctrl-C stops" "$TMP/up.log" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 300 ]; then cat "$TMP/up.log" >&2; echo "bench sdk: dsec up did not start" >&2; exit 1; fi
    sleep 0.1
done

# each client prints "creates_per_s=<x> cpu_us_per_create=<y> ok=<n> failed=<n>"
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
# the fastest round of a file of "<creates_per_s> <cpu_us_per_create>" lines
best() { sort -g -k1,1 "$1" | tail -1; }
py() {
    PYTHONPATH="$SRC/sdk/python" DSEC_LIB="$LIB" PYTHONDONTWRITEBYTECODE=1 \
        "$PY" "$SRC/bench/sdk.py" "$URL" "$N" "$WINDOW" "$1"
}
printf '%-6s %-8s %12s %14s\n' round client creates/s "cpu us/create"
r=1
while [ $r -le "$ROUNDS" ]; do
    for side in c workers tasks; do
        if [ $side = c ]; then out=$("$CBENCH" "$URL" "$N" "$WINDOW"); else out=$(py $side); fi
        rate=$(printf '%s\n' "$out" | field creates_per_s)
        cpu=$(printf '%s\n' "$out" | field cpu_us_per_create)
        if [ -z "$rate" ] || [ -z "$cpu" ]; then
            echo "bench sdk: round $r of $side printed no figure: $out" >&2
            exit 1
        fi
        echo "$rate $cpu" >> "$TMP/$side"
        printf '%-6s %-8s %12s %14s\n' "$r" "$side" "$rate" "$cpu"
    done
    r=$((r + 1))
done
set -- $(best "$TMP/c") $(best "$TMP/workers") $(best "$TMP/tasks")
C_BEST=$1 C_CPU=$2 W_BEST=$3 W_CPU=$4 T_BEST=$5 T_CPU=$6
W_RATIO=$("$PY" -c "print(round($W_BEST / $C_BEST, 3))")
T_RATIO=$("$PY" -c "print(round($T_BEST / $C_BEST, 3))")
echo "creates: $N per round, $WINDOW in flight, best of $ROUNDS rounds"
echo "python/C = $W_RATIO with $WINDOW rollout tasks (target >= 0.8); $T_RATIO with one task per create under a semaphore"
printf '{"scenario":"sdk","py_creates_per_s":%s,"c_creates_per_s":%s,"py_over_c":%s,"py_tasks_creates_per_s":%s,"py_tasks_over_c":%s,"py_cpu_us_per_create":%s,"c_cpu_us_per_create":%s,"py_tasks_cpu_us_per_create":%s,"creates_per_round":%s,"window":%s,"rounds":%s}\n' \
    "$W_BEST" "$C_BEST" "$W_RATIO" "$T_BEST" "$T_RATIO" "$W_CPU" "$C_CPU" "$T_CPU" "$N" "$WINDOW" "$ROUNDS"
