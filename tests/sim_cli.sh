#!/bin/sh
# sim_cli.sh - dsec-sim end to end: gen, stats, a cut trace, a 160-node sim cell, record beside a replay, replay the recording, the report and its PNGs; with "jobs", replayed training jobs honouring reclaims in a small cell and the progress bar on and off a terminal.
set -eu
SIM="$1"
PART="${2:-main}"
D=$(mktemp -d /tmp/dsec-test-simcli-XXXXXX)
CELL=""
REC=""
cleanup() {
    [ -n "$REC" ] && kill "$REC" 2>/dev/null || true
    [ -n "$CELL" ] && kill "$CELL" 2>/dev/null && wait "$CELL" 2>/dev/null || true
    rm -rf "$D"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# start_cell ARGS...: a dsec-sim cell in the background; sets CELL and URL
start_cell() {
    "$SIM" cell --state "$D/cell" --url-file "$D/url" "$@" >"$D/cell.log" 2>&1 &
    CELL=$!
    i=0
    while [ ! -s "$D/url" ]; do
        i=$((i + 1)); [ $i -gt 100 ] && fail "cell did not start: $(cat "$D/cell.log")"
        sleep 0.1
    done
    URL=$(cat "$D/url")
}

if [ "$PART" = jobs ]; then
    command -v script >/dev/null 2>&1 || fail "script (util-linux) is needed to give the replay a terminal"
    # two training jobs hold 28 of the 32 CPUs of 4 nodes; 200 rollouts then need room mid-trace
    "$SIM" gen --profile dsec --duration 10 --rate 2 --burst-min 200 --burst-max 200 --burst-every 0 \
        --burst-spread 1 --life-median 20 --life-max 60 --memory 64 --jobs 2 --job-units 4 --job-cpu 3500 \
        --job-memory 6000 --job-checkpoint 1 -o "$D/j.trc" 2>"$D/gen.err"
    "$SIM" stats --json "$D/j.trc" >"$D/stats.json"
    grep -q '"jobs":2,"job_holders":8,"job_cpu_milli":28000' "$D/stats.json" || fail "job stats: $(cat "$D/stats.json")"
    # one scheduler replica: two racing for the last room can refuse a rollout outright
    start_cell --nodes 4 --replicas 1 --node-cpu 8000 --node-memory 16384
    R="$SIM replay --trace $D/j.trc --url $URL --type sim --drain 5"

    # on a terminal: the bar is drawn while it runs, then the report follows on a line of its own
    script -qec "$R --speed 2 --report $D/rep" "$D/tty.log" </dev/null >/dev/null ||
        fail "replay under a terminal: $(cat "$D/tty.log")"
    tr -d '\r' <"$D/tty.log" >"$D/tty.txt"
    BARS=$(grep -o '\] *[0-9]*% [0-9]*/[0-9]* records' "$D/tty.txt" | wc -l)
    [ "$BARS" -ge 3 ] || fail "progress bar drawn $BARS times: $(cat "$D/tty.txt")"
    grep -q '100% 232/232 records' "$D/tty.txt" || fail "progress never reached the end: $(cat "$D/tty.txt")"
    N=$(wc -l <"$D/rep/report.txt")
    sed -n '/^replay of /,$p' "$D/tty.txt" | head -n "$N" >"$D/tty.report"
    diff "$D/rep/report.txt" "$D/tty.report" >"$D/tty.diff" || fail "report garbled on the terminal: $(cat "$D/tty.diff")"

    # the reclaims: requested of the replayed jobs, honoured after their checkpoints, none forced, no rollout lost
    J="$D/rep/report.json"
    REQ=$(sed -n 's/.*"reclaims":{"requested":\([0-9]*\),.*/\1/p' "$J")
    [ -n "$REQ" ] && [ "$REQ" -ge 1 ] || fail "no reclaim requested: $(cat "$J")"
    grep -q "\"reclaims\":{\"requested\":$REQ,\"honoured\":$REQ,\"forced\":0,\"failed\":0}" "$J" ||
        fail "reclaims not all honoured: $(cat "$J")"
    grep -q '"jobs":{"started":2,"failed":0,' "$J" || fail "jobs: $(cat "$J")"
    grep -q "\"reclaims_received\":$REQ,\"checkpoints\":$REQ," "$J" || fail "job side: $(cat "$J")"
    grep -q '"units_forced":0},"rollouts_lost":0,' "$J" || fail "forced units or lost rollouts: $(cat "$J")"
    grep -q '"errors":0,' "$J" || fail "errors: $(cat "$J") $(cat "$D/rep/report.txt")"
    grep -q '^  honoured  *[1-9]' "$D/rep/report.txt" || fail "text report: $(cat "$D/rep/report.txt")"
    if command -v gnuplot >/dev/null 2>&1; then
        [ -s "$D/rep/reclaims.png" ] || fail "no reclaims.png"
        # the plot has data: the series holds the requested and honoured events
        awk '!/^#/ { q += $8; h += $9 } END { exit !(q >= 1 && h == q) }' "$D/rep/series.dat" ||
            fail "series.dat reclaim columns: $(cat "$D/rep/series.dat")"
    fi

    # not on a terminal: no bar anywhere, the report intact on stdout
    $R --speed 4 >"$D/plain.out" 2>"$D/plain.err" || fail "replay: $(cat "$D/plain.err")"
    if grep -q '% [0-9]*/[0-9]* records' "$D/plain.out" "$D/plain.err"; then fail "progress bar off a terminal"; fi
    if tr -d '\n' <"$D/plain.out" | grep -q "$(printf '\r')"; then fail "carriage returns off a terminal"; fi
    grep -q '^reclaim events ' "$D/plain.out" || fail "report: $(cat "$D/plain.out")"
    # stdout a terminal but stderr (where the bar goes) a file: no bar
    script -qec "$R --speed 4 --no-progress 2>$D/np.err; $R --speed 4 2>$D/tty2.err" "$D/tty2.log" </dev/null >/dev/null ||
        fail "replay with stderr redirected: $(cat "$D/tty2.log")"
    if grep -q '% [0-9]*/[0-9]* records' "$D/tty2.log" "$D/tty2.err" "$D/np.err"; then
        fail "progress bar drawn with stderr redirected or --no-progress"
    fi
    [ "$(grep -c '^replay of ' "$D/tty2.log")" -eq 2 ] || fail "reports: $(cat "$D/tty2.log")"
    echo "sim_cli jobs: ok ($REQ reclaims requested and honoured; progress bar on a terminal only)"
    exit 0
fi

# gen with overrides, stats
"$SIM" gen --profile dsec --duration 60 --rate 20 --burst-max 1500 --burst-every 0 --life-median 30 \
    --life-max 300 --jobs 2 --job-units 2 -o "$D/t.trc" 2>"$D/gen.err"
"$SIM" stats --json "$D/t.trc" >"$D/stats.json"
grep -q '"max_job_creates":1500' "$D/stats.json" || fail "stats: $(cat "$D/stats.json")"
grep -q '"job_holders":4' "$D/stats.json" || fail "stats: no job holders"
if "$SIM" gen --profile dsec --no-such 1 -o "$D/x.trc" 2>"$D/err"; then fail "unknown parameter accepted"; fi
grep -q 'no-such' "$D/err" || fail "unknown parameter: $(cat "$D/err")"

# a cut trace says where it broke
SIZE=$(wc -c <"$D/t.trc")
head -c $((SIZE - 5)) "$D/t.trc" >"$D/cut.trc"
if "$SIM" stats "$D/cut.trc" 2>"$D/err"; then fail "a cut trace was accepted"; fi
grep -q 'cut.trc: record [0-9]* (after the header) at byte [0-9]*: .*truncated' "$D/err" || fail "cut: $(cat "$D/err")"

# a 160-node cell
start_cell --nodes 160

# record beside the replay
"$SIM" record -o "$D/rec.trc" --url "$URL" 2>"$D/rec.err" &
REC=$!
sleep 0.5
"$SIM" replay --trace "$D/t.trc" --speed 20 --url "$URL" --type sim --report "$D/rep" --json --no-progress \
    --drain 5 >"$D/replay.json" 2>"$D/replay.txt" || fail "replay: $(cat "$D/replay.txt")"
sleep 0.5
kill -INT "$REC"
wait "$REC" || fail "record: $(cat "$D/rec.err")"
REC=""
CREATES=$(sed -n 's/.*"creates_ok":\([0-9]*\).*/\1/p' "$D/replay.json")
[ "$CREATES" -gt 1500 ] || fail "replay created $CREATES: $(cat "$D/replay.json")"
grep -q '"errors":0' "$D/replay.json" || fail "replay errors: $(cat "$D/replay.json" "$D/replay.txt")"
grep -q '"nodes":160' "$D/rep/report.json" || fail "report: $(cat "$D/rep/report.json")"
if command -v gnuplot >/dev/null 2>&1; then
    for p in creates latency live nodes reclaims errors; do
        [ -s "$D/rep/$p.png" ] || fail "no $p.png: $(cat "$D/rep/gnuplot.log" 2>/dev/null)"
    done
fi

# the recording holds the replay: every create, every destroy, and replays cleanly itself
"$SIM" stats --json "$D/rec.trc" >"$D/rec.json"
grep -q "\"creates\":$CREATES," "$D/rec.json" || fail "recorded creates: $(cat "$D/rec.json") vs $CREATES"
"$SIM" replay --trace "$D/rec.trc" --speed 5 --url "$URL" --json --no-progress --drain 5 \
    >"$D/replay2.json" 2>"$D/replay2.txt" || fail "replay of the recording: $(cat "$D/replay2.txt")"
grep -q '"errors":0' "$D/replay2.json" || fail "replay of the recording: $(cat "$D/replay2.json" "$D/rec.err")"
grep -q '"unmapped":0' "$D/replay2.json" || fail "unmapped: $(cat "$D/replay2.json" "$D/rec.err")"
grep -q "\"creates_ok\":$CREATES," "$D/replay2.json" || fail "replay of the recording: $(cat "$D/replay2.json")"
grep -q "\"destroys_sent\":0," "$D/replay2.json" || fail "the recording's destroys were not used: $(cat "$D/replay2.json")"
echo "sim_cli: ok ($CREATES creates replayed, recorded and replayed again)"
