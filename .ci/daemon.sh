# .ci/daemon.sh — sourced by the scripts that start daemons by hand (no systemd here), and
# what the two test Slurm clusters configure alike.

# Stops the daemon whose pid file is $1 and waits until it is gone (SIGKILL after 10 s), so a
# restart never races the old daemon for its port. A zombie counts as gone: nothing may reap
# it in a container without an init.
stop_pidfile() {
    [ -f "$1" ] || return 0
    _pid=$(cat "$1")
    kill "$_pid" 2>/dev/null || true
    _t=0
    while kill -0 "$_pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$_pid/status" 2>/dev/null; do
        _t=$((_t + 1))
        if [ "$_t" -eq 100 ]; then kill -9 "$_pid" 2>/dev/null || true; fi
        [ "$_t" -le 150 ] || break
        sleep 0.1
    done
    rm -f "$1"
}

# The slurm.conf lines both test clusters share: every process of a job in its cgroups (v1
# here), its memory a consumable resource bounded by them, its use accounted in the slurmdbd
# of .ci/slurmdbd-up.sh (port $1), as a site runs Slurm.
slurm_site_lines() {
    echo "ProctrackType=proctrack/cgroup"
    echo "TaskPlugin=task/cgroup"
    echo "JobAcctGatherType=jobacct_gather/cgroup"
    echo "JobAcctGatherFrequency=task=2"
    echo "AccountingStorageType=accounting_storage/slurmdbd"
    echo "AccountingStorageHost=localhost"
    echo "AccountingStoragePort=$1"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core_Memory"
}

# Their cgroup.conf, read by slurmd and slurmstepd: a job's --mem bounds its RAM.
slurm_cgroup_conf() {
    echo "CgroupPlugin=cgroup/v1"
    echo "CgroupAutomount=no"
    echo "ConstrainRAMSpace=yes"
}
