#!/bin/sh
# bench.sh - run one benchmark scenario from the bench build; last line is its JSON.
set -eu
S="${1:?usage: bench.sh SCENARIO}"
BIN="build/bench/bench/bench_$(echo "$S" | tr '-' '_')"
if [ ! -x "$BIN" ]; then
    echo "dsec: no benchmark scenario '$S' (looked for $BIN); available:" >&2
    ls build/bench/bench/ 2>/dev/null | sed -n 's/^bench_/  /p' | tr '_' '-' >&2
    exit 2
fi
exec "$BIN"
