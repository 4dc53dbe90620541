#!/usr/bin/env bash
# =============================================================================
# bench/kernel-forwarding.sh — what a tunnelled exchange costs the whole machine
#                              with rustle's in-kernel forwarding, its relay
#                              (splice/copy), the peers and the bare floor.
# =============================================================================
#
# WHAT IT MEASURES
#   rustle-bench load --> PROXY --> rustle-bench origin, on loopback in a network
#   namespace of its own. With in-kernel forwarding the kernel moves a tunnel's
#   bytes in the sender's context (softirq, a kworker), so the proxy's own CPU
#   time says little: each run reads the busy time of every core from
#   /proc/stat over the measured window, and the same load with no proxy in the
#   path (`none`: the load generator straight to the origin) is measured too.
#
#     machine µs/exchange  = busy time of all cores / exchanges completed
#     path µs/exchange     = machine µs/exchange - none's (same repetition)
#     proxy µs/exchange    = the proxy's own utime+stime / exchanges
#
#   Scenarios (LOADS):
#     connect-ka-1k  CONNECT tunnels, 64 kept-alive connections, 1 KB answers
#     socks-ka-1k    SOCKS5 tunnels, the same exchanges
#     relay-ka-1k    the TCP relay to the origin, the same exchanges
#     relay-stream1  one connection downloading 1 GiB bodies again and again
#   The small exchanges run at a fixed RATE (open loop), so every proxy handles
#   the same load and CPU per exchange compares; the stream runs flat out and
#   reports CPU seconds per GB (machine and proxy).
#
#   Proxies (PROXIES), each only where it has the path:
#     kernel   rustle, [relay] kernel_forwarding = "require"
#     relay    rustle, [relay] kernel_forwarding = "off" (splice/copy engine)
#     floor    rustle-bench floor: copies bytes and does nothing else (relay)
#     squid    CONNECT;  dante: SOCKS5;  haproxy, haproxy-splice: relay
#     none     no proxy (the baseline)
#   Every proxy runs with one worker/thread/process (rustle --workers 1
#   --log off) pinned to CPU PROXY_CPU; the load and the origin to LOAD_CPU.
#   Repetitions alternate the proxies, the order reversed every other one.
#
# HOW TO RUN (as root: network namespace, and the kernel path needs CAP_BPF)
#   cargo build --release -p rustle -p rustle-bench
#   bench/kernel-forwarding.sh
#   REPS=3 LOADS="connect-ka-1k" PROXIES="none kernel relay squid" bench/kernel-forwarding.sh
#
#   Environment knobs (defaults in brackets):
#     REPS [5]  DURATION [8] (s)  WARMUP [1] (s)  RATE [10000] req/s  CONNS [64]
#     LOADS   [connect-ka-1k socks-ka-1k relay-ka-1k relay-stream1]
#     PROXIES [none kernel relay floor squid dante haproxy haproxy-splice]
#     PROXY_CPU [1]  LOAD_CPU [0]
#     RUSTLE_BIN, BENCH_BIN [target/release/...]  RESULTS_DIR [bench/results]
#
# OUTPUT (STAMP = UTC date-time of the start)
#   RESULTS_DIR/kernel-forwarding-STAMP.csv  one row per run
#   RESULTS_DIR/kernel-forwarding-STAMP.md   conditions and summary (also printed)
#
# SAFETY
#   Loopback only, in a network namespace of its own (unshare -n). Every process
#   started here is stopped by its PID on EXIT, INT and TERM; the scratch
#   directory is removed.
# =============================================================================
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    *) echo "kernel-forwarding.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

REPS=${REPS:-5}
DURATION=${DURATION:-8}
WARMUP=${WARMUP:-1}
RATE=${RATE:-10000}
CONNS=${CONNS:-64}
LOADS=${LOADS:-connect-ka-1k socks-ka-1k relay-ka-1k relay-stream1}
PROXIES=${PROXIES:-none kernel relay floor squid dante haproxy haproxy-splice}
PROXY_CPU=${PROXY_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
RUSTLE_BIN=${RUSTLE_BIN:-$ROOT/target/release/rustle}
BENCH_BIN=${BENCH_BIN:-$ROOT/target/release/rustle-bench}
RESULTS_DIR=${RESULTS_DIR:-$HERE/results}
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[kernel-forwarding %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -x $RUSTLE_BIN ]] || die "missing $RUSTLE_BIN (cargo build --release -p rustle)"
[[ -x $BENCH_BIN ]] || die "missing $BENCH_BIN (cargo build --release -p rustle-bench)"
for t in taskset ss python3 getconf unshare; do command -v "$t" >/dev/null || die "missing tool: $t"; done

