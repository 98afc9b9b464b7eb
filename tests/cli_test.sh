#!/bin/sh
# cli_test.sh - the dsec CLI and dsecd end to end: dsec up, every sandbox command, top, bad configs.
set -eu
DSEC="$1"
DSECD="$2"
TMP=$(mktemp -d /tmp/dsec-cli-XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export DSEC_URL="nats://127.0.0.1:$PORT"
UP_PID=""
EV_PID=""
LOGD=""
# what the script started ends with it, a failed check included (a `dsec events` left
# running would hold the test's output open)
cleanup() {
    for p in $EV_PID $LOGD $UP_PID; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$DSEC" up --port "$PORT" --state-dir "$TMP/state" > "$TMP/up.log" 2>&1 &
UP_PID=$!
for i in $(seq 1 100); do
    grep -q "Ctrl-C stops" "$TMP/up.log" 2>/dev/null && break
    sleep 0.1
done
grep -q "Ctrl-C stops" "$TMP/up.log" || { cat "$TMP/up.log"; fail "dsec up did not start"; }

ID=$("$DSEC" create --type sim --cpu 0.5 --memory 256 --ttl 600 --label team=rl)
case "$ID" in local-0-*) ;; *) fail "create printed '$ID'";; esac

[ "$("$DSEC" exec "$ID" -- echo hello world)" = "hello world" ] || fail "exec output"
set +e
"$DSEC" exec "$ID" -- false; rc=$?
set -e
[ "$rc" = 1 ] || fail "exec of false exited $rc"
[ "$(printf 'abc' | "$DSEC" exec "$ID" --stdin -- cat)" = "abc" ] || fail "exec stdin"
# a request id names one run: asked again, the node answers with that run's output, and
# the same id for another command is refused
[ "$("$DSEC" exec "$ID" --req-id cli-once-1 -- echo first)" = "first" ] || fail "exec --req-id"
[ "$("$DSEC" exec "$ID" --req-id cli-once-1 -- echo first)" = "first" ] ||
    fail "exec --req-id asked again"
set +e
"$DSEC" exec "$ID" --req-id cli-once-1 -- echo second 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "named another command" "$TMP/err.txt" ||
    fail "exec --req-id reused for another command: rc=$rc $(cat "$TMP/err.txt")"

printf 'payload\n' > "$TMP/in.txt"
"$DSEC" cp "$TMP/in.txt" "$ID:/work/in.txt" >/dev/null
"$DSEC" cp "$ID:/work/in.txt" "$TMP/out.txt"
cmp -s "$TMP/in.txt" "$TMP/out.txt" || fail "cp round trip"
# into a device or a FIFO: written in place, never replaced by a renamed temporary file
"$DSEC" cp "$ID:/work/in.txt" /dev/null || fail "cp to /dev/null"
[ -c /dev/null ] || fail "cp replaced /dev/null"
mkfifo "$TMP/fifo"
cat "$TMP/fifo" > "$TMP/from-fifo" &
READER=$!
"$DSEC" cp "$ID:/work/in.txt" "$TMP/fifo" || { kill "$READER"; fail "cp to a FIFO"; }
wait "$READER"
[ -p "$TMP/fifo" ] && cmp -s "$TMP/in.txt" "$TMP/from-fifo" || fail "cp to a FIFO: not written in place"
"$DSEC" ls "$ID" /work | grep -q "in.txt" || fail "ls"
# more than a message: an upload whose sha256 both ends agree on, and back
head -c 9000001 /dev/urandom > "$TMP/big.bin"
"$DSEC" cp -v "$TMP/big.bin" "$ID:/work/big.bin" 2> "$TMP/cp.txt" || fail "cp of 9 MB: $(cat "$TMP/cp.txt")"
grep -q "^9000001 bytes (0 resumed) sha256 $(sha256sum "$TMP/big.bin" | cut -c1-64) " "$TMP/cp.txt" ||
    fail "cp -v: $(cat "$TMP/cp.txt")"
"$DSEC" cp "$ID:/work/big.bin" "$TMP/big.out" && cmp -s "$TMP/big.bin" "$TMP/big.out" ||
    fail "cp of 9 MB back"
# dsec cp -r: a directory tree up and back, files checked, modes kept, a link skipped
mkdir -p "$TMP/tree/a/b"
printf 'one' > "$TMP/tree/x.txt"
head -c 300000 /dev/urandom > "$TMP/tree/a/b/r.bin"
ln -s x.txt "$TMP/tree/link"
"$DSEC" cp -r "$TMP/tree" "$ID:/work/tree" 2> "$TMP/cpr.txt" || fail "cp -r up: $(cat "$TMP/cpr.txt")"
grep -q "^2 files (300003 bytes) and 3 directories copied; 1 links or special files skipped" \
    "$TMP/cpr.txt" || fail "cp -r up said: $(cat "$TMP/cpr.txt")"
