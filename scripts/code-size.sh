#!/bin/sh
# code-size.sh - library .c files over FILE_MAX lines and functions over FN_MAX lines (issue 35's
# "done means"); exits 1 when any is found. Library code: every .c outside tests/, bench/, fuzz/,
# build/ and third-party trees. Needs universal-ctags.
# usage: scripts/code-size.sh [FILE_MAX [FN_MAX]]   (defaults 1500, 120)
set -eu
cd "$(dirname "$0")/.."
FILE_MAX=${1:-1500}
FN_MAX=${2:-120}
command -v ctags >/dev/null || { echo "code-size: universal-ctags is missing" >&2; exit 77; }
files=$(git ls-files '*.c' | grep -Ev '^(tests|bench|fuzz|build)/' || true)
bad=0
for f in $files; do
    n=$(wc -l < "$f")
    if [ "$n" -gt "$FILE_MAX" ]; then
        echo "file $f: $n lines (max $FILE_MAX)"
        bad=1
    fi
done
# shellcheck disable=SC2086
out=$(ctags --c-kinds=f --fields=+ne -o - $files | awk -F'\t' -v max="$FN_MAX" '
    { s = ""; e = ""
      for (i = 4; i <= NF; i++) {
          if ($i ~ /^line:/) s = substr($i, 6)
          if ($i ~ /^end:/) e = substr($i, 5)
      }
      if (s != "" && e != "" && e - s + 1 > max) printf "function %s:%s %s: %d lines (max %d)\n", $2, s, $1, e - s + 1, max }')
if [ -n "$out" ]; then
    echo "$out" | sort
    bad=1
fi
exit $bad
