#!/usr/bin/env bash
# =============================================================================
# bench/http-core.sh — reproducible HTTP/1.1 forward-proxy benchmark:
#                      rustle vs haproxy vs nginx, 1 KB responses, loopback.
# =============================================================================
#
# WHAT IT MEASURES
#   wrk (CPU 1) --absolute-form GET--> PROXY 127.0.0.1:13128 (CPU 0)
#       --> nginx ORIGIN 127.0.0.1:18080 (CPU 1), file /1k = exactly 1024 bytes
#
#   Proxies under test (each started fresh for every run, one at a time):
#     rustle   $RUSTLE_BIN --http 127.0.0.1:13128 --workers 1 --log off
#     haproxy  Debian's haproxy, nbthread 1, mode http, http-reuse always
#     nginx    Debian's nginx, worker_processes 1, upstream keepalive 1024
#   Every proxy is pinned to CPU 0 (taskset -c 0), runs one worker/thread,
#   logs nothing and keeps idle connections to the origin for reuse.
#
#   Scenarios (wrk: 1 thread, CONNS=64 connections, DURATION seconds):
#     ka     64 keep-alive client connections, requests back to back
#     close  same, but every request carries "Connection: close", so every
#            request is a new client->proxy TCP connection (the proxy->origin
#            side may and should still be reused)
#   wrk uses ONE thread: wrk shares CPU 1 with the origin, and a second wrk
#   thread on the same core only adds context switches (measured: -t2 was
#   not better than -t1 on this 2-CPU box; override with WRK_THREADS).
#
#   CPU modes:
#     full    the proxy has all of CPU 0 (cgroup without quota). On a 2-CPU
#             machine CPU 1 (wrk + origin) may be the bottleneck here: check
#             the "util" column (proxy CPU seconds / wall seconds) and the
#             "direct" baseline row (wrk -> origin without a proxy).
#     capped  the proxy's processes are in a cgroup-v1 cpu group with
#             cpu.cfs_quota_us=50000 / cpu.cfs_period_us=100000, i.e. half a
#             core, so the proxy (not wrk, not the origin) sets the pace.
#             Throttling adds up to ~50 ms to some requests, visible in p99.
#
#   Recorded per run: requests, seconds, req/s, latency p50/p99 (wrk's
#   done() hook prints one JSON line), socket errors (connect+read+write+
#   timeout), non2xx (wrk's status errors = responses with status >= 400),
#   proxy CPU seconds (utime+stime from /proc/PID/stat, summed over every
#   process of the proxy, read before and after the measured wrk run;
#   the proxy runs from a private copy of the binary, so a rebuild of
#   target/ during the benchmark changes nothing),
#   CPU µs per request, and peak RSS (VmHWM, summed over the proxy's
#   processes, e.g. nginx master + worker).
#   Before and after every run, curl fetches /1k through the proxy and the
#   body must be byte-identical to the origin file (status 200, 1024 bytes),
#   both with keep-alive (two requests on one connection) and with
#   Connection: close. A failed check is reported, and a failed pre-check
#   skips that run.
#
# HOW TO RUN (as root: it creates cgroups; needs nginx, haproxy, wrk, curl)
#   cargo build --release -p rustle
#   bench/http-core.sh                 # DURATION=10 REPS=3: ~8 min on a quiet
#                                      # machine (longer if runs are retried)
#   bench/http-core.sh --quick         # CI smoke test: 2 s runs, 1 rep,
#                                      # capped only, ~25 s (same as QUICK=1)
#   STRACE=1 bench/http-core.sh        # + syscall pass (perf + strace -c)
#
#   Environment knobs (defaults in brackets):
#     DURATION [10]  seconds per measured run      REPS [3] repetitions
#     WARMUP   [1]   seconds of unrecorded load before each measured run
#     CONNS    [64]  wrk connections               WRK_THREADS [1]
#     PROXIES  ["rustle haproxy nginx"]   SCENARIOS ["ka close"]
#              also: floor (rustle-bench floor: copies bytes, nothing else;
#              the kernel's share of an exchange) and floor-http (the same
#              plus rustle's HTTP codec on every head). Neither has a pool:
#              with close, each opens an origin connection per request
#     FLOOR_BIN [target/release/rustle-bench]
#     MODES    ["full capped"]            BASELINE [1] direct wrk->origin row
#     RUSTLE_BIN [target/release/rustle]  NGINX_BIN, HAPROXY_BIN, WRK_BIN
#     STRACE [0]  1: after the reps, per proxy and scenario (full mode), a
#                 STRACE_SECS [3] s pass counting syscalls: first with
#                 `perf stat` syscall tracepoints (low overhead: the number
#                 to quote), then `strace -c -f` (per-syscall breakdown;
#                 strace slows the proxy a lot, so only the per-request
#                 ratios mean anything)
#     RESULTS_DIR [bench/results]
#     WAIT_IDLE [60]  before starting, and before re-running a disturbed run,
#                     wait up to this many seconds for both CPUs to be idle
#     RETRY_NOISY [2] a run during which processes other than ours used
#                     > 10% of CPU 0 or CPU 1 (from /proc/stat minus our
#                     cpuacct groups) is discarded and re-run up to this many
#                     times; the last try is kept and counted as "noisy"
#     (--quick sets WAIT_IDLE=0 RETRY_NOISY=0 unless given)
#   The proxy order is rotated between repetitions (rep r starts with the
#   proxy r positions further), so no proxy always runs first/last.
#   A proxy whose binary is missing (or that fails its startup check) is
#   skipped and listed with the reason in the summary and the .env file;
#   the script still exits 0 as long as at least one proxy ran.
#
# OUTPUT (STAMP = local date-time of the start, e.g. 20250101-120000)
#   bench/results/http-core-STAMP.csv    one row per run:
#       date,proxy,scenario,cpu_mode,rep,requests,seconds,rps,p50_ms,p99_ms,
#       errors,non2xx,cpu_s,cpu_us_per_req,rss_kb
#     (proxy "direct" = no proxy, baseline; its cpu columns are empty)
#   bench/results/http-core-STAMP.jsonl  the same runs with everything:
#       raw wrk JSON, bytes/response, cpuacct seconds, cgroup throttling,
#       origin CPU, busy share of both CPUs, other processes' load, new
#       origin connections per request (origin stub_status), checks
#   bench/results/http-core-STAMP.md     markdown summary (also printed):
#       medians per proxy x scenario x mode (plus CPU busy shares, origin
#       connections per request, noisy-run count), and rustle / best-of(haproxy,
#       nginx) ratios for req/s (higher is better, best = max) and CPU µs per
#       request (lower is better, best = min)
#   bench/results/http-core-STAMP.env    conditions: CPU, kernel, versions,
#       rustle git rev + binary sha256, sysctls, knobs, generated configs
#   bench/results/http-core-STAMP-syscalls/  (STRACE=1) perf + strace output
#
# SAFETY
#   Loopback only. Every process started here is stopped by PID and the
#   cgroups /sys/fs/cgroup/{cpu,cpuacct}/rustle-bench-$$ are removed on
#   EXIT/INT/TERM. Ports 18080 and 13128 must be free (checked).
#   Scratch files live in a mktemp -d under /dev/shm (tmpfs).
# =============================================================================
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

