#!/bin/sh
# sdk_install.sh - `pip install ./sdk/python` works with no package index (the in-tree build
# backend), and the installed copy, not the source tree, is what imports.
# usage: sdk_install.sh PYTHON3 SDK_DIR LIBDSEC
set -u
PY="$1"; SDK="$2"; LIB="$3"
tmp=$(mktemp -d /tmp/dsec-sdk-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! "$PY" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
    echo "skip: $PY -m venv fails (python3-venv missing?): $(tail -1 "$tmp/venv.log")"
    exit 77
fi
if ! "$tmp/venv/bin/pip" install --no-index --disable-pip-version-check "$SDK" >"$tmp/pip.log" 2>&1; then
    echo "FAIL: pip install --no-index $SDK:"; cat "$tmp/pip.log"; exit 1
fi
cd "$tmp" || exit 1
out=$(env -u PYTHONPATH DSEC_LIB="$LIB" "$tmp/venv/bin/python" -c '
import dsec
print(dsec.__file__)
print(all(hasattr(dsec, n) for n in ("DSecClient", "Sandbox", "Shell", "Pty", "DirWatch", "Transfer")))
') || { echo "FAIL: importing the installed SDK"; exit 1; }
echo "$out"
case "$out" in
    "$tmp/venv/lib/"*"/site-packages/dsec/__init__.py
True") echo "ok: installed and imported from the venv";;
    *) echo "FAIL: the import did not come from the installed copy with the whole API"; exit 1;;
esac
