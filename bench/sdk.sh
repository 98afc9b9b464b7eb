#!/bin/sh
# sdk.sh - make bench S=sdk (installed as build/bench/bench/bench_sdk): creates per second
# from one Python process (the SDK's asyncio interface, one event loop) against the same
# cell driven from C (libdsec's dsec_create_async), the same window in flight.
# The cell: `dsec up` with one sim node with room for every create and no modelled
# start-up latency (time_scale 0), so the figures are client + control-plane cost.
# Rounds alternate C and Python; each side reports its best round. Last line: JSON.
set -eu
DSEC="@DSEC_BIN@"
CBENCH="@CBENCH_BIN@"
LIB="@DSEC_LIB@"
SRC="@DSEC_SRC@"
PY="@DSEC_PY@"
N="${SDK_BENCH_N:-10000}"
WINDOW="${SDK_BENCH_WINDOW:-256}"
ROUNDS="${SDK_BENCH_ROUNDS:-3}"

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

figure() { sed -n 's/^creates_per_s=\([0-9.]*\).*/\1/p'; }
best() { printf '%s\n' "$@" | sort -g | tail -1; }
C_ALL=""; PY_ALL=""
printf '%-6s %-8s %14s\n' round client creates/s
r=1
while [ $r -le "$ROUNDS" ]; do
    c=$("$CBENCH" "$URL" "$N" "$WINDOW" | figure)
    p=$(PYTHONPATH="$SRC/sdk/python" DSEC_LIB="$LIB" PYTHONDONTWRITEBYTECODE=1 \
        "$PY" "$SRC/bench/sdk.py" "$URL" "$N" "$WINDOW" | figure)
    printf '%-6s %-8s %14s\n' "$r" C "$c" "$r" python "$p"
    C_ALL="$C_ALL $c"; PY_ALL="$PY_ALL $p"
    r=$((r + 1))
done
C_BEST=$(best $C_ALL)
PY_BEST=$(best $PY_ALL)
RATIO=$("$PY" -c "print(round($PY_BEST / $C_BEST, 3))")
echo "creates: $N per round, $WINDOW in flight, best of $ROUNDS; python/C = $RATIO (target >= 0.8)"
printf '{"scenario":"sdk","py_creates_per_s":%s,"c_creates_per_s":%s,"py_over_c":%s,"creates_per_round":%s,"window":%s,"rounds":%s}\n' \
    "$PY_BEST" "$C_BEST" "$RATIO" "$N" "$WINDOW" "$ROUNDS"
