#!/bin/sh
# .ci/libvirt-up.sh — start virtlogd and libvirtd by hand (no systemd on this machine), idempotent.
# Needs root and libvirt-daemon-system. Prints the connection URI (qemu:///system) when the
# daemon answers; exits non-zero with the daemon's log tail if it does not come up in 20 s.
set -eu

SOCK=/var/run/libvirt/libvirt-sock
LOG=/var/log/libvirt/libvirtd-by-hand.log

alive() {
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null
}

mkdir -p /var/run/libvirt /var/log/libvirt
# Without udev, /dev/kvm stays root-only (0600). libvirt then probes QEMU's capabilities with
# KVM but finds /dev/kvm unusable for its QEMU user when it checks its cache, so it throws the
# cache away and probes again, about twelve times per domain start (50 s). Debian's udev rule
# gives the device to the kvm group, of which libvirt's QEMU user is a member: do the same.
# (Domains here run with TCG either way: this KVM cannot boot a guest.)
if [ -c /dev/kvm ] && getent group kvm >/dev/null; then
    chgrp kvm /dev/kvm && chmod 660 /dev/kvm
fi
if ! alive /var/run/virtlogd.pid; then
    virtlogd -d -p /var/run/virtlogd.pid
fi
if ! alive /var/run/libvirtd.pid; then
    # No "-l": listening on TCP needs TLS certificates, and nothing here needs it.
    LIBVIRT_LOG_OUTPUTS="3:file:$LOG" libvirtd -d -p /var/run/libvirtd.pid
fi

i=0
while [ $i -lt 200 ]; do
    if [ -S "$SOCK" ] && virsh -c qemu:///system version >/dev/null 2>&1; then
        echo "qemu:///system"
        exit 0
    fi
    i=$((i + 1))
    sleep 0.1
done
echo "libvirt-up.sh: libvirtd did not answer on $SOCK within 20 s" >&2
tail -n 20 "$LOG" >&2 2>/dev/null || true
exit 1
