#!/bin/sh
# .ci/nscluster-up.sh [NODES] — a Slurm cluster of real nodes on this machine: node nI is its
# own network namespace with its own address 10.77.0.I on bridge vsnbr (10.77.0.254: the
# front-end's and slurmctld's address), its own hostname, and its own mount namespace in which
# /var/tmp/vse (node-local image cache) and /run/vse (run directories) are private to the node,
# so staging, the job network, the agent tree and migration all cross real addresses and disks.
# Only addresses inside these namespaces are used. Idempotent; prints an env file to source.
#
#   .ci/nscluster-up.sh [NODES]   (default 3: two compute nodes and a spare)
#   .ci/nscluster-up.sh --down    stop what this script started, remove the namespaces
#
# Next to the loopback cluster of .ci/slurm-up.sh (own ports and directory), so both can run.
set -eu
cd "$(dirname "$0")"
DIR=/tmp/vse-nscluster
CONF=$DIR/slurm.conf
PORT=17817
NET=10.77.0
P=vsn
NODES=${1:-3}

stop_pidfile() {
    [ -f "$1" ] || return 0
    kill "$(cat "$1")" 2>/dev/null || true
    rm -f "$1"
}

if [ "${1:-}" = "--down" ]; then
    for f in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid; do stop_pidfile "$f"; done
    n=$(ls /run/netns 2>/dev/null | grep -c "^$P[0-9]" || true)
    sh ./netns-down.sh "$P" "${n:-0}"
    exit 0
fi

for b in munged slurmctld slurmd scontrol nsenter unshare ip; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || {
        echo "nscluster-up: $b missing; bash .ci/install.sh test" >&2
        exit 1
    }
done
sh ./netns-up.sh "$P" "$NODES" "$NET"
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
CTL=$(hostname)
{
    echo "ClusterName=vsens"
    echo "SlurmctldHost=$CTL($NET.254)"
    echo "SlurmctldPort=$PORT"
    echo "SlurmdPort=$((PORT + 1))"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "ReturnToService=2"
    echo "MpiDefault=none"
    echo "MailProg=/bin/true"
    echo "SlurmdParameters=config_overrides"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$DIR/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    i=1
    while [ "$i" -le "$NODES" ]; do
        echo "NodeName=n$i NodeHostname=n$i NodeAddr=$NET.$i CPUs=4 RealMemory=2048 State=UNKNOWN"
        i=$((i + 1))
    done
    echo "PartitionName=vsens Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} > "$CONF.new"

export SLURM_CONF=$CONF
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$(cat "$1")/status"; }
if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.new" && running "$DIR/slurmctld.pid"; then
    rm -f "$CONF.new"
else
    for f in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid; do stop_pidfile "$f"; done
    mv "$CONF.new" "$CONF"
    if ! pgrep -x munged >/dev/null 2>&1; then
        install -d -o munge -g munge /run/munge
        runuser -u munge -- /usr/sbin/munged
    fi
    /usr/sbin/slurmctld -f "$CONF" -c -i
fi
# Each slurmd: the node's network namespace (nsenter, not `ip netns exec`, which remounts /sys
# and hides the cgroup mount slurmd needs), its own hostname, and a private view of the
# node-local directories; the host's other mounts still propagate in (slave).
i=1
while [ "$i" -le "$NODES" ]; do
    pidf="$DIR/slurmd-n$i.pid"
    if ! running "$pidf"; then
        stop_pidfile "$pidf"
        local_dir=/var/tmp/vse-nscluster/n$i
        mkdir -p "$local_dir/tmp" "$local_dir/run" /var/tmp/vse /run/vse
        nsenter --net="/run/netns/$P$i" unshare --mount --uts --propagation slave sh -c "
            hostname n$i
            mount --bind '$local_dir/tmp' /var/tmp/vse
            mount --bind '$local_dir/run' /run/vse
            exec /usr/sbin/slurmd -f '$CONF' -N n$i"
    fi
    i=$((i + 1))
done
t=0
until scontrol ping 2>/dev/null | grep -q "is UP" &&
    [ "$(sinfo -h -o '%D %t' -t idle,mix,alloc | awk '{s+=$1} END {print s+0}')" -ge "$NODES" ]; do
    t=$((t + 1))
    if [ "$t" -gt 150 ]; then
        echo "nscluster-up: cluster not ready after 30 s; see $DIR/log" >&2
        sinfo >&2 || true
        exit 1
    fi
    sleep 0.2
done
echo "SLURM_CONF=$CONF" > "$DIR/slurm.env"
echo "VSE_FRONTEND_ADDR=$NET.254" >> "$DIR/slurm.env"
echo "$DIR/slurm.env"
