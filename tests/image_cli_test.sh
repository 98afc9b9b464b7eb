#!/bin/sh
# image_cli_test.sh - `dsec image` on an OCI layout written by umoci (a real tool, not ours):
# import, ls --json, inspect, layer ls's IMAGES column, a re-import that reuses, rm.
# usage: image_cli_test.sh DSEC
set -u
DSEC=$1
command -v umoci >/dev/null || { echo "image_cli: no umoci; skipped"; exit 77; }
[ -x /bin/busybox ] || { echo "image_cli: no /bin/busybox; skipped"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "image_cli: needs root; skipped"; exit 77; }
T=$(mktemp -d /var/tmp/dsec-image-cli-$$.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "image_cli: FAIL: $*"; exit 1; }
R="--registry $T/reg"
cd "$T" || exit 1
umoci init --layout oci >/dev/null && umoci new --image oci:task >/dev/null &&
  umoci unpack --image oci:task bundle >/dev/null || fail "umoci could not make a layout"
mkdir -p bundle/rootfs/bin bundle/rootfs/etc bundle/rootfs/gone
cp /bin/busybox bundle/rootfs/bin/ && ln -s /bin/busybox bundle/rootfs/bin/sh
echo x > bundle/rootfs/gone/file
umoci repack --image oci:task bundle >/dev/null || fail "repack 1"
rm -rf bundle/rootfs/gone && echo hi > bundle/rootfs/hi
umoci repack --image oci:task bundle >/dev/null || fail "repack 2"
umoci config --image oci:task --config.user 1234 --config.workingdir /tmp \
  --config.env GREETING=hi --config.cmd /bin/sh >/dev/null || fail "umoci config"

out=$("$DSEC" image import oci --name 127.0.0.1:5000/swe/umoci:1 $R 2>"$T/err") ||
  fail "import: $(cat "$T/err")"
[ "$out" = "127.0.0.1:5000/swe/umoci:1" ] || fail "import printed \"$out\""
grep -q "(0 reused)" "$T/err" || fail "first import reused something: $(cat "$T/err")"
"$DSEC" image ls --json $R | grep -q '"ref":"127.0.0.1:5000/swe/umoci:1"' || fail "ls --json"
"$DSEC" image inspect 127.0.0.1:5000/swe/umoci:1 $R | grep -q '^cmd       /bin/sh$' ||
  fail "inspect has no cmd"
"$DSEC" env show 127.0.0.1:5000/swe/umoci:1 $R > "$T/env" || fail "env show"
grep -q '^user 1234$' "$T/env" && grep -q '^workdir /tmp$' "$T/env" &&
  grep -q '^env GREETING=hi$' "$T/env" && grep -q '^dsec-env 2$' "$T/env" || fail "env: $(cat "$T/env")"
"$DSEC" layer ls $R | grep -q "127.0.0.1:5000/swe/umoci:1" || fail "layer ls names no image"
"$DSEC" image import oci --name swe/again $R 2>"$T/err" >/dev/null || fail "re-import"
grep -q "(0 reused)" "$T/err" && fail "re-import converted again: $(cat "$T/err")"
"$DSEC" image rm 127.0.0.1:5000/swe/umoci:1 $R || fail "rm"
"$DSEC" image inspect 127.0.0.1:5000/swe/umoci:1 $R 2>/dev/null && fail "inspect after rm"
"$DSEC" image import "$T/nothing" --name a/b $R 2>"$T/err" && fail "imported nothing"
grep -q "nothing" "$T/err" || fail "no path in the error: $(cat "$T/err")"
echo "image_cli: ok"