QUICK=${QUICK:-0}
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "http-core.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

if [[ $QUICK == 1 ]]; then
  DURATION=${QUICK_DURATION:-2}; REPS=1; MODES=capped; BASELINE=0; STRACE=0
  WAIT_IDLE=${WAIT_IDLE:-0}; RETRY_NOISY=${RETRY_NOISY:-0}   # a smoke test: don't wait
fi
DURATION=${DURATION:-10}
REPS=${REPS:-3}
WARMUP=${WARMUP:-1}
CONNS=${CONNS:-64}
WRK_THREADS=${WRK_THREADS:-1}
PROXIES=${PROXIES:-"rustle haproxy nginx"}
SCENARIOS=${SCENARIOS:-"ka close"}
MODES=${MODES:-"full capped"}
BASELINE=${BASELINE:-1}
STRACE=${STRACE:-0}
STRACE_SECS=${STRACE_SECS:-3}
RESULTS_DIR=${RESULTS_DIR:-$HERE/results}

RUSTLE_BIN=${RUSTLE_BIN:-$ROOT/target/release/rustle}
FLOOR_BIN=${FLOOR_BIN:-$ROOT/target/release/rustle-bench}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
HAPROXY_BIN=${HAPROXY_BIN:-$(command -v haproxy || echo /usr/sbin/haproxy)}
WRK_BIN=${WRK_BIN:-$(command -v wrk || echo /usr/bin/wrk)}
LUA=$HERE/wrk-proxy.lua

PROXY_CPU=0            # the proxy under test
LOAD_CPU=1             # wrk and the origin
ORIGIN_PORT=18080
PROXY_PORT=13128
ORIGIN=127.0.0.1:$ORIGIN_PORT
TARGET=http://$ORIGIN/1k
CAP_QUOTA_US=50000
CAP_PERIOD_US=100000
CLK_TCK=$(getconf CLK_TCK)

