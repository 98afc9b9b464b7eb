#!/bin/sh
# install-deps.sh - apt-install whatever dsec needs that is missing (Debian 12, root). Idempotent.
set -eu

PKGS="build-essential cmake pkg-config git python3 python3-venv \
nats-server libnats-dev libmsgpack-dev libprotobuf-c-dev protobuf-c-compiler \
libjemalloc-dev libcmocka-dev uuid-dev libyaml-dev libmicrohttpd-dev libcrypt-dev openssl \
clang libclang-rt-14-dev libtsan2 \
libseccomp-dev libpython3-dev gnuplot-nox libarchive-dev libzstd-dev \
crun runc btrfs-progs erofs-utils busybox-static debootstrap tar \
nftables libnftnl-dev libmnl-dev libldns-dev libnetfilter-conntrack-dev iproute2 \
util-linux procps qemu-system-x86 kmod cpio e2fsprogs curl clang-format universal-ctags \
libcurl4-openssl-dev docker-registry skopeo apache2-utils umoci"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -n "$missing" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "dsec: missing packages:$missing" >&2
        echo "dsec: run as root, or: sudo apt-get install -y$missing" >&2
        exit 1
    fi
    echo "dsec: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends $missing; then
        apt-get update
        apt-get install -y --no-install-recommends $missing
    fi
    # docker-registry is for the tests, which start their own on a free loopback port: the
    # package's service (on :5000 under systemd) is not wanted
    case " $missing " in *" docker-registry "*)
        if command -v systemctl >/dev/null 2>&1; then
            systemctl disable --now docker-registry >/dev/null 2>&1 || true
        fi ;;
    esac
fi

# The microVM guest kernel: the Debian cloud kernel, downloaded and unpacked (never installed)
# into a cache; a no-op once it is there. The build makes the kit from it (build-vmkit.sh).
"$(dirname "$0")/build-vmkit.sh" --fetch
