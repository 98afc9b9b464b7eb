#!/usr/bin/env bash
# build-vmkit.sh - fetch the guest kernel and build the microVM kit (vmlinuz, initrd with busybox, dsec-agent, virtio modules, init).
#
#   scripts/build-vmkit.sh --fetch            download and unpack the Debian cloud kernel into the cache
#   scripts/build-vmkit.sh OUTDIR AGENT INIT  build OUTDIR/vmlinuz, OUTDIR/initrd.img, OUTDIR/kernel.version
#
# The kernel is the package the meta package linux-image-cloud-amd64 depends on,
# fetched with `apt-get download` and unpacked with `dpkg -x` (never installed)
# into $DSEC_GUEST_KERNEL_CACHE (default /var/cache/dsec/guest-kernel). --fetch is
# idempotent and needs no network once the kernel is cached. The build mode never
# touches the network: it uses the newest kernel in the cache and says to run
# --fetch when there is none.
#
# The initrd (an uncompressed newc cpio: under emulation the guest kernel takes longer
# to inflate a gzip'd one than QEMU takes to load the bigger file) holds
#   /init          INIT, the static program built from backends/vm/guest/init.c
#   /dsec/         AGENT as dsec-agent, a static busybox, identity.sh (backends/vm/guest/)
#   /lower/        the busybox world: bin/busybox (a hard link) with its applet links,
#                  etc/passwd, etc/group, the usual empty directories
#   /lib/modules/  the virtio, erofs and overlay modules with their dependencies, and
#                  load.order: "GROUP FILE" lines, dependencies first (resolved with
#                  `modinfo -F depends`); /init loads a group only when the machine or
#                  the sandbox needs it (see MODULE_GROUPS)
# OUTDIR is rebuilt only when an input changed (a stamp of input checksums, this script
# included, in OUTDIR/.stamp: a kit built by an older script is rebuilt); the outputs are
# replaced together at the end, so a failed build leaves the previous kit intact.
set -euo pipefail

CACHE=${DSEC_GUEST_KERNEL_CACHE:-/var/cache/dsec/guest-kernel}
META=linux-image-cloud-amd64
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GUEST="$SRC/backends/vm/guest"
# What the guest needs, by group; their dependencies are added, into the group of the first
# module that needs them (so a group needs only itself and base). Built-in ones are skipped.
# base: always; pci: on a machine with a PCI bus; net: a sandbox with a network; layers: a
# sandbox with layers (EROFS disks).
MODULE_GROUPS=(
    "base:virtio_ring virtio virtio_mmio virtio_console virtio_blk overlay"
    "pci:virtio_pci"
    "net:virtio_net"
    "layers:erofs"
)
KIT_LAYOUT=2 # what /init expects of the initrd; part of the stamp

die() {
    echo "build-vmkit: $*" >&2
    exit 1
}

need_cmd() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found; install the package $2 (apt-get install -y $2)"
}

# ---- --fetch ----------------------------------------------------------------------------------