log()  { printf '[http-core %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die()  { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- preflight
[[ $(id -u) == 0 ]] || die "must run as root (cgroup cpu quota, pinning)"
for b in "$WRK_BIN" "$NGINX_BIN"; do [[ -x $b ]] || die "missing $b (origin and load generator are required)"; done
for t in taskset curl awk ss getconf cmp; do command -v "$t" >/dev/null || die "missing tool: $t"; done
[[ -f $LUA ]] || die "missing $LUA"
[[ $(nproc --all) -ge 2 ]] || die "needs at least 2 CPUs (proxy on CPU $PROXY_CPU, load on CPU $LOAD_CPU)"
CG_CPU_ROOT=/sys/fs/cgroup/cpu
CG_ACCT_ROOT=/sys/fs/cgroup/cpuacct
[[ -w $CG_CPU_ROOT/cgroup.procs && -e $CG_CPU_ROOT/cpu.cfs_quota_us ]] \
  || die "cgroup v1 cpu controller not mounted at $CG_CPU_ROOT"
for p in $ORIGIN_PORT $PROXY_PORT; do
  if [[ -n $(ss -Htln "sport = :$p") ]]; then die "port $p is already in use"; fi
done

# ------------------------------------------------------------ state, cleanup
WORK=""
CG_CPU=""
CG_ACCT=""
CG_LOAD=""            # cpuacct group of wrk + origin: tells their CPU from other load
ORIGIN_PID=""
PROXY_PID=""
AUX_PIDS=()           # wrk / strace / perf started in the background

stop_pid() {  # stop_pid PID: TERM, wait up to 5 s, then KILL. Only our PIDs.
  local pid=$1 i
  [[ -n $pid ]] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cg_pids() {  # PIDs currently in our cpu cgroup (= the proxy's processes)
  [[ -n $CG_CPU && -r $CG_CPU/cgroup.procs ]] && cat "$CG_CPU/cgroup.procs" || true
}

stop_proxy() {
  local pid
  if [[ -n $PROXY_PID ]]; then stop_pid "$PROXY_PID"; PROXY_PID=""; fi
  # Anything left in our cgroup was started by us (children of the proxy,
  # e.g. an nginx worker whose master died): stop those PIDs too.
  for pid in $(cg_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do [[ -z $(cg_pids) ]] && break; sleep 0.1; done
}

cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  for pid in "${AUX_PIDS[@]}"; do stop_pid "$pid"; done
  stop_proxy
  if [[ -n $ORIGIN_PID ]]; then stop_pid "$ORIGIN_PID"; ORIGIN_PID=""; fi
  for cg in "$CG_CPU" "$CG_ACCT" "$CG_LOAD"; do
    [[ -n $cg && -d $cg ]] || continue
    for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    for _ in $(seq 30); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
    [[ -d $cg ]] && log "WARNING: could not remove cgroup $cg"
  done
  [[ -n $WORK && -d $WORK ]] && rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

WORK=$(mktemp -d /dev/shm/rustle-bench.XXXXXX)
chmod 755 "$WORK"     # nginx workers drop root for nobody: they must read here
CG_CPU=$CG_CPU_ROOT/rustle-bench-$$
mkdir "$CG_CPU"
echo "$CAP_PERIOD_US" > "$CG_CPU/cpu.cfs_period_us"
[[ -e $CG_CPU/cpu.cfs_burst_us ]] && echo 0 > "$CG_CPU/cpu.cfs_burst_us"
echo -1 > "$CG_CPU/cpu.cfs_quota_us"
if [[ -w $CG_ACCT_ROOT/cgroup.procs && -e $CG_ACCT_ROOT/cpuacct.usage ]]; then
  CG_ACCT=$CG_ACCT_ROOT/rustle-bench-$$    # separate v1 hierarchy here
  [[ $CG_ACCT_ROOT -ef $CG_CPU_ROOT ]] && CG_ACCT=$CG_CPU   # co-mounted cpu,cpuacct
  [[ -d $CG_ACCT ]] || mkdir "$CG_ACCT"
  CG_LOAD=$CG_ACCT_ROOT/rustle-bench-$$-load
  mkdir "$CG_LOAD"
fi

mkdir -p "$RESULTS_DIR"
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$RESULTS_DIR/http-core-$STAMP
CSV=$OUT.csv
JSONL=$OUT.jsonl
MD=$OUT.md
ENVF=$OUT.env
SKIPS=$WORK/skips
EXTRA=$WORK/extra      # per run: proxy scenario mode cpu0-busy cpu1-busy origin-conns/req
: > "$SKIPS"; : > "$EXTRA"
echo "date,proxy,scenario,cpu_mode,rep,requests,seconds,rps,p50_ms,p99_ms,errors,non2xx,cpu_s,cpu_us_per_req,rss_kb" > "$CSV"
: > "$JSONL"

# ------------------------------------------------------------------- origin
# nginx origin on CPU 1: one process (master_process off, daemon off, so the
# PID we start is the PID that serves), no logs, effectively unlimited
# keep-alive so proxies can keep reusing their upstream connections.
# open_file_cache avoids open/fstat/close per request; sendfile off makes
# nginx send headers + the 1 KB body in one writev (sendfile would need
# writev + sendfile, or TCP_CORK toggling): the cheapest origin we can have,
# because it shares CPU 1 with wrk.
nginx_temp_paths() {  # temp dirs inside our prefix, for modules compiled in
  local d=$1 V
  V=$("$NGINX_BIN" -V 2>&1)
  mkdir -p "$d"/tmp/{body,proxy,fastcgi,uwsgi,scgi}
  echo "client_body_temp_path $d/tmp/body;"
  echo "proxy_temp_path $d/tmp/proxy;"
  [[ $V == *--without-http_fastcgi_module* ]] || echo "fastcgi_temp_path $d/tmp/fastcgi;"
  [[ $V == *--without-http_uwsgi_module* ]] || echo "uwsgi_temp_path $d/tmp/uwsgi;"
  [[ $V == *--without-http_scgi_module* ]] || echo "scgi_temp_path $d/tmp/scgi;"
}

start_origin() {
  local d=$WORK/origin
  mkdir -p "$d/www" "$d/logs"
  head -c 768 /dev/urandom | base64 -w 0 > "$d/www/1k"   # 768 bytes -> 1024 base64 chars
  [[ $(stat -c %s "$d/www/1k") == 1024 ]] || die "origin file is not 1024 bytes"
  cat > "$d/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 16384; multi_accept on; }
http {
  access_log off;
  $(nginx_temp_paths "$d")
  default_type application/octet-stream;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  open_file_cache max=64 inactive=300s;
  open_file_cache_valid 300s;
  sendfile off;
  etag off;
  server {
    listen $ORIGIN backlog=4096;
    root $d/www;
    location / { }
$( "$NGINX_BIN" -V 2>&1 | grep -q with-http_stub_status_module && echo "    location = /_status { stub_status; }  # accepted-connection counter" )
  }
}
EOF
  # a subshell that execs: $! is nginx itself (stopped by PID, CPU read by PID)
  (
    [[ -n $CG_LOAD ]] && echo "$BASHPID" > "$CG_LOAD/cgroup.procs"
    exec taskset -c "$LOAD_CPU" "$NGINX_BIN" -p "$d" -c "$d/nginx.conf" -e "$d/logs/error.log"
  ) > "$d/logs/stdout" 2>&1 < /dev/null &
  ORIGIN_PID=$!
  wait_listen "$ORIGIN_PORT" "$ORIGIN_PID" || { cat "$d/logs/"* >&2; die "origin nginx did not start"; }
  curl -sS --max-time 5 -o "$WORK/origin-check" "$TARGET" || die "origin not answering"
  cmp -s "$WORK/origin-check" "$d/www/1k" || die "origin body differs from the file"
}

on_load_cpu() {  # run a command (foreground) pinned to the load CPU, in the load cpuacct group
  (
    [[ -n $CG_LOAD ]] && echo "$BASHPID" > "$CG_LOAD/cgroup.procs"
    exec taskset -c "$LOAD_CPU" "$@"
  )
}

wait_listen() {  # wait_listen PORT PID: up to 10 s for a listener on PORT
  local port=$1 pid=$2
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 1
    [[ -n $(ss -Htln "sport = :$port") ]] && return 0
    sleep 0.1
  done
  return 1
}

# ------------------------------------------------------------------ proxies
# Every proxy: one worker/thread, no access log, listen on 127.0.0.1:13128,
# keep client connections alive, keep/reuse idle connections to the origin,
# long keep-alive timeouts, no per-connection request cap that would force
# reconnects during a run. Nothing beyond that (no caching, no buffering
# tricks): the same job for all three.

write_haproxy_cfg() {
  local d=$1
  cat > "$d/haproxy.cfg" <<EOF
# haproxy is a reverse proxy, but it parses absolute-form request lines
# ("GET http://127.0.0.1:18080/1k HTTP/1.1"), checks that the authority
# matches Host, and forwards them to its backend, which is the origin here.
global
    nbthread 1                 # one thread: same as rustle --workers 1 and nginx worker_processes 1
    maxconn 4096               # far above the 64 connections used; higher values make
                               # haproxy want more FDs than the 20000 ulimit here
    # no "log" line: logging off
    # no master-worker (-W): started with -db, one process that serves

defaults
    mode http                  # full HTTP/1.1 parsing and forwarding, like the other two
    option http-keep-alive     # keep client and server connections open between requests
    http-reuse always          # any idle server connection may serve any client: the
                               # equivalent of nginx's upstream keepalive pool and of a
                               # forward proxy's per-origin pool
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-request 10s
    timeout http-keep-alive 60s

frontend fwd
    bind $PROXY_ADDR
    default_backend origin

backend origin
    # pool-max-conn defaults to -1 (unlimited idle connections kept)
    server origin $ORIGIN
EOF
}

write_nginx_proxy_cfg() {
  local d=$1
  cat > "$d/nginx.conf" <<EOF
# nginx as a forward proxy: a server block accepts absolute-form request
# lines (nginx takes the host from the request line, \$uri = /1k) and
# proxy_pass sends them to an upstream pool with kept-alive connections.
daemon off;                  # foreground: the PID we start is the master
master_process on;           # the production layout: master + 1 worker;
                             # CPU and RSS are summed over both
worker_processes 1;          # one worker: same as rustle --workers 1, haproxy nbthread 1
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
worker_rlimit_nofile 65536;
events {
    worker_connections 16384;
    multi_accept on;         # accept all pending connections per wake-up (helps "close";
                             # harmless with a single worker)
}
http {
    access_log off;          # logging off
    $(nginx_temp_paths "$d")
    keepalive_requests 1000000;   # client side: never close a kept-alive client connection
    keepalive_timeout 300s;
    upstream origin {
        server $ORIGIN;
        keepalive 1024;           # idle connections kept per worker for reuse
        keepalive_requests 1000000;  # default 1000 would force upstream reconnects
        keepalive_timeout 300s;
    }
    server {
        listen $PROXY_ADDR backlog=4096;
        location / {
            proxy_pass http://origin;       # request URI passed as received (/1k)
            proxy_http_version 1.1;         # required for upstream keep-alive
            proxy_set_header Connection ""; # don't forward "close": keep the upstream connection
            proxy_set_header Host \$http_host;  # forward proxy: keep the client's Host
            # proxy_buffering on (default): the 1 KB response fits the first buffer
        }
    }
}
EOF
}

PROXY_ADDR=127.0.0.1:$PROXY_PORT

proxy_bin() {
  case $1 in
    rustle) echo "$RUSTLE_BIN" ;;
    haproxy) echo "$HAPROXY_BIN" ;;
    nginx) echo "$NGINX_BIN" ;;
    floor|floor-http) echo "$FLOOR_BIN" ;;
    *) return 1 ;;
  esac
}

