#!/usr/bin/env bash
# build-envs.sh - build real environments (busybox:1, python:3) into a layer registry, from Debian's mirror only.
#
#   scripts/build-envs.sh [--registry DIR] [--state-dir DIR] [--dsec PATH] [--only busybox|debootstrap] [--no-check]
#
# --only debootstrap makes (or finds) the debootstrap tree alone and prints its path last.
#
# Layers:   busybox:1     busybox-static with its applet links, passwd/group, empty /tmp /proc /sys /dev (EROFS)
#           debian:12     debootstrap --variant=minbase bookworm (EROFS)
#           debian-py:12  python3 and git, installed in an overlay over debian:12; the overlay's
#                         upper dir is the layer, whiteouts and opaque dirs included (EROFS)
# Envs:     busybox:1 = [busybox:1]; python:3 = [debian:12, debian-py:12]
#
# Idempotent: what the registry already has is skipped; the debootstrap result
# is kept in <state>/cache/debootstrap-bookworm and reused. The registry is
# --registry, else $DSEC_LAYERS, else <state>/layers (state: --state-dir, else
# ./state, as `dsec up` uses). Needs root and the packages debootstrap,
# busybox-static and erofs-utils. At the end the python:3 environment is
# mounted the way a node would (EROFS loop mounts under an overlay) and
# python3 and git are run in it, unless --no-check.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
state=./state
registry=
dsec=
check=1
only=
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry=$2; shift 2 ;;
    --state-dir) state=$2; shift 2 ;;
    --dsec) dsec=$2; shift 2 ;;
    --no-check) check=0; shift ;;
    --only) only=$2; shift 2
            case "$only" in busybox|debootstrap) ;;
              *) echo "build-envs.sh: --only takes busybox or debootstrap (got $only)" >&2; exit 2 ;; esac ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-envs.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "build-envs.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
for tool in debootstrap mkfs.erofs tar; do
  command -v "$tool" >/dev/null || { echo "build-envs.sh: $tool is missing (apt-get install debootstrap erofs-utils)" >&2; exit 2; }
done
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 ||
  { echo "build-envs.sh: /bin/busybox is missing or not static (apt-get install busybox-static)" >&2; exit 2; }
if [ -z "$dsec" ]; then
  for c in "$here/build/default/tools/dsec" "$here/build/asan/tools/dsec" "$(command -v dsec || true)"; do
    [ -n "$c" ] && [ -x "$c" ] && { dsec=$c; break; }
  done
fi
[ -n "$dsec" ] || { echo "build-envs.sh: no dsec binary; build it first (cmake --build --preset default)" >&2; exit 2; }
mkdir -p "$state"
state=$(cd "$state" && pwd)
registry=${registry:-${DSEC_LAYERS:-$state/layers}}
mkdir -p "$registry" "$state/cache"
registry=$(cd "$registry" && pwd)

