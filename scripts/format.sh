#!/bin/sh
# format.sh - clang-format over every C source and header of the tree (.clang-format at the root).
# usage: scripts/format.sh          rewrite the files in place (make format)
#        scripts/format.sh --check  list the files that are not formatted; exit 1 if any (ctest format)
set -eu
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format: clang-format is missing (scripts/install-deps.sh installs it)" >&2; exit 77; }
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find . -path ./build -prune -o \( -name '*.c' -o -name '*.h' \) -print)
if [ "${1:-}" != "--check" ]; then
    # shellcheck disable=SC2086
    clang-format -i $files
    exit 0
fi
bad=0
for f in $files; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "format: $f is not formatted (make format)"
        bad=1
    fi
done
[ "$bad" = 0 ] && echo "format: $(echo "$files" | wc -l) files formatted"
exit "$bad"