# start_proxy NAME MODE: start NAME inside our cgroup (so every process it
# forks is accounted and capped), pinned to CPU 0.
start_proxy() {
  local name=$1 mode=$2 d=$WORK/$1
  mkdir -p "$d/logs"
  case $mode in
    full)   echo -1 > "$CG_CPU/cpu.cfs_quota_us" ;;
    capped) echo "$CAP_QUOTA_US" > "$CG_CPU/cpu.cfs_quota_us" ;;
    *) die "unknown cpu mode $mode" ;;
  esac
  local -a cmd
  case $name in
    rustle)  cmd=("$RUSTLE_BIN" --http "$PROXY_ADDR" --workers 1 --log off) ;;
    haproxy) write_haproxy_cfg "$d"; cmd=("$HAPROXY_BIN" -db -f "$d/haproxy.cfg") ;;
    nginx)   write_nginx_proxy_cfg "$d"; cmd=("$NGINX_BIN" -p "$d" -c "$d/nginx.conf" -e "$d/logs/error.log") ;;
    floor)   cmd=("$FLOOR_BIN" floor "$PROXY_ADDR" "$ORIGIN") ;;
    floor-http) cmd=("$FLOOR_BIN" floor "$PROXY_ADDR" "$ORIGIN" --http) ;;
    *) die "unknown proxy $name" ;;
  esac
  (
    echo "$BASHPID" > "$CG_CPU/cgroup.procs"
    [[ -n $CG_ACCT && $CG_ACCT != "$CG_CPU" ]] && echo "$BASHPID" > "$CG_ACCT/cgroup.procs"
    exec taskset -c "$PROXY_CPU" "${cmd[@]}"
  ) > "$d/logs/stdout" 2>&1 < /dev/null &
  PROXY_PID=$!
  if ! wait_listen "$PROXY_PORT" "$PROXY_PID"; then
    log "$name did not start listening; its output:"
    tail -n 20 "$d/logs/"* >&2 || true
    stop_proxy
    return 1
  fi
}

# check_proxy: status 200 and the exact 1 KB body through the proxy, with two
# requests on one kept-alive connection and once with Connection: close.
# Prints "ok" or a reason; returns non-zero on failure.
check_proxy() {
  local f=$WORK/check out
  rm -f "$f".*
  out=$(curl -sS --max-time 5 --proxy "http://$PROXY_ADDR" \
          -o "$f.1" "$TARGET" -o "$f.2" "$TARGET" \
          -w '%{http_code} %{size_download} %{num_connects}\n' 2>&1) \
    || { echo "curl failed: ${out//$'\n'/ }"; return 1; }
  if [[ $(echo "$out" | head -1) != "200 1024 1" || $(echo "$out" | sed -n 2p) != "200 1024 0" ]]; then
    echo "keep-alive check: got '${out//$'\n'/ | }' want '200 1024 1 | 200 1024 0'"; return 1
  fi
  cmp -s "$f.1" "$WORK/origin/www/1k" && cmp -s "$f.2" "$WORK/origin/www/1k" \
    || { echo "keep-alive check: body differs from origin"; return 1; }
  out=$(curl -sS --max-time 5 --proxy "http://$PROXY_ADDR" -H 'Connection: close' -D "$f.h" \
          -o "$f.3" "$TARGET" -w '%{http_code} %{size_download}' 2>&1) \
    || { echo "close check: curl failed: $out"; return 1; }
  [[ $out == "200 1024" ]] || { echo "close check: got '$out' want '200 1024'"; return 1; }
  cmp -s "$f.3" "$WORK/origin/www/1k" || { echo "close check: body differs"; return 1; }
  grep -qi '^connection:.*close' "$f.h" \
    || { echo "close check: response lacks 'Connection: close' (wrk would count read errors)"; return 1; }
  echo ok
}

