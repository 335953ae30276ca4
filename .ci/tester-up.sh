#!/bin/sh
# .ci/tester-up.sh — the ordinary accounts the attacker-side tests run as: `vse-tester` (the
# attacker / job user) and `vse-other` (another user of the same site). Neither has sudo, a
# password, the `kvm` group or any group but its own. Idempotent. Needs root.
set -eu
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
done
