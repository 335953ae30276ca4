#!/bin/sh
# .ci/nscluster-up.sh [NODES] — a Slurm cluster of real nodes on this machine. Node nI is:
#   - its own network namespace vsnI, address 10.77.0.I on bridge vsnbr (10.77.0.254 is the
#     host's side: slurmctld and the front-end of `vse launch` listen there);
#   - its own hostname (nI) and mount namespace, in which /var/tmp (the node-local image cache,
#     VSE_IMAGE_CACHE's default /var/tmp/vse-<uid>/images), /tmp (VM disk overlays) and /run/vse
#     (VM run directories) are the node's own: /var/tmp/vse-nscluster/nI/{var-tmp,tmp,run-vse}
#     seen from the host. Everything else (the build, cargo and $VSE_CACHE paths, /run/munge,
#     this cluster's configuration in /var/lib/vse-nscluster) is shared;
#   - its own memory cgroup (/sys/fs/cgroup/memory/vse-nscluster/nI, when cgroup v1 memory is
#     mounted) limited to its RealMemory (3 GiB), holding its slurmd and so every job step,
#     agent and QEMU of the node; bound over /sys/fs/cgroup/memory in the node, so Slurm's
#     job cgroups (proctrack/cgroup, task/cgroup) are made inside it.
# Only addresses inside these namespaces are used. Idempotent; prints an env file to source
# (SLURM_CONF, and VSE_NSCLUSTER_NODES=DIR with one sub-directory per node).
#
#   .ci/nscluster-up.sh [NODES]   (default 4: three compute nodes, the minimum for failure
#                                  avoidance's leave-one-out test, and a spare)
#   .ci/nscluster-up.sh --down    stop what this script started, remove the namespaces
#
# Next to the loopback cluster of .ci/slurm-up.sh (own ports, directory and SLURM_CONF).
set -eu
cd "$(dirname "$0")"
DIR=/var/lib/vse-nscluster
CONF=$DIR/slurm.conf
NODEDIR=/var/tmp/vse-nscluster
PORT=17817
NET=10.77.0
P=vsn
CG=/sys/fs/cgroup/memory/vse-nscluster
NODES=${1:-4}
MEM_MIB=3072

. ./daemon.sh

if [ "${1:-}" = "--down" ]; then
    for f in "$DIR"/slurmd-*.pid "$DIR"/sshd-*.pid "$DIR"/slurmctld.pid; do stop_pidfile "$f"; done
    n=$(ls /run/netns 2>/dev/null | grep -c "^$P[0-9]" || true)
    sh ./netns-down.sh "$P" "${n:-0}"
    # Empty once netns-down.sh has killed what was left in the namespaces.
    for cg in "$CG"/n*; do rmdir "$cg" 2>/dev/null || true; done
    rmdir "$CG" 2>/dev/null || true
    exit 0
fi
case $NODES in
    [1-9] | [1-9][0-9]) ;;
    *) echo "nscluster-up: NODES must be 1..99, not '$NODES'" >&2; exit 2 ;;
esac

for b in munged slurmctld slurmd scontrol sinfo nsenter unshare ip; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || {
        echo "nscluster-up: $b missing; bash .ci/install.sh test" >&2
        exit 1
    }
