#!/bin/sh
# .ci/tester-up.sh — the ordinary accounts the attacker-side tests run as: `vse-tester` (the
# attacker / job user) and `vse-other` (another user of the same site). Neither has sudo, a
# password, the `kvm` group or any group but its own. Each has 65536 subordinate uids and gids
# (/etc/subuid, /etc/subgid) for rootless builds, as useradd gives by default; the ranges are
# added when a machine's useradd did not. Idempotent. Needs root.
set -eu
next=100000
for u in vse-tester vse-other; do
    if ! id -u "$u" >/dev/null 2>&1; then
        useradd --create-home --shell /bin/sh --user-group "$u"
    fi
    # Whatever a reused machine gave the account, it ends with its own group only.
    usermod -G "" "$u"
    # No password can match `*`; unlike `passwd -l`'s `!`, sshd does not take it for a locked
    # account, so the ssh allocations' tests log in with the account's key.
    usermod -p '*' "$u"
    chmod 0700 "$(getent passwd "$u" | cut -d: -f6)"
    for f in subuid subgid; do
        touch "/etc/$f"
        if ! grep -q "^$u:" "/etc/$f"; then
            # The first free range of 65536 above every range already given.
            while awk -F: -v a="$next" '$2 < a + 65536 && a < $2 + $3 { found = 1 } END { exit !found }' /etc/subuid /etc/subgid; do
                next=$((next + 65536))
            done
            opt=--add-subuids
            [ "$f" = subgid ] && opt=--add-subgids
            usermod "$opt" "$next-$((next + 65535))" "$u"
        fi
    done
done
