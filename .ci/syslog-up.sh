#!/bin/sh
# .ci/syslog-up.sh — a syslog daemon on /dev/log (no systemd here), so vse's audit records
# reach syslog as on a site: rsyslogd with the kernel-stamped sender credentials
# (SysSock.ParseTrusted), facility auth to /var/log/vse-auth.log. Prints that file.
# Idempotent; leaves a syslog daemon it did not start alone. Needs root.
set -eu
state=/var/lib/vse-syslog
log=/var/log/vse-auth.log
pid=/run/vse-rsyslogd.pid
if [ -f "$pid" ] && kill -0 "$(cat "$pid")" 2>/dev/null && [ -S /dev/log ]; then
    echo "$log"
    exit 0
fi
if [ -S /dev/log ] && [ ! -f "$pid" ]; then
    echo ".ci/syslog-up.sh: another syslog daemon owns /dev/log; vse's records go where it sends facility auth" >&2
    echo "$log"
    exit 0
fi
mkdir -p "$state"
cat > "$state/rsyslog.conf" <<CONF
global(workDirectory="$state")
module(load="imuxsock" SysSock.Annotate="on" SysSock.ParseTrusted="on")
auth,authpriv.* action(type="omfile" file="$log" fileCreateMode="0600")
CONF
rm -f "$pid" /dev/log
rsyslogd -f "$state/rsyslog.conf" -i "$pid"
i=0
until [ -S /dev/log ]; do
    i=$((i + 1))
    [ "$i" -le 50 ] || { echo ".ci/syslog-up.sh: rsyslogd made no /dev/log" >&2; exit 1; }
    sleep 0.1
done
echo "$log"