# The versioned kernel package the meta package depends on (from the local apt lists).
kernel_package() {
    apt-cache depends "$META" 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

fetch() {
    need_cmd apt-get apt
    need_cmd dpkg dpkg
    local pkg
    pkg=$(kernel_package || true)
    if [ -z "$pkg" ]; then
        # No apt lists (or no such package): a cached kernel still does.
        if [ -n "$(cached_kernel_dir || true)" ]; then
            echo "build-vmkit: $META not in the apt lists; keeping the cached kernel in $CACHE"
            return 0
        fi
        die "apt knows no package $META; run apt-get update (Debian 12 main) and retry"
    fi
    if [ -f "$CACHE/$pkg/.complete" ]; then
        echo "build-vmkit: $pkg already in $CACHE"
        return 0
    fi
    [ "$(id -u)" = 0 ] || [ -w "$(dirname "$CACHE")" ] || [ -w "$CACHE" ] ||
        die "cannot write $CACHE; run as root or set DSEC_GUEST_KERNEL_CACHE"
    mkdir -p "$CACHE"
    local tmp
    tmp=$(mktemp -d "$CACHE/.fetch.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    # apt drops privileges to _apt for the download: give it a directory it can write.
    chmod 0755 "$tmp"
    mkdir "$tmp/deb"
    if id _apt >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then chown _apt "$tmp/deb"; fi
    echo "build-vmkit: downloading $pkg"
    (cd "$tmp/deb" && apt-get download -q "$pkg") ||
        die "apt-get download $pkg failed (network or apt sources?)"
    local deb
    deb=$(ls "$tmp"/deb/*.deb 2>/dev/null | head -n 1)
    [ -n "$deb" ] || die "apt-get download $pkg produced no .deb"
    dpkg -x "$deb" "$tmp/root" || die "dpkg -x $deb failed"
    ls "$tmp"/root/boot/vmlinuz-* >/dev/null 2>&1 || die "$deb holds no /boot/vmlinuz-*"
    touch "$tmp/root/.complete"
    rm -rf "${CACHE:?}/$pkg"
    mv "$tmp/root" "$CACHE/$pkg"
    rm -rf "$tmp"
    trap - EXIT
    echo "build-vmkit: $pkg unpacked in $CACHE/$pkg"
}

# The newest complete kernel in the cache (by version order), or nothing.
cached_kernel_dir() {
    [ -d "$CACHE" ] || return 0
    local d best=""
    for d in "$CACHE"/linux-image-*/; do
        [ -f "$d/.complete" ] || continue
        best="$best${d%/}"$'\n'
    done
    printf '%s' "$best" | sort -V | tail -n 1
}

# ---- build --------------------------------------------------------------------------------------

# Module name -> .ko path, for every module of the kernel (names with '-' read as '_').
declare -A KO=()
declare -A BUILTIN=()
declare -A STATE=() # "" unseen, 1 visiting, 2 done
declare -A GROUP=()
ORDER=()
CUR_GROUP=base

index_modules() {
    local moddir=$1 f n
    while IFS= read -r f; do
        n=${f##*/}
        n=${n%.ko}
        KO[${n//-/_}]=$f
    done < <(find "$moddir/kernel" -name '*.ko')
    if [ -f "$moddir/modules.builtin" ]; then
        while IFS= read -r f; do
            n=${f##*/}
            n=${n%.ko}
            BUILTIN[${n//-/_}]=1
        done <"$moddir/modules.builtin"
    fi
}

# Depth-first: a module goes into ORDER after everything it depends on.
add_module() {
    local m=${1//-/_} deps d
    [ "${STATE[$m]:-}" = 2 ] && return 0
    [ "${STATE[$m]:-}" = 1 ] && die "module dependency cycle through $m"
    if [ -z "${KO[$m]:-}" ]; then
        [ -n "${BUILTIN[$m]:-}" ] && {
            STATE[$m]=2
            return 0
        }
        die "kernel module $m not found in the cached kernel (neither a .ko nor built in)"
    fi
    STATE[$m]=1
    deps=$(modinfo -F depends "${KO[$m]}") || die "modinfo -F depends ${KO[$m]} failed"
    for d in ${deps//,/ }; do
        add_module "$d"
    done
    STATE[$m]=2
    GROUP[$m]=$CUR_GROUP
    ORDER+=("$m")
}

build() {
    local out=$1 agent=$2 init=$3
    need_cmd modinfo kmod
    need_cmd cpio cpio
    need_cmd sha256sum coreutils
    local busybox=/bin/busybox
    [ -x "$busybox" ] || die "$busybox not found; install busybox-static (apt-get install -y busybox-static)"
    # A dynamic busybox (package busybox) has no libc in the initrd: it needs an ELF interpreter.
    need_cmd readelf binutils
    need_cmd strip binutils
    readelf -l "$busybox" 2>/dev/null | grep -q 'program interpreter' &&
        die "$busybox is dynamically linked; install busybox-static (apt-get install -y busybox-static)"
    [ -f "$agent" ] && [ -x "$agent" ] || die "agent binary $agent not found or not executable (build dsec-agent first)"
    [ -f "$init" ] && [ -x "$init" ] || die "init binary $init not found or not executable (build dsec-vminit first)"
    readelf -l "$init" 2>/dev/null | grep -q 'program interpreter' &&
        die "$init is dynamically linked; the initrd has no libc (link it -static)"
    [ -f "$GUEST/identity.sh" ] || die "$GUEST/identity.sh missing"

    local kdir
    kdir=$(cached_kernel_dir)
    [ -n "$kdir" ] || die "no guest kernel in $CACHE; run: scripts/build-vmkit.sh --fetch"
    local vmlinuz
    vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | sort -V | tail -n 1)
    local kver=${vmlinuz##*/vmlinuz-}
    local moddir=$kdir/lib/modules/$kver
    [ -d "$moddir/kernel" ] || die "$moddir/kernel missing; remove $kdir and run: scripts/build-vmkit.sh --fetch"

    index_modules "$moddir"
    local m g
    for g in "${MODULE_GROUPS[@]}"; do
        CUR_GROUP=${g%%:*}
        for m in ${g#*:}; do
            add_module "$m"
        done
    done

    # Everything that goes into the kit, checksummed: unchanged inputs, nothing to do.
    local stamp
    stamp=$({
        echo "kernel $kver layout $KIT_LAYOUT"
        sha256sum "$vmlinuz" "$agent" "$busybox" "$init" "$GUEST/identity.sh" "${BASH_SOURCE[0]}"
        for m in "${ORDER[@]}"; do echo "${GROUP[$m]} $(sha256sum "${KO[$m]}")"; done
    } | sed "s#  .*/#  #")
    if [ -f "$out/.stamp" ] && [ -f "$out/vmlinuz" ] && [ -f "$out/initrd.img" ] &&
        [ -f "$out/kernel.version" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; then
        echo "build-vmkit: $out is up to date ($kver)"
        return 0
    fi

    mkdir -p "$out"
    local tmp
    tmp=$(mktemp -d "$out/.build.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    local root=$tmp/root
    mkdir -p "$root"/{dev,proc,sys,d,l,newroot,lib/modules,dsec}
    install -m 0755 -s "$init" "$root/init" # stripped: every byte is copied under emulation
    install -m 0755 "$agent" "$root/dsec/dsec-agent"
    install -m 0755 "$busybox" "$root/dsec/busybox"
    install -m 0755 "$GUEST/identity.sh" "$root/dsec/identity.sh"
    # the busybox world of a sandbox without layers (the overlay's lower directory)
    local low=$root/lower
    mkdir -p "$low"/{bin,etc,root,tmp,proc,sys,dev,run,.dsec}
    ln "$root/dsec/busybox" "$low/bin/busybox" # one copy in the initrd (cpio keeps hard links)
    local a
    for a in $("$busybox" --list); do
        [ "$a" = busybox ] || ln -s busybox "$low/bin/$a"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$low/etc/passwd"
    printf 'root:x:0:\n' >"$low/etc/group"
    chmod 1777 "$low/tmp"
    local i=0
    : >"$root/lib/modules/load.order"
    for m in "${ORDER[@]}"; do
        i=$((i + 1))
        local f
        f=$(printf '%02d-%s.ko' "$i" "$m")
        cp "${KO[$m]}" "$root/lib/modules/$f"
        echo "${GROUP[$m]} $f" >>"$root/lib/modules/load.order"
    done
    echo "$kver" >"$root/lib/modules/kernel.version"
    # The kernel opens /dev/console for init before devtmpfs exists (root only can mknod;
    # /init also reopens the console after mounting devtmpfs).
    if [ "$(id -u)" = 0 ]; then mknod -m 0600 "$root/dev/console" c 5 1; fi

    (cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) \
        >"$tmp/initrd.img" || die "packing the initrd failed"
    cp "$vmlinuz" "$tmp/vmlinuz"
    echo "$kver" >"$tmp/kernel.version"
    printf '%s\n' "$stamp" >"$tmp/stamp"

    rm -f "$out/.stamp" # a crash between the moves below must not look up to date
    mv -f "$tmp/vmlinuz" "$out/vmlinuz"
    mv -f "$tmp/initrd.img" "$out/initrd.img"
    mv -f "$tmp/kernel.version" "$out/kernel.version"
    mv -f "$tmp/stamp" "$out/.stamp"
    rm -rf "$tmp"
    trap - EXIT
    local mods=""
    for m in "${ORDER[@]}"; do mods="$mods ${GROUP[$m]}:$m"; done
    echo "build-vmkit: built $out ($kver; modules:$mods)"
}

case "${1:-}" in
--fetch)
    [ $# = 1 ] || die "usage: build-vmkit.sh --fetch | build-vmkit.sh OUTDIR AGENT_BINARY INIT_BINARY"
    fetch
    ;;
-h | --help | "")
    echo "usage: build-vmkit.sh --fetch | build-vmkit.sh OUTDIR AGENT_BINARY INIT_BINARY" >&2
    [ $# = 0 ] && exit 2
    exit 0
    ;;
*)
    [ $# = 3 ] || die "usage: build-vmkit.sh --fetch | build-vmkit.sh OUTDIR AGENT_BINARY INIT_BINARY"
    build "$1" "$2" "$3"
    ;;
esac
