#!/bin/sh
# sim_cli.sh - dsec-sim end to end: gen, stats, a cut trace, a 160-node sim cell, record beside a replay, replay the recording, the report and its PNGs.
set -eu
SIM="$1"
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
"$SIM" cell --nodes 160 --state "$D/cell" --url-file "$D/url" >"$D/cell.log" 2>&1 &
CELL=$!
i=0
while [ ! -s "$D/url" ]; do
    i=$((i + 1)); [ $i -gt 100 ] && fail "cell did not start: $(cat "$D/cell.log")"
    sleep 0.1
done
URL=$(cat "$D/url")

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
grep -q '"errors":0' "$D/replay2.json" || fail "replay of the recording: $(cat "$D/replay2.json")"
grep -q '"unmapped":0' "$D/replay2.json" || fail "unmapped: $(cat "$D/replay2.json")"
grep -q "\"creates_ok\":$CREATES," "$D/replay2.json" || fail "replay of the recording: $(cat "$D/replay2.json")"
grep -q "\"destroys_sent\":0," "$D/replay2.json" || fail "the recording's destroys were not used: $(cat "$D/replay2.json")"
echo "sim_cli: ok ($CREATES creates replayed, recorded and replayed again)"