if [[ ${KF_IN_NS:-0} != 1 ]]; then
  [[ $(id -u) == 0 ]] || die "needs root (a network namespace, and CAP_BPF for the kernel path)"
  exec unshare -n -- env KF_IN_NS=1 bash "${BASH_SOURCE[0]}"
fi
ip link set lo up || die "cannot bring up lo in the namespace"

WORK=$(mktemp -d /tmp/kernel-forwarding.XXXXXX)
PIDS=()
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
cleanup() { stop_all; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cp "$RUSTLE_BIN" "$WORK/rustle"
cp "$BENCH_BIN" "$WORK/rustle-bench"
RUSTLE=$WORK/rustle
BENCH=$WORK/rustle-bench

# busy_ticks: busy clock ticks of all cores (everything but idle and iowait).
busy_ticks() {
  awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

STAMP=$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
CSV=$RESULTS_DIR/kernel-forwarding-$STAMP.csv
MD=$RESULTS_DIR/kernel-forwarding-$STAMP.md
echo "stamp,load,proxy,rep,order,duration_s,completed,bytes,errors,rate_per_s,gbit_per_s,machine_cpu_s,proxy_cpu_s,machine_us_per_req,proxy_us_per_req,machine_s_per_gb,proxy_s_per_gb,p50_us,p99_us,kernel_tunnels" > "$CSV"

ORIGIN_PORT=$(free_port)
ORIGIN=127.0.0.1:$ORIGIN_PORT
taskset -c "$LOAD_CPU" "$BENCH" origin --listen "$ORIGIN" > "$WORK/origin.out" 2> "$WORK/origin.err" &
ORIGIN_PID=$!
PIDS+=("$ORIGIN_PID")
wait_listening "$ORIGIN_PID" "$ORIGIN_PORT" origin

# path_of LOAD: the load generator's mode.
mode_of() {
  case $1 in
    connect-*) echo connect ;;
    socks-*) echo socks5 ;;
    relay-*) echo relay ;;
  esac
}

# supports PROXY MODE: whether the proxy has that path.
supports() {
  case $1:$2 in
    none:*|kernel:*|relay:*) return 0 ;;
    floor:relay|haproxy:relay|haproxy-splice:relay) return 0 ;;
    squid:connect|dante:socks5) return 0 ;;
    *) return 1 ;;
  esac
}

# start_proxy PROXY MODE PORT: starts it pinned to PROXY_CPU; prints its PID.
start_proxy() {
  local proxy=$1 mode=$2 port=$3 listen=127.0.0.1:$3 flag conf
  case $mode in
    connect) flag=--http=$listen ;;
    socks5) flag=--socks=$listen ;;
    relay) flag=--relay=$listen=$ORIGIN ;;
  esac
  case $proxy in
    kernel|relay)
      conf=$WORK/$proxy.toml
      local kf=require
      [[ $proxy == relay ]] && kf=off
      printf '[relay]\nkernel_forwarding = "%s"\n' "$kf" > "$conf"
      taskset -c "$PROXY_CPU" "$RUSTLE" --config "$conf" "$flag" --workers 1 --log off \
        > "$WORK/proxy.out" 2> "$WORK/proxy.err" & ;;
    floor)
      taskset -c "$PROXY_CPU" "$BENCH" floor "$listen" "$ORIGIN" > "$WORK/proxy.out" 2> "$WORK/proxy.err" & ;;
    squid)
      sed -e "s|@listen@|$listen|" -e "s|@dir@|$WORK|" "$HERE/peers/squid.conf" > "$WORK/squid.conf"
      taskset -c "$PROXY_CPU" squid -N -f "$WORK/squid.conf" > "$WORK/proxy.out" 2> "$WORK/proxy.err" & ;;
    dante)
      sed -e "s|@ip@|127.0.0.1|" -e "s|@port@|$port|" -e "s|@external@|127.0.0.1|" \
        "$HERE/peers/danted.conf" > "$WORK/danted.conf"
      taskset -c "$PROXY_CPU" danted -f "$WORK/danted.conf" -N 1 -p "$WORK/danted.pid" \
        > "$WORK/proxy.out" 2> "$WORK/proxy.err" & ;;
    haproxy|haproxy-splice)
      local splice=""
      [[ $proxy == haproxy-splice ]] && splice="    option splice-auto"
      sed -e "s|@listen@|$listen|" -e "s|@origin@|$ORIGIN|" -e "s|@splice@|$splice|" \
        "$HERE/peers/haproxy-tcp.cfg" > "$WORK/haproxy.cfg"
      taskset -c "$PROXY_CPU" haproxy -db -f "$WORK/haproxy.cfg" > "$WORK/proxy.out" 2> "$WORK/proxy.err" & ;;
  esac
  echo $!
}