"$DSEC" cp -r "$ID:/work/tree" "$TMP/tree-back" 2> "$TMP/cpr.txt" || fail "cp -r down: $(cat "$TMP/cpr.txt")"
rm "$TMP/tree/link"
diff -r "$TMP/tree" "$TMP/tree-back" > /dev/null || fail "cp -r round trip differs"
set +e
"$DSEC" cp -r "$TMP/tree/x.txt" "$ID:/work/t2" 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "is not a directory" "$TMP/err.txt" || fail "cp -r of a file: rc=$rc"
# dsec files: mkdir, mv, stat, rm
"$DSEC" files mkdir -p "$ID" /work/d/e || fail "files mkdir -p"
"$DSEC" files mv "$ID" /work/big.bin /work/d/e/big.bin || fail "files mv"
"$DSEC" files stat "$ID" /work/d/e/big.bin | grep -q "^file 0644 9000001 " || fail "files stat"
"$DSEC" files rm -r "$ID" /work/d || fail "files rm -r"
set +e
"$DSEC" files stat "$ID" /work/d 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "not_found" "$TMP/err.txt" || fail "files stat after rm: rc=$rc"

# the tenant's sandboxes, asked of the nodes: by label, as JSON; rm --label destroys exactly
# the matches (a dry run without --yes); the tenant's events stream says so
"$DSEC" events --json > "$TMP/events.json" 2> "$TMP/events.err" &
EV_PID=$!
sleep 0.5
E1=$("$DSEC" create --type sim --label run=exp-7 --label team=rl)
E2=$("$DSEC" create --type sim --label run=exp-7)
E3=$("$DSEC" create --type sim --label run=exp-8)
"$DSEC" ls --label run=exp-7 > "$TMP/ls.txt" || fail "ls --label: $(cat "$TMP/ls.txt")"
head -1 "$TMP/ls.txt" | grep -q "^ID .*STATE.*LABELS" || fail "ls header: $(head -1 "$TMP/ls.txt")"
[ "$(tail -n +2 "$TMP/ls.txt" | awk '{print $1}' | sort | tr '\n' ' ')" = \
  "$(printf '%s\n%s\n' "$E1" "$E2" | sort | tr '\n' ' ')" ] || fail "ls --label run=exp-7: $(cat "$TMP/ls.txt")"
grep -q "$E1 .*running.*run=exp-7,team=rl" "$TMP/ls.txt" || fail "ls row: $(cat "$TMP/ls.txt")"
"$DSEC" ls --label run=exp-7 --label team=rl --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
ids = [i["id"] for i in d["items"]]
assert ids == [sys.argv[1]], ids
assert d["items"][0]["labels"] == {"run": "exp-7", "team": "rl"}, d
assert d["next_cursor"] == "" and d["missing"] == [], d
' "$E1" || fail "ls --json"
[ "$("$DSEC" ls --limit 1 --label run=exp-7 2>/dev/null | tail -n +2 | wc -l)" = 1 ] || fail "ls --limit 1"
[ "$("$DSEC" ls --all --limit 1 --label run=exp-7 | tail -n +2 | wc -l)" = 2 ] || fail "ls --all --limit 1"
for bad in "--label foo:label" "--limit 0:limit" "--limit 10001:limit" "--cursor nope:cursor" \
           "--state sleeping:state"; do
    set +e
    "$DSEC" ls ${bad%%:*} > /dev/null 2> "$TMP/err.txt"; rc=$?
    set -e
    [ "$rc" = 2 ] && grep -q "${bad##*:}" "$TMP/err.txt" || fail "ls ${bad%%:*}: rc=$rc $(cat "$TMP/err.txt")"
done
set +e
"$DSEC" rm --label run=exp-7 > "$TMP/rm.txt" 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "add --yes" "$TMP/err.txt" && [ "$(wc -l < "$TMP/rm.txt")" = 2 ] ||
    fail "rm --label without --yes: rc=$rc $(cat "$TMP/rm.txt" "$TMP/err.txt")"
