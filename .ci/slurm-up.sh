#!/bin/sh
# .ci/slurm-up.sh — a real Slurm cluster on this machine: munged, slurmctld and N slurmd
# (`slurmd -N nI`, all on 127.0.0.1 with distinct ports). Idempotent: a running cluster with
# the same config is left alone. Prints the path of an env file to source (SLURM_CONF=...).
#
#   .ci/slurm-up.sh [NODES]     (default 4 nodes, n1..nN)
#   .ci/slurm-up.sh --down      stop what this script started
#   VSE_SLURM_DIR=/tmp/b VSE_SLURM_PORT=18817 VSE_SLURM_CLUSTER=vsebench VSE_SLURM_NODE_PREFIX=b \
#     .ci/slurm-up.sh 16   a separate cluster (its own name in the accounting, and node names
#                          of its own, which name its job cgroups: slurm_<node>/…)
#
# The cluster has the vse SPANK plugin (`srun --vse=IMAGE|SPEC`), built from
# plugins/spank into $DIR/vse_spank.so when libslurm-dev is installed. Its plugstack.conf
# points at $DIR/bin/vse: the tests link their own `vse` binary there.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${VSE_SLURM_DIR:-/tmp/vse-slurm}
CONF=$DIR/slurm.conf
NODES=${1:-4}
# A second cluster (e.g. for benchmarks, next to the tests' one) needs its own DIR and ports.
PORT=${VSE_SLURM_PORT:-16817}
CLUSTER=${VSE_SLURM_CLUSTER:-vse}
N=${VSE_SLURM_NODE_PREFIX:-n}

. "$ROOT/.ci/daemon.sh"

if [ "${1:-}" = "--down" ]; then
    for f in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid; do stop_pidfile "$f"; done
    exit 0
fi

for b in munged slurmctld slurmd scontrol sinfo srun; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || {
        echo "slurm-up: $b missing; apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge" >&2
        exit 1
    }
done
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
CPUS=4
DBD_PORT=$(sh "$ROOT/.ci/slurmdbd-up.sh" "$CLUSTER")
# The cluster is restarted below when it changes.
slurm_cgroup_conf > "$DIR/cgroup.conf.new"
{
    echo "ClusterName=$CLUSTER"
    echo "SlurmctldHost=localhost"
    echo "SlurmctldPort=$PORT"
    echo "SlurmdPort=$((PORT + 1))"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    slurm_site_lines "$DBD_PORT"
    # A job's --mem is by default 2 GiB a CPU. The nodes share this machine: their RealMemory
    # is nominal, large enough for the tests' concurrent jobs.
    echo "DefMemPerCPU=2048"
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
    echo "PlugStackConfig=$DIR/plugstack.conf"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    i=1
    while [ "$i" -le "$NODES" ]; do
        echo "NodeName=$N$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT + 183 + i)) CPUs=$CPUS RealMemory=8192 State=UNKNOWN"
        i=$((i + 1))
    done
    echo "PartitionName=vse Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} > "$CONF.new"

# plugstack.conf is read by every srun and slurmstepd: changing it needs no restart.
mkdir -p "$DIR/bin" "$DIR/spank-run"
# The site policy, naming the site's audit file (root's, every user appends: each srun --vse
# step's record); replaced whole, since a running srun may read it meanwhile.
install -d -o root -m 0755 "$DIR/audit"
[ -f "$DIR/audit/audit.jsonl" ] || install -o root -m 0622 /dev/null "$DIR/audit/audit.jsonl"
{
    cat "$ROOT/specs/site.policy.yaml"
    printf 'audit:\n  file: %s\n' "$DIR/audit/audit.jsonl"
} > "$DIR/site.policy.yaml.$$"
mv "$DIR/site.policy.yaml.$$" "$DIR/site.policy.yaml"
if [ -f /usr/include/slurm/spank.h ] && make -s -C "$ROOT/plugins/spank" O="$DIR" >&2; then
    echo "required $DIR/vse_spank.so vse=$DIR/bin/vse run_dir=$DIR/spank-run policy=$DIR/site.policy.yaml cache=${VSE_CACHE:-/var/cache/vse}" > "$DIR/plugstack.conf.new"
else
    echo "slurm-up: vse SPANK plugin not built (apt-get install libslurm-dev); srun --vse is unavailable" >&2
    echo "# vse_spank.so not built: libslurm-dev missing" > "$DIR/plugstack.conf.new"
fi
mv "$DIR/plugstack.conf.new" "$DIR/plugstack.conf"

export SLURM_CONF=$CONF
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$(cat "$1")/status"; }

if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.new" && cmp -s "$DIR/cgroup.conf" "$DIR/cgroup.conf.new" && running "$DIR/slurmctld.pid" && scontrol ping 2>/dev/null | grep -q "is UP"; then
    rm -f "$CONF.new" "$DIR/cgroup.conf.new"
else
    for f in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid; do stop_pidfile "$f"; done
    mv "$CONF.new" "$CONF"
    mv "$DIR/cgroup.conf.new" "$DIR/cgroup.conf"
    if ! pgrep -x munged >/dev/null 2>&1; then
        install -d -o munge -g munge /run/munge
        runuser -u munge -- /usr/sbin/munged
    fi
    /usr/sbin/slurmctld -f "$CONF" -c -i
fi
# Each slurmd runs in its own mount namespace where /var/tmp/vse-node is that node's private
# directory (/var/tmp/vse-nodes/nI on the host), so node-local files — e.g. what `sbcast`
# writes for `vse bench launch` — are really one copy per node, as on a cluster. Mounts of the
# host still propagate in (slave). A slurmd from an older run without its namespace is restarted.
own_ns() { [ "$(readlink "/proc/$(cat "$1")/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ]; }
i=1
while [ "$i" -le "$NODES" ]; do
    pidf="$DIR/slurmd-$N$i.pid"
    if ! { running "$pidf" && own_ns "$pidf"; }; then
        stop_pidfile "$pidf"
        mkdir -p "/var/tmp/vse-nodes/$N$i" /var/tmp/vse-node
        unshare --mount --propagation slave sh -c \
            "mount --bind /var/tmp/vse-nodes/$N$i /var/tmp/vse-node && exec /usr/sbin/slurmd -f '$CONF' -N $N$i"
    fi
    i=$((i + 1))
done
t=0
until scontrol ping 2>/dev/null | grep -q "is UP" && [ "$(sinfo -h -o '%D %t' -t idle,mix,alloc | awk '{s+=$1} END {print s+0}')" -ge "$NODES" ]; do
    t=$((t + 1))
    if [ "$t" -gt 100 ]; then
        echo "slurm-up: cluster not ready after 20 s; see $DIR/log" >&2
        sinfo >&2 || true
        exit 1
    fi
    sleep 0.2
done
echo "SLURM_CONF=$CONF" > "$DIR/slurm.env"
echo "$DIR/slurm.env"