# ------------------------------------------------------------ measurements
cpu_ticks() {  # cpu_ticks PID...: utime+stime summed (clock ticks)
  local pid stat rest sum=0
  for pid in "$@"; do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    rest=${stat##*) }                 # fields from 3 (state) on; comm may hold spaces
    read -r -a f <<< "$rest"
    sum=$(( sum + f[11] + f[12] ))    # field 14 utime, 15 stime
  done
  echo "$sum"
}
rss_hwm_kb() {  # rss_hwm_kb PID...: VmHWM summed (kB)
  local pid sum=0 v
  for pid in "$@"; do
    v=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    sum=$(( sum + ${v:-0} ))
  done
  echo "$sum"
}
origin_accepts() {  # connections the origin has accepted so far (stub_status), or -1
  curl -s --max-time 2 "http://$ORIGIN/_status" 2>/dev/null | awk 'NR==3 {print $1; f=1} END {if (!f) print -1}'
}
cpu_jiffies() {  # cpu_jiffies N: "busy total" jiffies of CPU N from /proc/stat
  awk -v c="cpu$1" '$1==c {t=0; for (i=2; i<=NF; i++) t+=$i; print t-$5-$6, t}' /proc/stat
}
busy_frac() {  # busy_frac "b0 t0" "b1 t1"
  awk -v a="$1" -v b="$2" 'BEGIN{split(a,x," "); split(b,y," "); d=y[2]-x[2]; printf "%.2f", (d>0?(y[1]-x[1])/d:0)}'
}
acct_ns() { [[ -n $CG_ACCT ]] && cat "$CG_ACCT/cpuacct.usage" || echo 0; }
load_ns() { [[ -n $CG_LOAD ]] && cat "$CG_LOAD/cpuacct.usage" || echo 0; }
throttle() { awk '$1=="nr_throttled"{n=$2} $1=="throttled_time"{t=$2} END{printf "%.0f %.0f\n", n, t}' "$CG_CPU/cpu.stat"; }

# run_wrk SECONDS SCENARIO URL OUTFILE
run_wrk() {
  local secs=$1 scen=$2 url=$3 out=$4 close=0
  [[ $scen == close ]] && close=1
  WRK_CLOSE=$close WRK_TARGET=$TARGET on_load_cpu "$WRK_BIN" \
    -t "$WRK_THREADS" -c "$CONNS" -d "${secs}s" --timeout 2s -s "$LUA" "$url" > "$out" 2>&1 || true
}

wrkjson() { grep -m1 '^WRKJSON ' "$1" | sed 's/^WRKJSON //'; }

# jget JSON KEY.PATH -> number (tiny extractor; avoids a jq dependency)
jget() {
  local json=$1 key=${2##*.} scope=${2%.*}
  [[ $scope != "$2" ]] && json=$(sed -n "s/.*\"$scope\":{\([^}]*\)}.*/\1/p" <<< "$json")
  sed -n "s/.*\"$key\":\([-0-9.e]*\).*/\1/p" <<< "$json" | head -1
}

# one_run NAME SCENARIO MODE REP: start, check, warm up, measure, record, stop
one_run() {
  local name=$1 scen=$2 mode=$3 rep=$4 url reason
  local t0 t1 a0 a1 o0 o1 th0 th1 pids rss json now oa0 oa1 c00 c01 c10 c11 l0 l1 w0 w1
  url=http://$PROXY_ADDR/
  if [[ $name == direct ]]; then
    url=http://$ORIGIN/
  else
    if ! start_proxy "$name" "$mode"; then
      echo "$name|$scen|$mode|rep $rep: did not start" >> "$SKIPS"; return 0
    fi
    if ! reason=$(check_proxy); then
      log "  $name pre-run check FAILED: $reason"
      echo "$name|$scen|$mode|rep $rep: pre-run check failed: $reason" >> "$SKIPS"
      stop_proxy; return 0
    fi
  fi
  local out=$WORK/wrk.$name.$scen.$mode.$rep
  [[ $WARMUP -gt 0 ]] && run_wrk "$WARMUP" "$scen" "$url" "$out.warm"
  pids=$(cg_pids)
  # shellcheck disable=SC2086
  oa0=$(origin_accepts)
  t0=$(cpu_ticks $pids); a0=$(acct_ns); o0=$(cpu_ticks "$ORIGIN_PID"); th0=$(throttle)
  c00=$(cpu_jiffies "$PROXY_CPU"); c10=$(cpu_jiffies "$LOAD_CPU"); l0=$(load_ns); w0=$(date +%s%N)
  now=$(date -Iseconds)
  run_wrk "$DURATION" "$scen" "$url" "$out"
  pids=$(cg_pids)
  # shellcheck disable=SC2086
  t1=$(cpu_ticks $pids); a1=$(acct_ns); o1=$(cpu_ticks "$ORIGIN_PID"); th1=$(throttle)
  c01=$(cpu_jiffies "$PROXY_CPU"); c11=$(cpu_jiffies "$LOAD_CPU"); l1=$(load_ns); w1=$(date +%s%N)
  oa1=$(origin_accepts)
  # shellcheck disable=SC2086
  rss=$(rss_hwm_kb $pids)
  local post="n/a" alive=1
  if [[ $name != direct ]]; then
    kill -0 "$PROXY_PID" 2>/dev/null || alive=0
    post=$(check_proxy) || log "  $name post-run check FAILED: $post"
    stop_proxy
  fi
  json=$(wrkjson "$out")
  if [[ -z $json ]]; then
    log "  wrk printed no summary for $name/$scen/$mode:"; tail -n 5 "$out" >&2
    echo "$name|$scen|$mode|rep $rep: wrk produced no summary" >> "$SKIPS"; return 0
  fi
  local req dur_us bytes p50 p99 econ erd ewr est eto errors cpu_s cpu_us rps seconds
  req=$(jget "$json" requests); dur_us=$(jget "$json" duration_us); bytes=$(jget "$json" bytes)
  p50=$(jget "$json" latency_us.p50); p99=$(jget "$json" latency_us.p99)
  econ=$(jget "$json" errors.connect); erd=$(jget "$json" errors.read)
  ewr=$(jget "$json" errors.write); est=$(jget "$json" errors.status); eto=$(jget "$json" errors.timeout)
  errors=$(( econ + erd + ewr + eto ))
  read -r seconds rps p50ms p99ms <<< "$(awk -v r="$req" -v d="$dur_us" -v a="$p50" -v b="$p99" \
     'BEGIN{s=d/1e6; printf "%.3f %.1f %.3f %.3f", s, (s>0?r/s:0), a/1e3, b/1e3}')"
  if [[ $name == direct ]]; then
    cpu_s=""; cpu_us=""; rss=""
  else
    read -r cpu_s cpu_us <<< "$(awk -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v r="$req" \
       'BEGIN{c=t/hz; printf "%.2f %.2f", c, (r>0?c*1e6/r:0)}')"
  fi
  local bpr acct_s b0 b1 oconn x0 x1
  b0=$(busy_frac "$c00" "$c01"); b1=$(busy_frac "$c10" "$c11")
  # other load = busy share of the CPU minus what our processes used there
  # (cpuacct, ns); > 0.10 means someone else's work ran on that CPU.
  read -r x0 x1 <<< "$(awk -v b0="$b0" -v b1="$b1" -v p=$((a1 - a0)) -v l=$((l1 - l0)) -v w=$((w1 - w0)) \
     -v hasacct="${CG_LOAD:+1}" 'BEGIN{ if (!hasacct || w <= 0) { print "-1 -1"; exit }
       x = b0 - p / w; y = b1 - l / w; printf "%.2f %.2f", (x < 0 ? 0 : x), (y < 0 ? 0 : y) }')"
  if [[ $TRIES_LEFT -gt 0 ]] && awk -v a="$x0" -v b="$x1" 'BEGIN{exit !(a > 0.10 || b > 0.10)}'; then
    log "  $name $scen $mode rep$rep: other processes used CPU (cpu0 $x0, cpu1 $x1): discarding, will retry"
    return 75
  fi
  echo "$now,$name,$scen,$mode,$rep,$req,$seconds,$rps,$p50ms,$p99ms,$errors,$est,$cpu_s,$cpu_us,$rss" >> "$CSV"
  # origin connections accepted per request (the first /_status read counts itself)
  oconn=$(awk -v a="$oa0" -v b="$oa1" -v r="$req" 'BEGIN{printf "%.4f", (a<0||r==0) ? -1 : (b-a-1)/r}')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$scen" "$mode" "$b0" "$b1" "$oconn" "$x0" "$x1" >> "$EXTRA"
  bpr=$(awk -v b="$bytes" -v r="$req" 'BEGIN{printf "%.1f", (r>0?b/r:0)}')
  acct_s=$(awk -v a=$((a1 - a0)) 'BEGIN{printf "%.4f", a/1e9}')
  printf '{"date":"%s","proxy":"%s","scenario":"%s","cpu_mode":"%s","rep":%s,"wrk":%s,"bytes_per_req":%s,"proxy_cpu_ticks":%s,"clk_tck":%s,"cpuacct_s":%s,"origin_cpu_s":%s,"throttled_periods":%s,"throttled_ms":%s,"proxy_pids":"%s","rss_kb":"%s","proxy_alive_after":%s,"post_check":"%s","proxy_cpu_busy":%s,"load_cpu_busy":%s,"origin_conns_per_req":%s,"other_load_cpu0":%s,"other_load_cpu1":%s}\n' \
    "$now" "$name" "$scen" "$mode" "$rep" "$json" "$bpr" $((t1 - t0)) "$CLK_TCK" "$acct_s" \
    "$(awk -v t=$((o1 - o0)) -v hz="$CLK_TCK" 'BEGIN{printf "%.2f", t/hz}')" \
    "$(( ${th1% *} - ${th0% *} ))" "$(( (${th1#* } - ${th0#* }) / 1000000 ))" \
    "$(echo $pids)" "$rss" "$alive" "${post//\"/\'}" "$b0" "$b1" "$oconn" "$x0" "$x1" >> "$JSONL"
  local flag=""
  [[ $errors -gt 0 || $est -gt 0 ]] && flag="  <-- errors=$errors non2xx=$est"
  awk -v b="$bpr" 'BEGIN{exit !(b < 1024)}' && flag="$flag  <-- only $bpr bytes/response"
  [[ $alive == 0 ]] && flag="$flag  <-- PROXY DIED"
  awk -v a="$x0" -v b="$x1" 'BEGIN{exit !(a > 0.10 || b > 0.10)}' && flag="$flag  <-- NOISY: other load cpu0 $x0 cpu1 $x1"
  [[ $post != ok && $post != n/a ]] && flag="$flag  <-- post-check: $post"
  log "  $(printf '%-7s %-5s %-6s rep%s: %9s req/s  p50 %7s ms  p99 %7s ms  cpu %5s us/req  rss %6s kB' \
        "$name" "$scen" "$mode" "$rep" "$rps" "$p50ms" "$p99ms" "${cpu_us:--}" "${rss:--}")$flag"
}

# measure: one_run with retries when other processes disturbed the run
# (RETRY_NOISY [2] extra tries, each after waiting up to WAIT_IDLE [60] s for
# a quiet machine); the last try is recorded whatever happens, flagged.
TRIES_LEFT=0
measure() {
  local rc
  TRIES_LEFT=${RETRY_NOISY:-2}
  while :; do
    rc=0; one_run "$@" || rc=$?
    [[ $rc == 75 ]] || return 0
    TRIES_LEFT=$(( TRIES_LEFT - 1 ))
    wait_quiet "${WAIT_IDLE:-60}" || true
  done
}

# ------------------------------------------------------- syscalls (STRACE=1)
syscall_pass() {
  local name=$1 scen=$2 dir=$OUT-syscalls pids plist perfpid stpid json req p t i
  mkdir -p "$dir"
  start_proxy "$name" full || return 0
  if ! check_proxy >/dev/null; then stop_proxy; return 0; fi
  run_wrk 1 "$scen" "http://$PROXY_ADDR/" "$WORK/sc.warm"
  pids=$(cg_pids); plist=$(echo $pids | tr ' ' ,)
  local base=$dir/$name-$scen
  # 1) perf: syscall tracepoints, cheap enough not to change the picture.
  if perf stat -e raw_syscalls:sys_enter true >/dev/null 2>&1; then
    local ev="raw_syscalls:sys_enter" s
    for s in read write readv writev recvfrom sendto recvmsg sendmsg epoll_wait epoll_pwait epoll_ctl \
             accept4 close shutdown connect socket setsockopt getsockopt ioctl futex sched_yield \
             io_uring_enter splice; do
      [[ -d /sys/kernel/tracing/events/syscalls/sys_enter_$s || -d /sys/kernel/debug/tracing/events/syscalls/sys_enter_$s ]] \
        && ev="$ev,syscalls:sys_enter_$s"
    done
    perf stat -x, -e "$ev" -p "$plist" -o "$base.perf" & perfpid=$!
    AUX_PIDS+=("$perfpid")
    sleep 0.5
    run_wrk "$STRACE_SECS" "$scen" "http://$PROXY_ADDR/" "$base.perf.wrk"
    kill -INT "$perfpid" 2>/dev/null || true; wait "$perfpid" 2>/dev/null || true
    json=$(wrkjson "$base.perf.wrk"); req=$(jget "$json" requests)
    awk -F, -v r="$req" -v who="$name/$scen" '
      $3 ~ /sys_enter/ && $1 ~ /^[0-9]+$/ {
        ev=$3; sub(/.*sys_enter_?/, "", ev); if (ev=="") ev="ALL";
        if (ev=="ALL") tot=$1; else if ($1>0) part[ev]=$1 }
      END { printf "perf    %-14s %8d req  %6.2f syscalls/req  (", who, r, (r?tot/r:0);
            for (e in part) printf " %s=%.2f", e, part[e]/r; print " )" }' "$base.perf" \
      | tee "$base.perf.summary"
  fi
  # 2) strace -c -f: per-syscall breakdown (slows the proxy a lot).
  if command -v strace >/dev/null; then
    local -a pargs=()
    for p in $pids; do pargs+=(-p "$p"); done
    strace -c -f -qq -o "$base.strace" "${pargs[@]}" & stpid=$!
    AUX_PIDS+=("$stpid")
    # wait until strace is attached to every thread of every proxy process
    for i in $(seq 100); do
      t=0
      for p in $pids; do
        for st in /proc/"$p"/task/*/status; do
          awk '/^TracerPid:/ {exit ($2 == 0)}' "$st" 2>/dev/null || t=1
        done
      done
      [[ $t == 0 ]] && break
      sleep 0.1
    done
    run_wrk "$STRACE_SECS" "$scen" "http://$PROXY_ADDR/" "$base.strace.wrk"
    kill -INT "$stpid" 2>/dev/null || true; wait "$stpid" 2>/dev/null || true
    json=$(wrkjson "$base.strace.wrk"); req=$(jget "$json" requests)
    awk -v r="$req" -v who="$name/$scen" '
      $NF=="total" { tot=$4 }
      $NF ~ /^[a-z_0-9]+$/ && $NF!="total" && $4 ~ /^[0-9]+$/ { part[$NF]=$4 }
      END { printf "strace  %-14s %8d req  %6.2f syscalls/req  (", who, r, (r?tot/r:0);
            for (e in part) if (part[e]/r >= 0.01) printf " %s=%.2f", e, part[e]/r; print " )" }' "$base.strace" \
      | tee "$base.strace.summary"
  fi
  stop_proxy
}

# ------------------------------------------------------------------ summary
summarize() {
  awk -F, -v skips="$SKIPS" -v extra="$EXTRA" '
    function median(key,   n, i, j, t, a) {
      n = cnt[key]; for (i = 1; i <= n; i++) a[i] = val[key, i]
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
      if (n == 0) return ""
      return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
    }
    function add(k, v) { cnt[k]++; val[k, cnt[k]] = v + 0 }
    FILENAME == extra { split($0, x, "\t"); h = x[1] SUBSEP x[2] SUBSEP x[3]
                        add(h SUBSEP "b0", x[4]); add(h SUBSEP "b1", x[5]); add(h SUBSEP "oc", x[6])
                        if (x[7] > 0.10 || x[8] > 0.10) noisy[h]++; next }
    FNR == 1 { next }
    {
      g = $2 SUBSEP $3 SUBSEP $4
      if (!(g in seen)) { seen[g] = 1; order[++ng] = g }
      add(g SUBSEP "rps", $8); add(g SUBSEP "p50", $9); add(g SUBSEP "p99", $10)
      add(g SUBSEP "cpu", $14); add(g SUBSEP "rss", $15)
      add(g SUBSEP "util", ($7 > 0 ? $13 / $7 : 0))
      err[g] += $11; non2xx[g] += $12; n[g]++
    }
    END {
      print "| proxy | scenario | cpu mode | runs | req/s | p50 ms | p99 ms | cpu µs/req | proxy cpu util | peak RSS MB | errors | non-2xx | CPU0 busy | CPU1 busy | origin conns/req | noisy runs |"
      print "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      for (i = 1; i <= ng; i++) {
        g = order[i]; split(g, k, SUBSEP)
        isd = (k[1] == "direct")
        R[g] = median(g SUBSEP "rps"); C[g] = median(g SUBSEP "cpu")
        printf "| %s | %s | %s | %d | %.0f | %.3f | %.3f | %s | %s | %s | %d | %d | %.2f | %.2f | %.3f | %d |\n", k[1], k[2], k[3], n[g],
          R[g], median(g SUBSEP "p50"), median(g SUBSEP "p99"),
          isd ? "-" : sprintf("%.2f", C[g]), isd ? "-" : sprintf("%.2f", median(g SUBSEP "util")),
          isd ? "-" : sprintf("%.1f", median(g SUBSEP "rss") / 1024), err[g], non2xx[g],
          median(g SUBSEP "b0"), median(g SUBSEP "b1"), median(g SUBSEP "oc"), noisy[g]
      }
      print ""
      print "rustle / best-of(haproxy, nginx), medians (req/s: >1 is better; cpu µs/req: <1 is better):"
      print ""
      print "| scenario | cpu mode | rustle req/s | best peer req/s | ratio | rustle cpu µs/req | best peer cpu µs/req | ratio |"
      print "|---|---|---:|---:|---:|---:|---:|---:|"
      for (i = 1; i <= ng; i++) {
        g = order[i]; split(g, k, SUBSEP)
        if (k[1] != "rustle") continue
        br = ""; bc = ""; brn = ""; bcn = ""
        for (j = 1; j <= ng; j++) {
          h = order[j]; split(h, m, SUBSEP)
          if ((m[1] != "haproxy" && m[1] != "nginx") || m[2] != k[2] || m[3] != k[3]) continue
          if (br == "" || R[h] > br) { br = R[h]; brn = m[1] }
          if (bc == "" || C[h] < bc) { bc = C[h]; bcn = m[1] }
        }
        if (br == "") { printf "| %s | %s | %.0f | (no peer) | - | %.2f | (no peer) | - |\n", k[2], k[3], R[g], C[g]; continue }
        printf "| %s | %s | %.0f | %.0f (%s) | %.2f | %.2f | %.2f (%s) | %.2f |\n", k[2], k[3],
          R[g], br, brn, (br > 0 ? R[g] / br : 0), C[g], bc, bcn, (bc > 0 ? C[g] / bc : 0)
      }
      ns = 0
      while ((getline line < skips) > 0) { if (!ns++) { print ""; print "Skipped:" } print "- " line }
    }' "$EXTRA" "$CSV"
}

write_env() {
  {
    echo "# conditions for $CSV"
    echo "date=$(date -Iseconds)"
    echo "host_cpu_model=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)"
    echo "nproc=$(nproc --all)"
    echo "kernel=$(uname -srmv)"
    echo "os=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
    echo "clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null || echo ?)"
    echo "governor=$(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo n/a)"
    echo "nginx=$("$NGINX_BIN" -v 2>&1 | head -1)"
    echo "haproxy=$([[ -x $HAPROXY_BIN ]] && "$HAPROXY_BIN" -v 2>&1 | head -1 || echo missing)"
    echo "wrk=$("$WRK_BIN" -v 2>&1 | head -1 | sed 's/ Copyright.*//')"
    echo "curl=$(curl --version | head -1)"
    echo "rustle_bin=${RUSTLE_SRC:-$RUSTLE_BIN} (run from a private copy)"
    echo "floor_bin=${FLOOR_SRC:-$FLOOR_BIN} (rustle-bench floor; used when PROXIES names floor or floor-http)"
    if [[ -x $RUSTLE_BIN ]]; then
      echo "rustle_version=$("$RUSTLE_BIN" --version 2>&1 | head -1)"
      echo "rustle_sha256=$(sha256sum "$RUSTLE_BIN" | cut -d' ' -f1)"
      echo "rustle_mtime=$(date -Iseconds -r "${RUSTLE_SRC:-$RUSTLE_BIN}")"
    else
      echo "rustle_version=missing"
    fi
    echo "rustle_git_rev=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo 'none (no commit yet)')"
    echo "rustle_git_dirty_files=$(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l)"
    echo "rustc=$(rustc --version 2>/dev/null || echo ?)"
    for s in net.ipv4.ip_local_port_range net.ipv4.tcp_tw_reuse net.core.somaxconn net.ipv4.tcp_max_syn_backlog; do
      echo "$s=$(sysctl -n "$s" 2>/dev/null | tr '\t' ' ')"
    done
    echo "ulimit_n=$(ulimit -n)"
    echo "knobs: QUICK=$QUICK DURATION=$DURATION REPS=$REPS WARMUP=$WARMUP CONNS=$CONNS WRK_THREADS=$WRK_THREADS PROXIES='$PROXIES' SCENARIOS='$SCENARIOS' MODES='$MODES' BASELINE=$BASELINE STRACE=$STRACE"
    echo "pinning: proxy cpu $PROXY_CPU; wrk + origin cpu $LOAD_CPU; capped = cfs_quota $CAP_QUOTA_US / period $CAP_PERIOD_US us"
    echo "load average at start: $(cat /proc/loadavg)"
  } > "$ENVF"
}

