#!/bin/sh
# .ci/netns-down.sh PREFIX N — removes what netns-up.sh PREFIX N made (processes left inside a
# namespace are killed first, so a failed test leaves nothing behind).
set -u
P=$1; N=$2
i=1
while [ "$i" -le "$N" ]; do
    ns=$P$i
    if [ -e "/run/netns/$ns" ]; then
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns"
    fi
    ip link del "${P}v$i" 2>/dev/null
    i=$((i + 1))
done
ip link del "${P}br" 2>/dev/null
exit 0
