#!/bin/sh
# .ci/fixtures.sh — the test guest used until `vse build` produces real images.
#
# Interface (keep it this simple; other tests and engineers rely on it):
#   .ci/fixtures.sh            prepare (idempotent, cached, quick on a warm cache) and print the env file
#   .ci/fixtures.sh --print    only print the env file path if the fixtures are ready (exit 1 if not)
#
# Cache: ${VSE_CACHE:-/var/cache/vse}/fixtures
# Output: ${VSE_CACHE:-/var/cache/vse}/fixtures/fixtures.env, a sh-sourceable KEY=VALUE file:
#   VSE_FIXTURE_KERNEL   Debian cloud kernel (vmlinuz), for direct kernel boot
#   VSE_FIXTURE_INITRD   busybox initramfs (cpio newc + gzip) described below
#   VSE_FIXTURE_KVER     kernel version (e.g. 6.1.0-56-cloud-amd64)
#   VSE_FIXTURE_ROOTFS   extracted kernel package tree (lib/modules/$KVER lives here)
#   VSE_FIXTURE_CMDLINE  kernel command line that boots the guest on the serial console
#
# The guest's /init loads the virtio modules (virtio_pci, virtio_console, virtio_blk, virtio_net),
# prints "VSE-READY" on the serial console, then "VSE-COUNT <n>" every 100 ms, forever.
# Kernel command line options it understands:
#   vse.dirty_mb=N      before the marker, fill N MiB of tmpfs with random data (migration benchmarks)
#   vse.dirty_loop=1    keep rewriting that data in the background (memory that stays dirty)
#
# Needs: apt-get (with a configured mirror), dpkg-deb, cpio, gzip. No kmod: /init insmods the
# modules in dependency order (the list below), so no modules.dep is needed. Runs as any user that can write the cache directory.
set -eu

CACHE="${VSE_CACHE:-/var/cache/vse}/fixtures"
ENV_FILE="$CACHE/fixtures.env"
# Bump when the initramfs layout or /init changes, so warm caches are rebuilt.
FIXTURE_VERSION=3

if [ "${1:-}" = "--print" ]; then
    [ -f "$ENV_FILE" ] && grep -q "^VSE_FIXTURE_VERSION=$FIXTURE_VERSION\$" "$ENV_FILE" || exit 1
    echo "$ENV_FILE"
    exit 0
fi

if [ -f "$ENV_FILE" ] && grep -q "^VSE_FIXTURE_VERSION=$FIXTURE_VERSION\$" "$ENV_FILE"; then
    . "$ENV_FILE"
    if [ -f "$VSE_FIXTURE_KERNEL" ] && [ -f "$VSE_FIXTURE_INITRD" ]; then
        echo "$ENV_FILE"
        exit 0
    fi
fi

mkdir -p "$CACHE/debs"
# Resolve the meta package to the versioned kernel package (apt-get download does not follow deps).
KPKG=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n1)
if [ -z "$KPKG" ]; then
    echo "fixtures.sh: cannot resolve linux-image-cloud-amd64 to a versioned kernel package (run apt-get update?)" >&2
    exit 1
fi
KVER=${KPKG#linux-image-}

cd "$CACHE/debs"
for pkg in "$KPKG" busybox-static; do
    if ! ls "${pkg}"_*.deb >/dev/null 2>&1; then
        apt-get download "$pkg" >&2
    fi
done
KDEB=$(ls "${KPKG}"_*.deb | head -n1)
BDEB=$(ls busybox-static_*.deb | head -n1)

WORK=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOTFS="$CACHE/kernel-$KVER"
if [ ! -f "$ROOTFS/boot/vmlinuz-$KVER" ]; then
    rm -rf "$ROOTFS.tmp"
    dpkg-deb -x "$KDEB" "$ROOTFS.tmp"
    rm -rf "$ROOTFS"
    mv "$ROOTFS.tmp" "$ROOTFS"
fi
dpkg-deb -x "$BDEB" "$WORK/bb"

# Initramfs tree: busybox + the few modules needed, flat in /modules, loaded in this order
# (dependencies first; a module missing from the package is assumed built in and skipped).
MODULES="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_console virtio_blk failover net_failover virtio_net"
IR="$WORK/initramfs"
mkdir -p "$IR/bin" "$IR/dev" "$IR/proc" "$IR/sys" "$IR/tmp" "$IR/dirty" "$IR/modules"
cp "$WORK/bb/bin/busybox" "$IR/bin/busybox"
for applet in sh mount insmod mkdir echo cat sleep usleep dd grep sed cut tr poweroff ls true; do
    ln -s busybox "$IR/bin/$applet"
done
MODSRC="$ROOTFS/lib/modules/$KVER"
for mod in $MODULES; do
    f=$(find "$MODSRC/kernel" -name "$mod.ko" | head -n1)
    if [ -n "$f" ]; then
        cp "$f" "$IR/modules/$mod.ko"
        echo "$mod" >> "$IR/modules/order"
    fi
done

cat > "$IR/init" <<'EOF'
#!/bin/sh
# vse test guest: load virtio drivers, print a ready marker, then a counter every 100 ms.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
for m in $(cat /modules/order); do insmod "/modules/$m.ko" 2>/dev/null; done
dirty_mb=0; dirty_loop=0
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        vse.dirty_mb=*) dirty_mb=${arg#vse.dirty_mb=} ;;
        vse.dirty_loop=*) dirty_loop=${arg#vse.dirty_loop=} ;;
    esac
done
if [ "$dirty_mb" -gt 0 ]; then
    mount -t tmpfs -o size=$((dirty_mb + 16))m tmpfs /dirty
    dd if=/dev/urandom of=/dirty/data bs=1M count="$dirty_mb" 2>/dev/null
    if [ "$dirty_loop" = 1 ]; then
        (while true; do dd if=/dev/urandom of=/dirty/data bs=1M count="$dirty_mb" conv=notrunc 2>/dev/null; done) &
    fi
fi
echo "VSE-READY"
i=0
while true; do
    echo "VSE-COUNT $i"
    i=$((i + 1))
    usleep 100000
done
EOF
chmod 755 "$IR/init"

INITRD="$CACHE/initrd-$KVER-v$FIXTURE_VERSION.cpio.gz"
(cd "$IR" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -9n) > "$INITRD.tmp"
mv "$INITRD.tmp" "$INITRD"

cat > "$ENV_FILE.tmp" <<EOF
VSE_FIXTURE_VERSION=$FIXTURE_VERSION
VSE_FIXTURE_KERNEL=$ROOTFS/boot/vmlinuz-$KVER
VSE_FIXTURE_INITRD=$INITRD
VSE_FIXTURE_KVER=$KVER
VSE_FIXTURE_ROOTFS=$ROOTFS
VSE_FIXTURE_CMDLINE="console=ttyS0 panic=-1 quiet"
EOF
mv "$ENV_FILE.tmp" "$ENV_FILE"
echo "$ENV_FILE"