# tree_ticks PID: utime+stime of PID and its children (dante forks).
tree_ticks() {
  local total=0 p
  for p in $1 $(pgrep -P "$1" 2>/dev/null); do total=$((total + $(cpu_ticks "$p"))); done
  echo "$total"
}

run_one() {  # run_one LOAD PROXY REP ORDER
  local load=$1 proxy=$2 rep=$3 order=$4 mode port pid="" target args=() b0 b1 p0=0 p1=0 kt=""
  mode=$(mode_of "$load")
  port=$(free_port)
  if [[ $proxy == none ]]; then
    args=(--mode direct)
  else
    pid=$(start_proxy "$proxy" "$mode" "$port")
    PIDS+=("$pid")
    wait_listening "$pid" "$port" proxy
    args=(--mode "$mode" --proxy "127.0.0.1:$port")
  fi
  case $load in
    *-ka-1k) args+=(--connections "$CONNS" --rate "$RATE" --path /bytes/1024) ;;
    relay-stream1) args+=(--connections 1 --path /bytes/1073741824) ;;
  esac
  taskset -c "$LOAD_CPU" "$BENCH" load --json --target "$ORIGIN" "${args[@]}" \
    --duration "${DURATION}s" --warmup "${WARMUP}s" > "$WORK/load.json" 2> "$WORK/load.err" &
  local lpid=$!
  PIDS+=("$lpid")
  sleep "$WARMUP"
  b0=$(busy_ticks); [[ -n $pid ]] && p0=$(tree_ticks "$pid")
  local t0=$EPOCHREALTIME
  wait "$lpid" || log "load exited with an error: $(tail -1 "$WORK/load.err")"
  local t1=$EPOCHREALTIME
  b1=$(busy_ticks); [[ -n $pid ]] && p1=$(tree_ticks "$pid")
  if [[ $proxy == kernel ]]; then
    kt=$(grep -c "kernel forwarding: on" "$WORK/proxy.err" || true)
  fi
  [[ -n $pid ]] && stop_pid "$pid"
  python3 - "$WORK/load.json" "$STAMP" "$load" "$proxy" "$rep" "$order" $((b1 - b0)) $((p1 - p0)) "$CLK_TCK" "$t0" "$t1" "$kt" >> "$CSV" <<'EOF'
import json, sys
f, stamp, load, proxy, rep, order, bt, pt, hz, t0, t1, kt = sys.argv[1:]
try:
    d = json.load(open(f))
except Exception:
    d = {"completed": 0, "bytes": 0, "errors": {"total": -1}, "duration_s": 0, "rate_per_s": 0, "latency_us": {}}
# The busy ticks cover the wall time between the two reads; the exchanges, the load's
# measured window: scale the ticks to that window.
wall = float(t1) - float(t0)
dur = d.get("duration_s") or 0
scale = dur / wall if wall > 0 and dur else 1
mc, pc = int(bt) / int(hz) * scale, int(pt) / int(hz) * scale
n, b = d.get("completed", 0), d.get("bytes", 0)
per = lambda c: f"{c * 1e6 / n:.2f}" if n else ""
gb = lambda c: f"{c / (b / 1e9):.3f}" if b else ""
gbit = f"{b * 8 / 1e9 / dur:.2f}" if dur else ""
lat = d.get("latency_us") or {}
print(",".join(str(x) for x in [stamp, load, proxy, rep, order, f"{dur:.3f}", n, b,
      d["errors"]["total"], f"{d.get('rate_per_s', 0):.0f}", gbit, f"{mc:.3f}", f"{pc:.3f}",
      per(mc), per(pc), gb(mc), gb(pc), lat.get("p50", ""), lat.get("p99", ""), kt]))
EOF
  log "$(tail -1 "$CSV")"
}

