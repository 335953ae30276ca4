#!/bin/sh
# .ci/slurmdbd-up.sh — Slurm's accounting, as a site keeps it: MariaDB (its own data directory,
# on 127.0.0.1 only, a password-protected account) and slurmdbd, shared by both test clusters
# (`sacct -M vse`, `sacct -M vsens`). Idempotent; no systemd: both daemons are started by hand.
#
#   .ci/slurmdbd-up.sh [CLUSTER…]   start (or leave running) and register the clusters
#                                   (default: vse and vsens, the two test clusters); prints
#                                   slurmdbd's port
#   .ci/slurmdbd-up.sh --down   stop what this script started
set -eu
DIR=/var/lib/vse-slurmdbd
RUN=/run/vse-slurmdbd
DB_PORT=16830
DBD_PORT=16829

. "$(dirname "$0")/daemon.sh"
if [ "${1:-}" = "--down" ]; then
    stop_pidfile "$RUN/slurmdbd.pid"
    stop_pidfile "$RUN/mysqld/mariadbd.pid"
    exit 0
fi
for b in mariadbd mariadb-install-db mariadb slurmdbd; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || {
        echo "slurmdbd-up: $b missing; bash .ci/install.sh test" >&2
        exit 1
    }
done
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# Traversable by mysql; the password and slurmdbd.conf inside are root-only files.
install -d -m 0755 "$DIR" "$RUN"
install -d -o mysql -g mysql -m 0700 "$DIR/mysql" "$DIR/mysql-log" "$RUN/mysqld"
# The account slurmdbd uses: a password made once, readable by root only.
[ -s "$DIR/password" ] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$DIR/password")
PASS=$(cat "$DIR/password")
sql() { mariadb --no-defaults -u root --socket="$RUN/mysqld/mysqld.sock" -e "$1"; }

if ! running "$RUN/mysqld/mariadbd.pid"; then
    if [ ! -d "$DIR/mysql/mysql" ]; then
        mariadb-install-db --no-defaults --user=mysql --datadir="$DIR/mysql" \
            --auth-root-authentication-method=socket >"$DIR/install-db.log" 2>&1 || {
            cat "$DIR/install-db.log" >&2
            exit 1
        }
    fi
    # Detached from this shell (setsid): CI's step must not wait on it.
    setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DIR/mysql" \
        --socket="$RUN/mysqld/mysqld.sock" --pid-file="$RUN/mysqld/mariadbd.pid" \
        --bind-address=127.0.0.1 --port=$DB_PORT --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
        --log-error="$DIR/mysql-log/mariadbd.log" </dev/null >/dev/null 2>&1 &
    t=0
    until sql 'SELECT 1' >/dev/null 2>&1; do
        t=$((t + 1))
        [ "$t" -le 150 ] || { echo "slurmdbd-up: MariaDB not up after 30 s; see $DIR/mysql-log/mariadbd.log" >&2; exit 1; }
        sleep 0.2
    done
fi
sql "CREATE USER IF NOT EXISTS 'vse_slurm'@'127.0.0.1' IDENTIFIED BY '$PASS';
     ALTER USER 'vse_slurm'@'127.0.0.1' IDENTIFIED BY '$PASS';
     CREATE DATABASE IF NOT EXISTS vse_slurm_acct;
     GRANT ALL ON vse_slurm_acct.* TO 'vse_slurm'@'127.0.0.1';"

CONF=$DIR/slurmdbd.conf
(
    umask 077
    {
        echo "AuthType=auth/munge"
        echo "DbdHost=localhost"
        echo "DbdAddr=127.0.0.1"
        echo "DbdPort=$DBD_PORT"
        echo "SlurmUser=root"
        echo "PidFile=$RUN/slurmdbd.pid"
        echo "LogFile=$DIR/slurmdbd.log"
        echo "StorageType=accounting_storage/mysql"
        echo "StorageHost=127.0.0.1"
        echo "StoragePort=$DB_PORT"
        echo "StorageUser=vse_slurm"
        echo "StoragePass=$PASS"
        echo "StorageLoc=vse_slurm_acct"
    } > "$CONF.new"
)
if ! { running "$RUN/slurmdbd.pid" && cmp -s "$CONF" "$CONF.new"; }; then
    stop_pidfile "$RUN/slurmdbd.pid"
    mv "$CONF.new" "$CONF"
    if ! pgrep -x munged >/dev/null 2>&1; then
        install -d -o munge -g munge /run/munge
        runuser -u munge -- /usr/sbin/munged
    fi
    # slurmdbd reads the slurmdbd.conf next to $SLURM_CONF.
    SLURM_CONF=$DIR/slurm.conf /usr/sbin/slurmdbd
else
    rm -f "$CONF.new"
fi
# The clusters are registered before their slurmctld first reports (sacctmgr talks to slurmdbd).
export SLURM_CONF=$DIR/client.conf
{
    echo "ClusterName=vse-accounting-client"
    echo "SlurmctldHost=localhost"
    echo "AccountingStorageType=accounting_storage/slurmdbd"
    echo "AccountingStorageHost=localhost"
    echo "AccountingStoragePort=$DBD_PORT"
    echo "AuthType=auth/munge"
} > "$SLURM_CONF"
t=0
until sacctmgr -n -P list cluster format=cluster >/dev/null 2>&1; do
    t=$((t + 1))
    [ "$t" -le 100 ] || { echo "slurmdbd-up: slurmdbd not answering after 20 s; see $DIR/slurmdbd.log" >&2; exit 1; }
    sleep 0.2
done
[ $# -gt 0 ] || set -- vse vsens
for c in "$@"; do
    sacctmgr -n -P list cluster format=cluster | grep -qx "$c" || sacctmgr -i add cluster "$c" >/dev/null
done
echo "$DBD_PORT"