done
sh ./netns-up.sh "$P" "$NODES" "$NET"
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
DBD_PORT=$(sh ./slurmdbd-up.sh vsens)
slurm_cgroup_conf > "$DIR/cgroup.conf.new"
{
    echo "ClusterName=vsens"
    echo "SlurmctldHost=$(hostname)($NET.254)"
    echo "SlurmctldPort=$PORT"
    echo "SlurmdPort=$((PORT + 1))"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    slurm_site_lines "$DBD_PORT"
    # Two one-CPU jobs fill a node's 3 GiB.
    echo "DefMemPerCPU=1536"
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
        echo "NodeName=n$i NodeHostname=n$i NodeAddr=$NET.$i CPUs=4 RealMemory=$MEM_MIB State=UNKNOWN"
        i=$((i + 1))
    done
    echo "PartitionName=vsens Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} > "$CONF.new"

export SLURM_CONF=$CONF
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$(cat "$1")/status"; }
if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.new" && cmp -s "$DIR/cgroup.conf" "$DIR/cgroup.conf.new" &&
    running "$DIR/slurmctld.pid" && scontrol ping 2>/dev/null | grep -q "is UP"; then
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
# Each slurmd: the node's network namespace (nsenter, not `ip netns exec`, which remounts /sys
# and hides the cgroup mount slurmd needs), its own hostname, a private /var/tmp, /tmp and
# /run/vse;
# the host's other mounts still propagate in (slave). /var/tmp keeps its usual mode (1777,
# root): the image cache's checks refuse a cache under a directory others could swap.
# /run/vse and /tmp first: the node's directories are under /var/tmp, hidden once it is bound.
# A slurmd of an older run outside its namespace (or another cluster's) is restarted.
in_ns() { [ "$(readlink "/proc/$(cat "$1")/ns/net")" = "$(readlink "/run/netns/$2")" ] 2>/dev/null; }
i=1
while [ "$i" -le "$NODES" ]; do
    pidf="$DIR/slurmd-n$i.pid"
    if ! { running "$pidf" && in_ns "$pidf" "$P$i"; }; then
        stop_pidfile "$pidf"
        node=$NODEDIR/n$i
        install -d -m 1777 "$node/var-tmp" "$node/tmp"
        install -d -m 0755 "$node/run-vse" /run/vse
        cg=
        if [ -d /sys/fs/cgroup/memory ]; then
            cg=$CG/n$i
            mkdir -p "$cg"
            # The node's memory is what slurm.conf says it has (RealMemory).
            echo $((MEM_MIB << 20)) > "$cg/memory.limit_in_bytes"
        fi
        nsenter --net="/run/netns/$P$i" unshare --mount --uts --propagation slave sh -c "
            set -e
            [ -z '$cg' ] || echo \$\$ > '$cg/cgroup.procs'
            # The node's memory hierarchy starts at its own cgroup: Slurm's job cgroups
            # (slurm_nI/uid_U/job_J/…) are made inside the node's memory.
            [ -z '$cg' ] || mount --bind '$cg' /sys/fs/cgroup/memory
            hostname n$i
            mount --bind '$node/run-vse' /run/vse
            mount --bind '$node/tmp' /tmp
            mount --bind '$node/var-tmp' /var/tmp
            exec /usr/sbin/slurmd -f '$CONF' -N n$i"
    fi
    i=$((i + 1))
done
# The nodes' names resolve, as a site's DNS resolves its nodes' (a PBS node file lists names).
i=1
while [ "$i" -le "$NODES" ]; do
    grep -q "^$NET.$i n$i " /etc/hosts || echo "$NET.$i n$i # vse-nscluster" >> /etc/hosts
    i=$((i + 1))
done
# An sshd on each node (in its slurmd's namespaces), for the ssh allocations (`--allocation
# hostfile:F`, `pbs`): key authentication only, for the ordinary test accounts, each of which
# gets a key of its own and the nodes' host key in its known_hosts.
if [ -x /usr/sbin/sshd ]; then
    ssh_dir=$DIR/ssh
    install -d -m 0700 "$ssh_dir"
    [ -f "$ssh_dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$ssh_dir/host_ed25519"
    cat > "$ssh_dir/sshd_config" <<SSHD
HostKey $ssh_dir/host_ed25519
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin no
AllowUsers vse-tester vse-other
AuthorizedKeysFile .ssh/authorized_keys
StrictModes yes
SSHD
    for u in vse-tester vse-other; do
        home=$(getent passwd "$u" | cut -d: -f6) || continue
        install -d -m 0700 -o "$u" -g "$u" "$home/.ssh"
        [ -f "$home/.ssh/id_ed25519" ] || runuser -u "$u" -- ssh-keygen -q -t ed25519 -N '' -f "$home/.ssh/id_ed25519"
        install -m 0600 -o "$u" -g "$u" "$home/.ssh/id_ed25519.pub" "$home/.ssh/authorized_keys"
        i=1
        : > "$home/.ssh/known_hosts.new"
        while [ "$i" -le "$NODES" ]; do
            echo "n$i,$NET.$i $(cut -d' ' -f1-2 "$ssh_dir/host_ed25519.pub")" >> "$home/.ssh/known_hosts.new"
            i=$((i + 1))
        done
        install -m 0644 -o "$u" -g "$u" "$home/.ssh/known_hosts.new" "$home/.ssh/known_hosts"
        rm -f "$home/.ssh/known_hosts.new"
    done
    i=1
    while [ "$i" -le "$NODES" ]; do
        pidf=$DIR/sshd-n$i.pid
        if ! { running "$pidf" && in_ns "$pidf" "$P$i"; }; then
            stop_pidfile "$pidf"
            nsenter --target "$(cat "$DIR/slurmd-n$i.pid")" --net --mount --uts sh -c "
                install -d -m 0755 /run/sshd
                exec /usr/sbin/sshd -f '$ssh_dir/sshd_config' -o PidFile='$pidf'"
        fi
        i=$((i + 1))
    done
fi
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
{
    echo "SLURM_CONF=$CONF"
    echo "VSE_NSCLUSTER_NODES=$NODEDIR"
    echo "VSE_NSCLUSTER_PREFIX=$P"
    echo "VSE_NSCLUSTER_FRONTEND=$NET.254"
    # The nodes share this machine's /proc/meminfo: `vse launch --node-memory` may simulate
    # each node's memory with a cgroup, as for local:N.
    echo "VSE_NODES_SHARE_MACHINE=1"
} > "$DIR/slurm.env"
echo "$DIR/slurm.env"
