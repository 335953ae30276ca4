#!/bin/busybox sh
# VSE initramfs: load the drivers every supported hypervisor needs (virtio for KVM/QEMU,
# xen-blkfront/xen-netfront for Xen), mount the root disk, hand over to the real init.
# Kernel command line: vse.root=DEV (default: first of /dev/vda /dev/xvda /dev/sda),
# vse.init=PATH (default: the VSE guest agent as PID 1).
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules/order); do
    insmod "/modules/$m.ko" 2>/dev/null || echo "vse-initramfs: could not load $m (no such device?)"
done
root=""
init=/usr/lib/vse/vse-agent
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        vse.root=*) root=${arg#vse.root=} ;;
        vse.init=*) init=${arg#vse.init=} ;;
    esac
done
i=0
while [ -z "$root" ] || [ ! -b "$root" ]; do
    for d in /dev/vda /dev/xvda /dev/sda; do
        if [ -z "$root" ] && [ -b "$d" ]; then root=$d; fi
    done
    [ -n "$root" ] && [ -b "$root" ] && break
    i=$((i + 1))
    if [ "$i" -gt 300 ]; then
        echo "vse-initramfs: no root disk appeared (tried vse.root=, /dev/vda, /dev/xvda, /dev/sda)"
        poweroff -f
    fi
    usleep 20000
done
if ! mount -t ext4 -o rw "$root" /newroot; then
    echo "vse-initramfs: cannot mount $root"
    poweroff -f
fi
mount --move /dev /newroot/dev 2>/dev/null
umount /proc /sys
exec switch_root /newroot "$init"