"$DSEC" status "$E1" | grep -q running || fail "rm without --yes destroyed $E1"
"$DSEC" rm --label run=exp-7 --yes > "$TMP/rm.txt" || fail "rm --label --yes: $(cat "$TMP/rm.txt")"
grep -q "destroyed 2 sandbox" "$TMP/rm.txt" || fail "rm --label --yes said: $(cat "$TMP/rm.txt")"
[ "$("$DSEC" ls --label run=exp-7 | wc -l)" = 1 ] || fail "rm --label left some"
"$DSEC" ls --label run=exp-8 | grep -q "$E3" || fail "rm --label run=exp-7 took $E3"
"$DSEC" ls ID-is-not-a-flag 2>/dev/null && fail "ls ID of no sandbox succeeded"
for i in $(seq 1 50); do
    grep -q "\"$E2\",\"state\":\"gone\"" "$TMP/events.json" && break
    sleep 0.1
done
kill "$EV_PID"; wait "$EV_PID" 2>/dev/null || true
EV_PID=""
grep -q "\"$E1\",\"state\":\"running\"" "$TMP/events.json" &&
    grep -q "\"$E2\",\"state\":\"gone\"" "$TMP/events.json" ||
    fail "events: $(cat "$TMP/events.json" "$TMP/events.err")"
"$DSEC" rm "$E3" > /dev/null

KIDS=$("$DSEC" fork "$ID" -n 2)
[ "$(echo "$KIDS" | wc -l)" = 2 ] || fail "fork printed '$KIDS'"
K1=$(echo "$KIDS" | head -1)
[ "$("$DSEC" cp "$K1:/work/in.txt" -)" = "payload" ] || fail "fork child lacks the parent's file"

"$DSEC" pause "$ID" >/dev/null
"$DSEC" status "$ID" | grep -q paused || fail "status after pause"
set +e
"$DSEC" exec "$ID" -- echo x 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "resume it first" "$TMP/err.txt" || fail "exec on paused: rc=$rc $(cat "$TMP/err.txt")"
"$DSEC" resume "$ID" >/dev/null
"$DSEC" status "$ID" | grep -q running || fail "status after resume"

# ttl: the sandbox's end moves; its new end is printed; nonsense is refused, saying why
OUT=$("$DSEC" ttl "$ID" 900)
echo "$OUT" | grep -Eq "^$ID	ends [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$" || fail "ttl printed '$OUT'"
set +e
"$DSEC" ttl "$ID" 0 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "at least 1" "$TMP/err.txt" || fail "ttl 0: rc=$rc $(cat "$TMP/err.txt")"
set +e
"$DSEC" ttl "$ID" 99999999 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "max_ttl_s" "$TMP/err.txt" || fail "ttl past the max: rc=$rc $(cat "$TMP/err.txt")"

"$DSEC" top --once --interval 300 > "$TMP/top.txt"
grep -q "local-0" "$TMP/top.txt" || { cat "$TMP/top.txt"; fail "top shows no node"; }
grep -q "sandboxes by type: sim 3" "$TMP/top.txt" || { cat "$TMP/top.txt"; fail "top shows no per-type count"; }

"$DSEC" rm "$ID" $KIDS >/dev/null
set +e
"$DSEC" status "$ID" 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "not_found" "$TMP/err.txt" || fail "status after rm"

set +e
"$DSEC" create --cpu lots 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--cpu" "$TMP/err.txt" || fail "bad --cpu"
set +e
"$DSEC" create --type sim --disk 0 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--disk \"0\".*cell default" "$TMP/err.txt" || fail "bad --disk: $(cat "$TMP/err.txt")"
D1=$("$DSEC" create --type sim --disk 2G --ttl 600) || fail "create --disk 2G"
"$DSEC" rm "$D1" >/dev/null
# more disk than any node has (a sim node offers 1 PiB): the scheduler refuses it, naming disk
set +e
"$DSEC" create --type sim --disk 2000000G 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "MB of disk free" "$TMP/err.txt" || fail "create --disk 2000000G: rc=$rc $(cat "$TMP/err.txt")"
set +e
"$DSEC" exec not-an-id -- true 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "not a sandbox id" "$TMP/err.txt" || fail "bad id"

# dsecd: a bad config names the file, the line and the key
printf 'cell: c1\nscheduler:\n  k: many\n' > "$TMP/bad.yaml"
set +e
"$DSECD" --config "$TMP/bad.yaml" --roles scheduler 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "bad.yaml:3: key \"k\"" "$TMP/err.txt" || fail "dsecd bad config: $(cat "$TMP/err.txt")"
printf 'cell: c1\nnodez: []\n' > "$TMP/bad2.yaml"
set +e
"$DSECD" --config "$TMP/bad2.yaml" 2> "$TMP/err.txt"; rc=$?
set -e
grep -q "bad2.yaml:2: unknown key \"nodez\"" "$TMP/err.txt" || fail "dsecd unknown key: $(cat "$TMP/err.txt")"
printf 'cell: c1\nnodes:\n  - name: n1\n    disk_reserve_mb: 0\n' > "$TMP/bad3.yaml"
set +e
"$DSECD" --config "$TMP/bad3.yaml" 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "bad3.yaml:4: key \"disk_reserve_mb\"" "$TMP/err.txt" || fail "dsecd disk_reserve_mb 0: $(cat "$TMP/err.txt")"

