#!/bin/sh
# identity.sh - give a microVM its identity (hostname, machine-id, clock, random seed, eth0); run by init at boot and by the host after a clone or restore.
#
#   identity.sh HOSTNAME MACHINE_ID EPOCH_SECONDS [MAC ADDR/PFX GW GWMAC DNS [ADDR6/PFX GW6]]
#
# EPOCH_SECONDS "-" leaves the clock alone. DNS may list several servers separated by
# commas. The first line on stdin (the host sends 512 random bytes as 1024 hex digits) is
# mixed into /dev/urandom, so clones of one snapshot do not share their random state.
# Runs under the busybox next to it (/.dsec/busybox), so it needs nothing from the
# sandbox's own root. DSEC_ROOT (init sets /newroot) prefixes the files it writes.
# Prints "identity: <step> failed: <why>" on stderr and exits 1 on the first failure.

BB=${DSEC_BUSYBOX:-${0%/*}/busybox}
R=${DSEC_ROOT:-}
IF=eth0

fail() {
    echo "identity: $1 failed: $2" >&2
    exit 1
}

run() {
    step=$1
    shift
    out=$("$@" 2>&1) || fail "$step" "${out:-$* exited $?}"
}

# Write file $1 with content $2; a symlink (resolv.conf often is one) is replaced through a
# temporary file, a plain file written in place. Shell builtins where possible: every
# program started costs tens of milliseconds under emulation, on a clone's path.
put() {
    [ -d "${1%/*}" ] || "$BB" mkdir -p "${1%/*}" 2>/dev/null
    if [ -L "$1" ]; then
        printf '%s' "$2" >"$1.dsec-tmp" || fail "write $1" "cannot write $1.dsec-tmp"
        "$BB" rm -f "$1" && "$BB" mv -f "$1.dsec-tmp" "$1" || fail "write $1" "cannot replace $1"
    else
        printf '%s' "$2" >"$1" || fail "write $1" "cannot write $1"
    fi
}

[ -x "$BB" ] || fail "usage" "busybox not found at $BB (set DSEC_BUSYBOX)"
case $# in
3 | 8 | 10) ;;
*) fail "usage" "identity.sh HOSTNAME MACHINE_ID EPOCH_SECONDS [MAC ADDR/PFX GW GWMAC DNS [ADDR6/PFX GW6]] (got $# arguments)" ;;
esac

host=$1 mid=$2 epoch=$3
case "$host" in
'' | -* | *[!A-Za-z0-9.-]*) fail "hostname" "'$host' is not a valid hostname (letters, digits, '.', '-')" ;;
esac
[ "${#host}" -le 64 ] || fail "hostname" "'$host' is longer than 64 characters"
case "$mid" in
*[!0-9a-f]*) fail "machine-id" "'$mid' is not 32 lowercase hex digits" ;;
esac
[ "${#mid}" = 32 ] || fail "machine-id" "'$mid' is not 32 lowercase hex digits"
case "$epoch" in
-) ;;
'' | *[!0-9]*) fail "clock" "'$epoch' is not a number of seconds since 1970 (or -)" ;;
esac

# The random seed first: everything after may draw on it.
# Builtins only (read, printf): a dd here was one more process on a clone's path, and hex
# text carries the same randomness into the pool as the bytes would.
seed=
read -r seed 2>/dev/null
[ -n "$seed" ] && printf '%s' "$seed" >/dev/urandom 2>/dev/null

# (no $(...) around date: its messages reach our stderr, which the caller keeps)
if [ "$epoch" != - ]; then
    "$BB" date -u -s "@$epoch" >/dev/null || fail "clock" "date -u -s @$epoch exited $?"
fi
printf '%s' "$host" >/proc/sys/kernel/hostname 2>/dev/null || run "hostname" "$BB" hostname "$host"
put "$R/etc/hostname" "$host
"
put "$R/etc/machine-id" "$mid
"
lo=0
read -r lo </sys/class/net/lo/flags 2>/dev/null
[ $((lo & 1)) = 1 ] || run "loopback" "$BB" ip link set dev lo up

[ $# -ge 8 ] || exit 0

mac=$4 addr=$5 gw=$6 gwmac=$7 dns=$8
case "$mac" in
[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]) ;;
*) fail "network" "MAC '$mac' is not six lowercase hex pairs" ;;
esac
case "$gwmac" in
[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]) ;;
*) fail "network" "gateway MAC '$gwmac' is not six lowercase hex pairs" ;;
esac
case "$addr" in
*.*.*.*/*) ;;
*) fail "network" "address '$addr' is not A.B.C.D/PREFIX" ;;
esac
[ -e "/sys/class/net/$IF" ] || fail "network" "no interface $IF"

# A fresh start: the old address, neighbours and routes may be a snapshot's.
run "network: down" "$BB" ip link set dev "$IF" down
run "network: mac" "$BB" ip link set dev "$IF" address "$mac"
run "network: flush" "$BB" ip addr flush dev "$IF"
"$BB" ip neigh flush dev "$IF" >/dev/null 2>&1
[ -w "/proc/sys/net/ipv6/conf/$IF/accept_dad" ] && echo 0 >"/proc/sys/net/ipv6/conf/$IF/accept_dad"
run "network: up" "$BB" ip link set dev "$IF" up
run "network: address" "$BB" ip addr add "$addr" dev "$IF"
# The gateway's MAC never changes and ARP may be filtered: a permanent entry (arp -s without temp).
run "network: gateway neighbour" "$BB" arp -i "$IF" -s "$gw" "$gwmac"
# The address is a /32 (/128): the gateway is on no subnet of ours, so it gets a route of
# its own on the link before it can be the default route's next hop.
run "network: gateway route" "$BB" ip route replace "$gw" dev "$IF"
run "network: default route" "$BB" ip route replace default via "$gw" dev "$IF"
if [ $# -ge 10 ] && [ -n "${9}" ]; then
    run "network: address6" "$BB" ip -6 addr add "${9}" dev "$IF"
    if [ -n "${10}" ]; then
        run "network: gateway route6" "$BB" ip -6 route replace "${10}" dev "$IF"
        run "network: default route6" "$BB" ip -6 route replace default via "${10}" dev "$IF"
    fi
fi
conf=""
for s in $(echo "$dns" | "$BB" tr ',' ' '); do
    conf="${conf}nameserver $s
"
done
put "$R/etc/resolv.conf" "$conf"
exit 0
