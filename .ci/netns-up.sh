#!/bin/sh
# .ci/netns-up.sh PREFIX N NET — N "hosts" as network namespaces PREFIX1..PREFIXN, each with a
# veth into bridge PREFIXbr; host I is NET.I, the bridge (the front-end's side) is NET.254.
# The bridge gets its address before anything connects, so no packet takes the default route.
# Idempotent for the same arguments. Needs root and iproute2.  Example: netns-up.sh vt 3 10.77.1
set -eu
P=$1; N=$2; NET=$3
BR=${P}br
ip link show "$BR" >/dev/null 2>&1 || ip link add "$BR" type bridge
ip addr show dev "$BR" | grep -q "inet $NET.254/" || ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
i=1
while [ "$i" -le "$N" ]; do
    ns=$P$i
    [ -e "/run/netns/$ns" ] || ip netns add "$ns"
    ip -n "$ns" link set lo up
    if ! ip link show "${P}v$i" >/dev/null 2>&1; then
        ip link add "${P}v$i" type veth peer name eth0 netns "$ns"
        ip link set "${P}v$i" master "$BR"
        ip -n "$ns" addr add "$NET.$i/24" dev eth0
    fi
    ip link set "${P}v$i" up
    ip -n "$ns" link set eth0 up
    i=$((i + 1))
done