# Everything mounted or made under $work goes when the script ends, however it ends.
work=$(mktemp -d "$state/cache/build-envs.XXXXXX")
cleanup() {
  for m in $(awk -v w="$work" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
has_tag() { "$dsec" layer ls --registry "$registry" | awk 'NR > 1 { print $1 }' | grep -qx "$1"; }
has_env() { "$dsec" env show "$1" --registry "$registry" >/dev/null 2>&1; }
blob_of() { "$dsec" layer ls --registry "$registry" | awk -v n="$1" '$1 == n { print $4 }'; }
report() {
  local d; d=$(blob_of "$1")
  printf '%-14s %s  %s bytes\n' "$1" "$d" "$(stat -c %s "$registry/blobs/sha256/${d#sha256:}")"
}
layer() { # NAME DIR [build options...]
  local name=$1 dir=$2; shift 2
  local t0; t0=$(now)
  "$dsec" layer build "$dir" --name "$name" --format erofs --registry "$registry" "$@" >/dev/null
  echo "build-envs: built $name in $(secs "$t0") s"
}

# ---- busybox:1 ------------------------------------------------------------------------------
if [ "$only" = debootstrap ]; then
  :
elif has_tag busybox:1; then
  echo "build-envs: busybox:1 already in $registry"
else
  r=$work/busybox
  mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,root,tmp,proc,sys,dev}
  chmod 1777 "$r/tmp"
  chmod 700 "$r/root"
  cp /bin/busybox "$r/bin/busybox"
  for applet in $(/bin/busybox --list-full); do
    [ -e "$r/$applet" ] || ln -s /bin/busybox "$r/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$r/etc/group"
  layer busybox:1 "$r"
fi
[ "$only" = debootstrap ] || has_env busybox:1 || "$dsec" env create busybox:1 --layer busybox:1 --registry "$registry" \
  --env PATH=/bin:/sbin:/usr/bin:/usr/sbin --workdir /root >/dev/null

[ "$only" = busybox ] && exit 0

# ---- debian:12 and debian-py:12 -------------------------------------------------------------
# The mirror is the one this machine's apt uses (classic or deb822 sources), security suites aside.
mirror() {
  { grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      sed -E 's/^deb (\[[^]]*\] )?//' | awk '{ print $1 }'
    awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' /etc/apt/sources.list.d/*.sources 2>/dev/null
  } | grep -v security | head -n 1
}
base=$state/cache/debootstrap-bookworm
if { [ "$only" = debootstrap ] || ! { has_tag debian:12 && has_tag debian-py:12; }; } &&
   [ ! -e "$base/.complete" ]; then
  url=$(mirror)
  [ -n "$url" ] || { echo "build-envs.sh: no Debian mirror in /etc/apt/sources.list{,.d}" >&2; exit 1; }
  rm -rf "$base" "$base.tmp"
  t0=$(now)
  echo "build-envs: debootstrap --variant=minbase bookworm from $url"
  debootstrap --variant=minbase bookworm "$base.tmp" "$url" > "$work/debootstrap.log" 2>&1 ||
    { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
  # the downloaded .debs are not part of the system, nor is this host's resolver or name
  rm -f "$base.tmp"/var/cache/apt/archives/*.deb
  : > "$base.tmp/etc/resolv.conf"
  echo localhost > "$base.tmp/etc/hostname"
  touch "$base.tmp/.complete"
  mv "$base.tmp" "$base"
  echo "build-envs: debootstrap took $(secs "$t0") s ($(du -sh --exclude=proc "$base" | cut -f1))"
fi
# --only debootstrap: the tree alone (tests make their own images from it); its path on stdout
if [ "$only" = debootstrap ]; then echo "$base"; exit 0; fi
base_excludes=(--exclude .complete --exclude 'var/cache/apt/archives/?*.deb'
               --exclude 'var/cache/apt/?*.bin' --exclude 'var/lib/apt/lists/?*')
if has_tag debian:12; then
  echo "build-envs: debian:12 already in $registry"
else
  layer debian:12 "$base" "${base_excludes[@]}"
fi

if has_tag debian-py:12; then
  echo "build-envs: debian-py:12 already in $registry"
else
  t0=$(now)
  o=$work/ovl
  mkdir -p "$o"/{upper,work,merged}
  # index/metacopy/redirect off: the upper dir must hold whole files and plain
  # whiteouts, as every overlay lower layer is read
  mount -t overlay overlay -o "lowerdir=$base,upperdir=$o/upper,workdir=$o/work,index=off,metacopy=off,redirect_dir=off,xino=off" "$o/merged"
  m=$o/merged
  mount -t proc proc "$m/proc"
  mount --bind /dev "$m/dev"
  # name resolution for apt without writing the host's resolver into the layer
  cat /etc/resolv.conf > "$work/resolv.conf"
  mount --bind "$work/resolv.conf" "$m/etc/resolv.conf"
  apt_opts=(-o Acquire::Check-Valid-Until=false -o Acquire::Check-Date=false -o APT::Install-Recommends=false -o Dpkg::Use-Pty=false)
  echo "build-envs: apt-get install python3 git (in an overlay over debian:12)"
  if ! chroot "$m" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C \
        sh -c "apt-get ${apt_opts[*]} update -q && apt-get ${apt_opts[*]} install -y -q python3 git && apt-get clean" \
        > "$work/apt.log" 2>&1; then
    tail -n 20 "$work/apt.log" >&2
    exit 1
  fi
  umount "$m/etc/resolv.conf" "$m/dev" "$m/proc"
  umount "$m"
  # overlayfs bookkeeping on copied-up files means nothing to a lower layer;
  # the whiteouts (char 0/0) and trusted.overlay.opaque are what it must keep
  python3 - "$o/upper" <<'EOF'
import os, sys
for d, dirs, files in os.walk(sys.argv[1]):
    for n in [d] + [os.path.join(d, f) for f in files + dirs]:
        try:
            names = os.listxattr(n, follow_symlinks=False)
        except OSError:
            continue
        for x in names:
            if x.startswith("trusted.overlay.") and x != "trusted.overlay.opaque":
                os.removexattr(n, x, follow_symlinks=False)
EOF
  echo "build-envs: install took $(secs "$t0") s (upper dir $(du -sh "$o/upper" | cut -f1))"
  layer debian-py:12 "$o/upper" --exclude 'var/cache/apt/?*' --exclude 'var/lib/apt/lists/?*' \
    --exclude 'var/log/?*' --exclude 'tmp/?*' --exclude 'root/?*'
fi
has_env python:3 || "$dsec" env create python:3 --layer debian:12 --layer debian-py:12 --registry "$registry" \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
  --workdir /root >/dev/null

# ---- check ----------------------------------------------------------------------------------
if [ "$check" = 1 ]; then
  c=$work/check
  mkdir -p "$c"/{base,py,bb,upper,work,merged}
  mount -t erofs -o loop,ro "$registry/blobs/sha256/$(blob_of debian:12 | cut -d: -f2)" "$c/base"
  mount -t erofs -o loop,ro "$registry/blobs/sha256/$(blob_of debian-py:12 | cut -d: -f2)" "$c/py"
  mount -t overlay overlay -o "lowerdir=$c/py:$c/base,upperdir=$c/upper,workdir=$c/work" "$c/merged"
  out=$(chroot "$c/merged" /usr/bin/env -i PATH=/usr/bin:/bin sh -c 'python3 -c "import sys, json; print(sys.version.split()[0])"; git --version')
  umount "$c/merged" "$c/py" "$c/base"
  mount -t erofs -o loop,ro "$registry/blobs/sha256/$(blob_of busybox:1 | cut -d: -f2)" "$c/bb"
  bb=$(chroot "$c/bb" /bin/sh -c 'echo busybox $(id -u) $(ls /bin | wc -l) applets')
  umount "$c/bb"
  echo "build-envs: check: python:3 runs python $(echo "$out" | head -n 1), $(echo "$out" | tail -n 1); busybox:1 runs: $bb"
fi

echo "build-envs: registry $registry"
for n in busybox:1 debian:12 debian-py:12; do report "$n"; done
"$dsec" env ls --registry "$registry"
