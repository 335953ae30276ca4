#!/bin/sh
# .ci/migrate-guest.sh — the guest of the migration scenario tests (launcher/tests/migrate_qemu*.rs,
# `vse bench migrate`): the .ci/fixtures.sh guest (Debian cloud kernel + busybox initramfs) with
# an overlay cpio appended that adds the static guest agent as PID 1 and the static `msgcheck`
# program (barrier/src/bin/vse-msgcheck.rs). Its /init loads the virtio modules, prints a
# VSE-COUNT counter on the serial console every 100 ms in the background, then execs the agent.
#
#   .ci/migrate-guest.sh     build (idempotent) and print the env file path
# Output: ${VSE_CACHE:-/var/cache/vse}/fixtures/migrate.env with VSE_MIGRATE_KERNEL,
#   VSE_MIGRATE_INITRD, VSE_MIGRATE_CMDLINE.
# Needs: .ci/fixtures.sh prerequisites, cargo, glibc static libraries (libc6-dev), cpio, gzip.
set -eu
cd "$(dirname "$0")/.."
ENV_FIXTURES=$(.ci/fixtures.sh)
. "$ENV_FIXTURES"
CACHE="${VSE_CACHE:-/var/cache/vse}/fixtures"
AGENT=$(.ci/guest-agent.sh)
APP=$(.ci/msgcheck.sh)

WORK=$(mktemp -d "$CACHE/migrate.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/ov/sbin" "$WORK/ov/bin" "$WORK/ov/run"
cp "$AGENT" "$WORK/ov/sbin/vse-agent"
cp "$APP" "$WORK/ov/bin/msgcheck"
cat > "$WORK/ov/init" <<'EOF'
#!/bin/sh
# vse migration test guest: virtio drivers, a console counter, then the guest agent as PID 1.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
for m in $(cat /modules/order); do insmod "/modules/$m.ko" 2>/dev/null; done
echo "VSE-READY"
(i=0; while true; do echo "VSE-COUNT $i"; i=$((i + 1)); usleep 100000; done) &
exec /sbin/vse-agent
EOF
chmod 755 "$WORK/ov/init"
OUT="$CACHE/migrate-initrd.cpio.gz"
# The kernel unpacks concatenated archives in order; later files replace earlier ones (/init).
(cd "$WORK/ov" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -9n) > "$WORK/overlay.cpio.gz"
cat "$VSE_FIXTURE_INITRD" "$WORK/overlay.cpio.gz" > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
cat > "$CACHE/migrate.env.tmp" <<EOF
VSE_MIGRATE_KERNEL=$VSE_FIXTURE_KERNEL
VSE_MIGRATE_INITRD=$OUT
VSE_MIGRATE_CMDLINE="console=ttyS0 panic=-1 quiet"
EOF
mv "$CACHE/migrate.env.tmp" "$CACHE/migrate.env"
echo "$CACHE/migrate.env"
