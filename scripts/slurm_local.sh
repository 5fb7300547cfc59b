#!/usr/bin/env bash
# A single-node SLURM cluster on localhost, for tests and trying the SLURM launcher (docs/slurm.md).
#
#   scripts/slurm_local.sh start    # munged, MariaDB, slurmdbd, slurmctld, slurmd; prints the env
#   scripts/slurm_local.sh status   # each daemon's recorded PID and whether it runs; sinfo
#   scripts/slurm_local.sh stop     # cancels this cluster's jobs, then stops exactly the recorded PIDs
#   export SLURM_CONF=/tmp/slurm-local/slurm.conf   # or: source /tmp/slurm-local/env
#
# Needs root and the Debian packages (no systemd needed):
#   apt-get install -y --no-install-recommends munge slurmctld slurmd slurm-client slurmdbd mariadb-server
# Environment: SLURM_DIR (state, logs, PID files; default /tmp/slurm-local), ACCOUNTING=0 skips
# MariaDB + slurmdbd (then sacct fails and submitit cannot notice a killed job: keep it on).
# Every daemon runs in the foreground under setsid, so `$!` is its PID; the PIDs go to
# $SLURM_DIR/<daemon>.bgpid and `stop` signals those PIDs only (never a process found by name).
# KillWait=5: a cancelled job step gets SIGKILL 5 s after SIGTERM (SLURM's default is 30 s;
# submitit's job wrapper ignores SIGTERM, so until then a cancelled job keeps generating).
set -euo pipefail

D=${SLURM_DIR:-/tmp/slurm-local}
ACCOUNTING=${ACCOUNTING:-1}
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)   # start order; stop goes in reverse
export SLURM_CONF=$D/slurm.conf