for rep in $(seq "$REPS"); do
  for load in $LOADS; do
    list=()
    for p in $PROXIES; do supports "$p" "$(mode_of "$load")" && list+=("$p"); done
    if (( rep % 2 == 0 )); then
      for (( i = ${#list[@]} - 1, j = 0; i >= 0; i--, j++ )); do rev[j]=${list[i]}; done
      list=("${rev[@]}")
      unset rev
    fi
    i=0
    for p in "${list[@]}"; do
      i=$((i + 1))
      prog=${p%-splice}
      [[ $prog == dante ]] && prog=danted
      command -v "$prog" >/dev/null 2>&1 || [[ $p == none || $p == kernel || $p == relay || $p == floor ]] \
        || { log "skipped $p: not installed"; continue; }
      run_one "$load" "$p" "$rep" "$i"
    done
  done
done

{
  echo "# kernel-forwarding $STAMP (UTC)"
  echo
  echo "- cpu: $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo) x $(nproc --all)"
  echo "- kernel: $(uname -r)"
  echo "- rustle: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), binary $RUSTLE_BIN (sha256 $(sha256sum "$RUSTLE_BIN" | cut -c1-16))"
  echo "- proxy: one worker/thread, taskset -c $PROXY_CPU; load and origin: taskset -c $LOAD_CPU; loopback in a namespace of its own"
  echo "- small exchanges: $CONNS kept-alive connections, 1 KB answers, $RATE requests/s (open loop); stream: one connection, 1 GiB bodies, flat out"
  echo "- ${DURATION}s measured after ${WARMUP}s warmup, $REPS repetitions, proxies alternated (order reversed every other repetition)"
  echo "- machine CPU: busy time of all cores from /proc/stat over the window; path = machine - none's of the same repetition"
  echo
  python3 - "$CSV" <<'EOF'
import csv, sys, statistics as st
from collections import defaultdict
rows = list(csv.DictReader(open(sys.argv[1])))
by = defaultdict(lambda: defaultdict(dict))
for r in rows:
    by[r["load"]][int(r["rep"])][r["proxy"]] = r
def med(v):
    return f"{st.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-"
for load, reps in by.items():
    stream = load.endswith("stream1")
    proxies = []
    for rr in reps.values():
        for p in rr:
            if p not in proxies:
                proxies.append(p)
    print(f"## {load}")
    print()
    if stream:
        print("| proxy | Gbit/s | machine s/GB | path s/GB (minus none) | proxy s/GB | errors |")
        print("| :-- | --: | --: | --: | --: | --: |")
    else:
        print("| proxy | req/s | machine µs/exchange | path µs/exchange (minus none) | proxy µs/exchange | p99 µs | errors |")
        print("| :-- | --: | --: | --: | --: | --: | --: |")
    key = "machine_s_per_gb" if stream else "machine_us_per_req"
    pkey = "proxy_s_per_gb" if stream else "proxy_us_per_req"
    paths = defaultdict(list)
    for p in proxies:
        rs = [rr[p] for rr in reps.values() if p in rr]
        m = [float(r[key]) for r in rs if r[key]]
        pr = [float(r[pkey]) for r in rs if r[pkey]]
        path = []
        for rr in reps.values():
            if p in rr and "none" in rr and rr[p][key] and rr["none"][key]:
                path.append(float(rr[p][key]) - float(rr["none"][key]))
        paths[p] = path
        errs = sum(int(r["errors"]) for r in rs if r["errors"])
        if stream:
            g = [float(r["gbit_per_s"]) for r in rs if r["gbit_per_s"]]
            print(f"| {p} | {med(g)} | {med(m)} | {med(path) if p != 'none' else '-'} | {med(pr) if p != 'none' else '-'} | {errs} |")
        else:
            q = [float(r["rate_per_s"]) for r in rs if r["rate_per_s"]]
            p99 = [float(r["p99_us"]) for r in rs if r["p99_us"]]
            print(f"| {p} | {st.median(q):.0f} | {med(m)} | {med(path) if p != 'none' else '-'} | {med(pr) if p != 'none' else '-'} | {st.median(p99):.0f} | {errs} |")
    print()
    # Ratios of the path cost, per repetition, against the others.
    for base in ["relay", "floor", "squid", "dante", "haproxy", "haproxy-splice"]:
        if "kernel" in paths and base in paths:
            ratios = []
            for rr in reps.values():
                if all(k in rr and rr[k][key] for k in ("kernel", base, "none")):
                    k = float(rr["kernel"][key]) - float(rr["none"][key])
                    b = float(rr[base][key]) - float(rr["none"][key])
                    if b > 0:
                        ratios.append(k / b)
            if ratios:
                print(f"- kernel / {base}, path cost: {med(ratios)}")
    print()
EOF
} | tee "$MD"
log "results: $CSV, $MD"