append_configs() {
  {
    echo; echo "# ---- skipped ----"; cat "$SKIPS"
    echo; echo "# ---- origin nginx.conf ----"; cat "$WORK/origin/nginx.conf"
    [[ -f $WORK/haproxy/haproxy.cfg ]] && { echo; echo "# ---- haproxy.cfg ----"; cat "$WORK/haproxy/haproxy.cfg"; }
    [[ -f $WORK/nginx/nginx.conf ]] && { echo; echo "# ---- proxy nginx.conf ----"; cat "$WORK/nginx/nginx.conf"; }
    echo; echo "# ---- rustle command ----"
    echo "$RUSTLE_BIN --http $PROXY_ADDR --workers 1 --log off"
  } >> "$ENVF"
}

# A benchmark on a busy machine measures the other load. Before starting,
# wait up to WAIT_IDLE s for both CPUs to be < 10% busy; warn if they never are.
QUIET_NOTE=""
IDLE_X=""; IDLE_Y=""
wait_quiet() {  # wait_quiet MAXSECS: 0 once both CPUs are < 10% busy for 1 s; origin idle counts
  local deadline=$(( SECONDS + $1 )) a0 a1 b0 b1 said=0
  while :; do
    a0=$(cpu_jiffies "$PROXY_CPU"); b0=$(cpu_jiffies "$LOAD_CPU"); sleep 1
    a1=$(cpu_jiffies "$PROXY_CPU"); b1=$(cpu_jiffies "$LOAD_CPU")
    IDLE_X=$(busy_frac "$a0" "$a1"); IDLE_Y=$(busy_frac "$b0" "$b1")
    awk -v x="$IDLE_X" -v y="$IDLE_Y" 'BEGIN{exit !(x < 0.10 && y < 0.10)}' && return 0
    [[ $SECONDS -lt $deadline ]] || return 1
    [[ $said == 1 ]] || log "machine busy (cpu$PROXY_CPU $IDLE_X, cpu$LOAD_CPU $IDLE_Y): waiting up to $1 s for quiet"
    said=1
  done
}
quiet_check() {
  if ! wait_quiet "${WAIT_IDLE:-60}"; then
    QUIET_NOTE="WARNING: machine not idle before the run (CPU $PROXY_CPU busy $IDLE_X, CPU $LOAD_CPU busy $IDLE_Y): see the noisy-runs column"
    log "$QUIET_NOTE"
  fi
  {
    echo "idle_check: cpu$PROXY_CPU busy $IDLE_X, cpu$LOAD_CPU busy $IDLE_Y (1 s sample before the first run)"
    echo "# top processes at start:"
    ps -eo pid,pcpu,etime,comm --sort=-pcpu | head -8
  } >> "$ENVF"
}

