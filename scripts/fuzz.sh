#!/bin/sh
# fuzz.sh - run every libFuzzer harness of the fuzz build for SECONDS each (default 60) on its corpus.
# New inputs go to a scratch directory (build/fuzz/new/<harness>); a crash leaves its input in the
# current directory and stops the run: copy it into fuzz/corpus/<harness>/ so it replays forever after.
# A harness's own findings and skips are its lines starting "fuzz_" (fuzz_agent needs root: it chroots).
set -eu
SECONDS_EACH="${1:-60}"
cd "$(dirname "$0")/.."
for bin in build/fuzz/fuzz/fuzz_*; do
    [ -x "$bin" ] || continue
    h=$(basename "$bin" | sed 's/^fuzz_//')
    [ -d "fuzz/corpus/$h" ] || { echo "dsec fuzz: no corpus fuzz/corpus/$h for $bin" >&2; exit 2; }
    mkdir -p "build/fuzz/new/$h"
    echo "dsec fuzz: $h for ${SECONDS_EACH}s"
    "$bin" -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 -print_final_stats=1 \
        "build/fuzz/new/$h" "fuzz/corpus/$h" 2>&1 | grep -E "^(stat::number_of_executed_units|==|SUMMARY|Done|fuzz_)" || true
    # libFuzzer exits non-zero on a crash; the pipe hides it, so look for the artifact
    if ls crash-* leak-* timeout-* oom-* >/dev/null 2>&1; then
        echo "dsec fuzz: $h found a failing input:" crash-* leak-* timeout-* oom-* 2>/dev/null >&2
        exit 1
    fi
done