# dsecd --log-file: the library's lines with their time and level; --log-level filters them
printf 'cell: cli-log-%s\nstate_dir: %s\nbus:\n  url: %s\nembedded_nats:\n  enabled: false\n' "$PORT" "$TMP/logd" "$DSEC_URL" > "$TMP/logd.yaml"
"$DSECD" --config "$TMP/logd.yaml" --roles arbiter --log-file "$TMP/dsecd.log" 2> "$TMP/logd.err" &
LOGD=$!
for i in $(seq 1 100); do
    grep -q "active for cell" "$TMP/dsecd.log" 2>/dev/null && break
    sleep 0.1
done
# rotation by rename: SIGHUP reopens PATH, the old file keeps what it had, dsecd runs on
mv "$TMP/dsecd.log" "$TMP/dsecd.log.1"
kill -HUP "$LOGD"
for i in $(seq 1 100); do
    grep -q "SIGHUP: reopened" "$TMP/dsecd.log" 2>/dev/null && break
    sleep 0.1
done
kill -0 "$LOGD" 2>/dev/null || fail "dsecd ended on SIGHUP: $(cat "$TMP/logd.err")"
grep -Eq 'Z info dsecd: SIGHUP: reopened .*/dsecd.log$' "$TMP/dsecd.log" ||
    fail "dsecd SIGHUP: no reopened line in the new file: $(cat "$TMP/dsecd.log" "$TMP/logd.err" 2>&1)"
grep -q "SIGHUP" "$TMP/dsecd.log.1" && fail "dsecd SIGHUP: the line went to the renamed file"
kill "$LOGD"; wait "$LOGD" 2>/dev/null || true
LOGD=""
grep -Eq '^20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]{12}Z info dsec-arbiter .*: active for cell cli-log-' "$TMP/dsecd.log.1" ||
    fail "dsecd --log-file: $(cat "$TMP/dsecd.log.1" "$TMP/logd.err")"
grep -q "active for cell" "$TMP/logd.err" && fail "dsecd --log-file: the line went to stderr too"
"$DSECD" --config "$TMP/logd.yaml" --roles arbiter --log-file "$TMP/dsecd-warn.log" --log-level warn 2> /dev/null &
LOGD=$!
sleep 1.5
kill "$LOGD"; wait "$LOGD" 2>/dev/null || true
LOGD=""
grep -q "info" "$TMP/dsecd-warn.log" && fail "dsecd --log-level warn wrote info lines: $(cat "$TMP/dsecd-warn.log")"
set +e
"$DSECD" --config "$TMP/logd.yaml" --log-level loud 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "log-level loud: expected error, warn, info or debug" "$TMP/err.txt" || fail "dsecd --log-level loud: $(cat "$TMP/err.txt")"

# layers into the cell's JetStream registry, through the CLI
mkdir -p "$TMP/tree/bin" && echo hi > "$TMP/tree/bin/x"
REG="$DSEC_URL?bucket=CLI_LAYERS"
D=$("$DSEC" layer build "$TMP/tree" --name cli/x:1 --format dir --registry "$REG") || fail "layer build into jetstream"
case "$D" in sha256:*) ;; *) fail "layer build printed $D" ;; esac
"$DSEC" layer ls --registry "$REG" | grep -q "^cli/x:1 .*$D" || fail "layer ls does not list cli/x:1"
"$DSEC" env create cli/env:1 --layer cli/x:1 --registry "$REG" >/dev/null || fail "env create in jetstream"
"$DSEC" env show cli/env:1 --registry "$REG" | grep -q "^layer $D dir" || fail "env show"
"$DSEC" layer rm cli/x:1 --registry "$REG" || fail "removing the tag cli/x:1"
set +e
"$DSEC" layer rm "$D" --registry "$REG" 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "environment cli/env:1" "$TMP/err.txt" || fail "removing a layer an environment uses: $(cat "$TMP/err.txt")"
set +e
"$DSEC" layer ls --registry "$DSEC_URL?bukket=X" 2> "$TMP/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "bucket=NAME" "$TMP/err.txt" || fail "bad registry URL: $(cat "$TMP/err.txt")"

kill "$UP_PID"
wait "$UP_PID" || true
UP_PID=""
grep -q "stopping" "$TMP/up.log" || fail "dsec up did not stop cleanly"
echo "cli: all checks passed"