# --------------------------------------------------------------------- main
AVAIL=()
for p in $PROXIES; do
  b=$(proxy_bin "$p") || { echo "$p: unknown proxy name" >> "$SKIPS"; log "skip $p: unknown"; continue; }
  if [[ ! -x $b ]]; then
    echo "$p: binary not found: $b" >> "$SKIPS"; log "skip $p: binary not found: $b"; continue
  fi
  AVAIL+=("$p")
done
[[ ${#AVAIL[@]} -gt 0 ]] || die "no proxy to benchmark"

# Run a private copy of rustle: target/ may be rebuilt while we measure.
if [[ " ${AVAIL[*]} " == *" rustle "* ]]; then
  cp "$RUSTLE_BIN" "$WORK/rustle-bin"; RUSTLE_SRC=$RUSTLE_BIN; RUSTLE_BIN=$WORK/rustle-bin
fi
if [[ " ${AVAIL[*]} " == *" floor"* ]]; then
  cp "$FLOOR_BIN" "$WORK/floor-bin"; FLOOR_SRC=$FLOOR_BIN; FLOOR_BIN=$WORK/floor-bin
fi
write_env
quiet_check
start_origin
nruns=$(( REPS * ${#AVAIL[@]} * $(wc -w <<< "$SCENARIOS") * $(wc -w <<< "$MODES") ))
[[ $BASELINE == 1 ]] && nruns=$(( nruns + $(wc -w <<< "$SCENARIOS") ))
log "origin up (pid $ORIGIN_PID); $nruns runs of ${DURATION}s (+${WARMUP}s warm-up), ETA ~$(( nruns * (DURATION + WARMUP + 1) / 60 + 1 )) min"
log "proxies: ${AVAIL[*]}; results: $CSV"

# Startup check per proxy: a proxy that cannot serve /1k correctly is skipped
# as a whole rather than measured.
OK=()
for p in "${AVAIL[@]}"; do
  if start_proxy "$p" full; then
    if r=$(check_proxy); then OK+=("$p"); else echo "$p: startup check failed: $r" >> "$SKIPS"; log "skip $p: $r"; fi
    stop_proxy
  else
    echo "$p: failed to start (see $WORK/$p/logs)" >> "$SKIPS"; log "skip $p: failed to start"
  fi
done
[[ ${#OK[@]} -gt 0 ]] || die "no proxy passed its startup check"

if [[ $BASELINE == 1 ]]; then
  log "baseline: wrk -> origin directly (the ceiling CPU $LOAD_CPU allows)"
  for s in $SCENARIOS; do measure direct "$s" none 1; done
fi

n=${#OK[@]}
for (( rep = 1; rep <= REPS; rep++ )); do
  order=()
  for (( i = 0; i < n; i++ )); do order+=("${OK[$(( (i + rep - 1) % n ))]}"); done
  log "rep $rep/$REPS: order ${order[*]}"
  for p in "${order[@]}"; do
    for m in $MODES; do
      for s in $SCENARIOS; do measure "$p" "$s" "$m" "$rep"; done
    done
  done
done

if [[ $STRACE == 1 ]]; then
  log "syscall pass (full mode, ${STRACE_SECS}s each): $OUT-syscalls/"
  for p in "${OK[@]}"; do for s in $SCENARIOS; do syscall_pass "$p" "$s"; done; done
fi

append_configs
{
  echo "# http-core $STAMP"
  echo
  [[ -n $QUIET_NOTE ]] && { echo "**$QUIET_NOTE**"; echo; }
  echo "wrk -t$WRK_THREADS -c$CONNS -d${DURATION}s, warm-up ${WARMUP}s, $REPS rep(s); medians. Proxy on CPU $PROXY_CPU; wrk + origin on CPU $LOAD_CPU; capped = ${CAP_QUOTA_US}/${CAP_PERIOD_US} us CFS quota."
  echo "errors = wrk socket errors (connect+read+write+timeout), summed over runs; non-2xx = wrk status errors (>= 400), summed."
  echo "proxy cpu util = proxy CPU seconds / wall seconds (1.00 = the proxy saturates its core, 0.50 = the capped quota)."
  echo "CPU0 busy = share of CPU $PROXY_CPU busy (the proxy's core; well above 'proxy cpu util' = something else ran there)."
  echo "CPU1 busy = share of CPU $LOAD_CPU (wrk + origin) busy during the run: near 1.00 means the load side, not the proxy, set the pace."
  echo "origin conns/req = new origin connections per request (0 = the proxy reuses its upstream connections)."
  echo "noisy runs = runs where processes other than ours used > 10% of CPU 0 or CPU 1 (distorted; rerun on a quiet machine)."
  echo
  summarize
  if [[ $STRACE == 1 ]] && compgen -G "$OUT-syscalls/*.summary" >/dev/null; then
    echo; echo "Syscalls per request (full mode, ${STRACE_SECS}s):"; echo; echo '```'
    cat "$OUT-syscalls/"*.summary; echo '```'
  fi
} > "$MD"
echo
cat "$MD"
log "done: $CSV $JSONL $MD $ENVF"