die() { echo "slurm_local: $*" >&2; exit 1; }
wait_for() {  # wait_for SECONDS COMMAND...: poll until COMMAND succeeds
  local tries=$(( $1 * 4 )); shift
  for _ in $(seq 1 "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  return 1
}
pid_of() { [ -s "$D/$1.bgpid" ] && cat "$D/$1.bgpid" || true; }
# The recorded PID is alive and still runs the program we started (guards against PID reuse).
alive() {
  local pid; pid=$(pid_of "$1"); [ -n "$pid" ] || return 1
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$1"
}
record() { echo "$2" >"$D/$1.bgpid"; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found; install the Debian packages: apt-get install -y --no-install-recommends munge slurmctld slurmd slurm-client slurmdbd mariadb-server"; }
log_hint() { echo "see $D/$1" >&2; tail -n 20 "$D/$1" >&2 2>/dev/null || true; }

start() {
  [ "$(id -u)" = 0 ] || die "start needs root (munged, slurmd)"
  for cmd in munged munge unmunge slurmctld slurmd sinfo; do need "$cmd"; done
  [ "$ACCOUNTING" = 1 ] && for cmd in slurmdbd sacctmgr mariadbd mariadb mariadb-install-db; do need "$cmd"; done
  local running=0 n
  for n in "${DAEMONS[@]}"; do alive "$n" && running=$((running + 1)); done
  if [ "$running" -gt 0 ]; then
    status >/dev/null && { echo "slurm_local: already running in $D"; env_line; return 0; }
    die "some daemons of $D are running, others not; run '$0 stop' first"
  fi
  mkdir -p "$D/state" "$D/spool" "$D/munge" "$D/mysql"

  # 1. munge: the package creates the key; make one if absent
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey -c -f -k /etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge && chown munge:munge /run/munge "$D/munge"
  # setpriv execs munged as the munge user in the same process (runuser would fork and hold the PID)
  setsid setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F \
    --pid-file="$D/munge/munged.pid" </dev/null >"$D/munged.log" 2>&1 &
  record munged $!
  wait_for 30 bash -c 'munge -n | unmunge' || { log_hint munged.log; die "munged did not start"; }
  alive munged || { log_hint munged.log; die "munged exited (is another munged serving /run/munge?)"; }

  local acct="AccountingStorageType=accounting_storage/none"
  if [ "$ACCOUNTING" = 1 ]; then
    # 2. MariaDB in a private datadir, loopback only
    chown mysql:mysql "$D/mysql"
    if [ ! -d "$D/mysql/mysql" ]; then
      mariadb-install-db --user=mysql --datadir="$D/mysql" --auth-root-authentication-method=socket \
        >"$D/mysql-install.log" 2>&1 || { log_hint mysql-install.log; die "mariadb-install-db failed"; }
    fi
    setsid mariadbd --no-defaults --user=mysql --datadir="$D/mysql" --socket="$D/mysql/mysql.sock" \
      --bind-address=127.0.0.1 --port=3306 --pid-file="$D/mysql/mysql.pid" \
      --log-error="$D/mysql/mysql.err" --innodb-buffer-pool-size=256M \
      --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1 &
    record mariadbd $!
    wait_for 60 mariadb --socket="$D/mysql/mysql.sock" -e 'select 1' \
      || { log_hint mysql/mysql.err; die "MariaDB did not start"; }
    mariadb --socket="$D/mysql/mysql.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' \
      IDENTIFIED BY 'slurmpw'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
    # 3. slurmdbd reads slurmdbd.conf beside $SLURM_CONF; it must be mode 600
    cat >"$D/slurmdbd.conf" <<EOC
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
PidFile=$D/slurmdbd.pid
LogFile=$D/slurmdbd.log
EOC
    chmod 600 "$D/slurmdbd.conf"
    acct=$'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\nAccountingStoragePort=6819'
  fi

  local mem_mb; mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
  cat >"$D/slurm.conf" <<EOC
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$acct
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOC

  if [ "$ACCOUNTING" = 1 ]; then
    setsid slurmdbd -D </dev/null >"$D/slurmdbd.stdout" 2>&1 &
    record slurmdbd $!
    wait_for 60 sacctmgr -n list cluster || { log_hint slurmdbd.log; die "slurmdbd did not start"; }
    sacctmgr -n list cluster format=cluster | grep -qw local || sacctmgr -i add cluster local >/dev/null
  fi
  # 4. controller and node daemon in the foreground (-D), so $! is the daemon itself
  setsid slurmctld -D </dev/null >"$D/slurmctld.stdout" 2>&1 &
  record slurmctld $!
  setsid slurmd -D -N localhost </dev/null >"$D/slurmd.stdout" 2>&1 &
  record slurmd $!
  wait_for 60 bash -c 'sinfo -h -o %T | grep -Eq "idle|mixed|alloc"' \
    || { log_hint slurmctld.log; log_hint slurmd.log; die "the node did not come up"; }
  echo "export SLURM_CONF=$SLURM_CONF" >"$D/env"
  echo "slurm_local: up in $D ($(nproc) CPUs, ${mem_mb} MB)"
  env_line
}

env_line() { echo "export SLURM_CONF=$SLURM_CONF"; }

stop() {
  # Jobs of this private cluster first, so that no job step outlives its slurmd.
  if alive slurmctld && command -v squeue >/dev/null; then
    local jobs; jobs=$(squeue -h -o %A 2>/dev/null | sort -u || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      wait_for 20 bash -c '[ -z "$(squeue -h -o %A 2>/dev/null)" ]' || echo "slurm_local: jobs still listed: $(squeue -h -o %A | tr '\n' ' ')" >&2
    fi
  fi
  local i n pid
  for (( i=${#DAEMONS[@]}-1; i>=0; i-- )); do
    n=${DAEMONS[$i]}; pid=$(pid_of "$n")
    [ -n "$pid" ] || continue
    if alive "$n"; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      if kill -0 "$pid" 2>/dev/null; then echo "slurm_local: $n ($pid) ignored TERM; killing it" >&2; kill -KILL "$pid" 2>/dev/null || true; fi
      echo "slurm_local: stopped $n ($pid)"
    fi
    rm -f "$D/$n.bgpid"
  done
}

status() {  # exit 0 when every daemon that start recorded runs and the node answers
  local n rc=0 seen=0
  for n in "${DAEMONS[@]}"; do
    [ -n "$(pid_of "$n")" ] || continue
    seen=1
    if alive "$n"; then echo "$n: running (pid $(pid_of "$n"))"; else echo "$n: not running (pid $(pid_of "$n") recorded)"; rc=1; fi
  done
  [ $seen = 1 ] || { echo "slurm_local: not running (no PID files in $D)"; return 1; }
  if [ $rc = 0 ]; then sinfo -h -o "node %N: %T, %c CPUs, %m MB" 2>/dev/null || rc=1; fi
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status   (SLURM_DIR=${D}, ACCOUNTING=${ACCOUNTING})" >&2; exit 2 ;;
esac
