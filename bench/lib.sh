# Shell helpers the benchmark scripts share (sourced, not run). The caller defines
# `die MESSAGE`, `$WORK` (its scratch directory, where NAME.err holds a process's
# stderr) and `$PIDS` (the processes it started, stopped on exit).

# stop_pid PID: TERM, wait up to STOP_WAIT tenths of a second (default 50), then KILL.
# Only for PIDs the script started.
stop_pid() {
  local pid=$1 i
  [[ -n $pid ]] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq "${STOP_WAIT:-50}"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# stop_all: every PID in $PIDS, then the scratch directory.
stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  rm -rf "$WORK"
}

# free_port: a TCP port on 127.0.0.1 free at the time of asking.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_listening PID PORT NAME: until something listens on PORT (up to 10 s), or die
# when PID exits first.
wait_listening() {
  local i
  for i in $(seq 200); do
    [[ -n $(ss -Htln "sport = :$2") ]] && return 0
    kill -0 "$1" 2>/dev/null || die "$3 exited: $(tail -3 "$WORK/$3.err" 2>/dev/null)"
    sleep 0.05
  done
  die "$3 is not listening on port $2"
}

# cpu_ticks PID: utime+stime of PID (all its threads), in clock ticks.
cpu_ticks() {
  local stat rest
  stat=$(cat "/proc/$1/stat") || { echo 0; return; }
  rest=${stat##*) }
  read -r -a f <<< "$rest"
  echo $(( f[11] + f[12] ))
}
