# .ci/daemon.sh — sourced by the scripts that start daemons by hand (no systemd here).

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
