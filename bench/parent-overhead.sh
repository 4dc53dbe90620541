#!/usr/bin/env bash
# =============================================================================
# bench/parent-overhead.sh — what routing through one parent proxy costs the
#                            first hop: CPU per request, direct against parent.
# =============================================================================
#
# WHAT IT MEASURES
#   rustle-bench load (CPU OTHER) --> first hop rustle (CPU FIRST, alone)
#       direct:  --> rustle-bench origin (CPU OTHER)
#       parent:  --> parent rustle (CPU OTHER) --> rustle-bench origin
#
#   The first hop runs with one worker and no access log, from a
#   configuration that always declares the parent:
#       [[parent]] name = "p", kind = KIND, address = the parent's listener
#   and, for the "parent" runs only, the route that sends everything there:
#       [[route]] via = "p"
#   so the two runs differ by that route alone. The parent is a second rustle
#   (one worker, no log; an HTTP listener for kind http, a SOCKS one for
#   socks5) that stays up for the whole script, idle in the direct runs.
#
#   Each run starts a fresh first hop, drives LOAD_MODE through it (64
#   kept-alive connections, 1 KB answers from /bytes/1024; by default at a
#   fixed RATE, so that the first hop handles the same load in both runs
#   whatever the parent costs the other CPU), and reads the first hop's
#   utime+stime from /proc/PID/stat after the warmup and when the load ends:
#   CPU µs per request = CPU time / requests completed in the measured window.
#   The parent's CPU per request is recorded too (for information), and the
#   TCP connections opened in the namespace per request (all processes: the
#   load's 64, the first hop's and the parent's connections upstream).
#
#   Direct and parent runs alternate, the order swapped every repetition
#   (rep 1: direct, parent; rep 2: parent, direct; ...). The summary gives
#   per mode the median and range, and per repetition the ratio parent /
#   direct (median and range).
#
# HOW TO RUN (as root: it makes a network namespace of its own)
#   cargo build --release -p rustle -p rustle-bench
#   bench/parent-overhead.sh
#   KINDS="http socks5" LOAD_MODES="http-proxy connect" bench/parent-overhead.sh
#
#   Environment knobs (defaults in brackets):
#     KINDS      [http]        parent kinds: http socks5 (one parent each)
#     LOAD_MODES [http-proxy]  rustle-bench load modes through the first hop:
#                              http-proxy (plain HTTP, absolute form) and/or
#                              connect (a CONNECT tunnel per client connection)
#     REPS [5]  DURATION [5] (s)  WARMUP [1] (s)  CONNS [64]
#     RATE [8000]  requests/s in total (open loop); 0: closed loop, as fast
#                  as it goes (the first hop then runs less loaded through
#                  the parent, which changes its CPU per request by itself)
#     FIRST_CPU [1]  the first hop's CPU; OTHER_CPU [0] everything else
#     RUSTLE_BIN [target/release/rustle]  BENCH_BIN [target/release/rustle-bench]
#     RESULTS_DIR [bench/results]
#     NETNS [1]  0: stay in the current network namespace (loopback there)
#
# OUTPUT (STAMP = UTC date-time of the start)
#   RESULTS_DIR/parent-overhead-STAMP.csv  one row per run
#   RESULTS_DIR/parent-overhead-STAMP.md   conditions and summary (also printed)
#
# SAFETY
#   Loopback only, in a network namespace of its own (unshare -n) unless
#   NETNS=0. Every process started here is stopped by its PID on EXIT, INT
#   and TERM; the scratch directory (private copies of the binaries and the
#   configurations) is removed.
# =============================================================================
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    *) echo "parent-overhead.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

KINDS=${KINDS:-http}
LOAD_MODES=${LOAD_MODES:-http-proxy}
REPS=${REPS:-5}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
CONNS=${CONNS:-64}
RATE=${RATE:-8000}
FIRST_CPU=${FIRST_CPU:-1}
OTHER_CPU=${OTHER_CPU:-0}
RUSTLE_BIN=${RUSTLE_BIN:-$ROOT/target/release/rustle}
BENCH_BIN=${BENCH_BIN:-$ROOT/target/release/rustle-bench}
RESULTS_DIR=${RESULTS_DIR:-$HERE/results}
NETNS=${NETNS:-1}
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[parent-overhead %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -x $RUSTLE_BIN ]] || die "missing $RUSTLE_BIN (cargo build --release -p rustle)"
[[ -x $BENCH_BIN ]] || die "missing $BENCH_BIN (cargo build --release -p rustle-bench)"
for t in taskset ss python3 getconf; do command -v "$t" >/dev/null || die "missing tool: $t"; done
for k in $KINDS; do [[ $k == http || $k == socks5 ]] || die "KINDS: http or socks5, not $k"; done
for m in $LOAD_MODES; do [[ $m == http-proxy || $m == connect ]] || die "LOAD_MODES: http-proxy or connect, not $m"; done

# A network namespace of our own: only loopback, no port shared with anyone.
if [[ $NETNS == 1 && ${PARENT_OVERHEAD_IN_NS:-0} != 1 ]]; then
  [[ $(id -u) == 0 ]] || die "needs root for its network namespace (or NETNS=0)"
  exec unshare -n -- env PARENT_OVERHEAD_IN_NS=1 bash "${BASH_SOURCE[0]}"
fi
if [[ ${PARENT_OVERHEAD_IN_NS:-0} == 1 ]]; then
  ip link set lo up || die "cannot bring up lo in the namespace"
fi

# ------------------------------------------------------------ state, cleanup
WORK=$(mktemp -d /tmp/parent-overhead.XXXXXX)
PIDS=()
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
cleanup() { stop_all; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Private copies: a rebuild during the run changes nothing measured.
cp "$RUSTLE_BIN" "$WORK/rustle"
cp "$BENCH_BIN" "$WORK/rustle-bench"
RUSTLE=$WORK/rustle
BENCH=$WORK/rustle-bench

active_opens() {  # TcpActiveOpens of this network namespace
  awk '$1 == "Tcp:" { if (!h) { for (i = 2; i <= NF; i++) if ($i == "ActiveOpens") c = i; h = 1 } else print $c }' /proc/net/snmp
}

STAMP=$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
CSV=$RESULTS_DIR/parent-overhead-$STAMP.csv
MD=$RESULTS_DIR/parent-overhead-$STAMP.md
echo "stamp,kind,load_mode,route,rep,order,rate,connections,duration_s,completed,errors,req_per_s,first_cpu_s,first_us_per_req,parent_cpu_s,parent_us_per_req,tcp_opens_per_req,p50_us,p99_us" > "$CSV"

# ------------------------------------------------------------------- origin
ORIGIN_PORT=$(free_port)
ORIGIN=127.0.0.1:$ORIGIN_PORT
taskset -c "$OTHER_CPU" "$BENCH" origin --listen "$ORIGIN" > "$WORK/origin.out" 2> "$WORK/origin.err" &
ORIGIN_PID=$!
PIDS+=("$ORIGIN_PID")
wait_listening "$ORIGIN_PID" "$ORIGIN_PORT" origin

run_one() {  # run_one KIND LOAD_MODE ROUTE REP ORDER CONFIG PARENT_PID
  local kind=$1 mode=$2 route=$3 rep=$4 order=$5 conf=$6 parent_pid=$7
  local port pid t0 t1 p0 p1 o0 o1 rate_args=()
  port=$(free_port)
  taskset -c "$FIRST_CPU" "$RUSTLE" --config "$conf" --http="127.0.0.1:$port" --workers 1 --log off \
    > "$WORK/first.out" 2> "$WORK/first.err" &
  pid=$!
  PIDS+=("$pid")
  wait_listening "$pid" "$port" first
  [[ $RATE != 0 ]] && rate_args=(--rate "$RATE")
  taskset -c "$OTHER_CPU" "$BENCH" load --json --mode "$mode" --proxy "127.0.0.1:$port" \
    --target "$ORIGIN" --connections "$CONNS" --duration "${DURATION}s" --warmup "${WARMUP}s" \
    "${rate_args[@]}" > "$WORK/load.json" 2> "$WORK/load.err" &
  local load=$!
  PIDS+=("$load")
  sleep "$WARMUP"
  t0=$(cpu_ticks "$pid"); p0=$(cpu_ticks "$parent_pid"); o0=$(active_opens)
  wait "$load" || log "load exited with an error: $(tail -1 "$WORK/load.err")"
  t1=$(cpu_ticks "$pid"); p1=$(cpu_ticks "$parent_pid"); o1=$(active_opens)
  stop_pid "$pid"
  python3 - "$WORK/load.json" "$STAMP" "$kind" "$mode" "$route" "$rep" "$order" "$RATE" "$CONNS" \
    $((t1 - t0)) $((p1 - p0)) $((o1 - o0)) "$CLK_TCK" >> "$CSV" <<'EOF'
import json, sys
f, stamp, kind, mode, route, rep, order, rate, conns, ft, pt, opens, hz = sys.argv[1:]
try:
    d = json.load(open(f))
except Exception:
    d = {"completed": 0, "errors": {"total": -1}, "duration_s": 0, "rate_per_s": 0, "latency_us": {}}
n = d["completed"]
fc, pc = int(ft) / int(hz), int(pt) / int(hz)
per = lambda c: f"{c * 1e6 / n:.2f}" if n else ""
opr = f"{int(opens) / n:.3f}" if n else ""
lat = d.get("latency_us") or {}
print(",".join(str(x) for x in [stamp, kind, mode, route, rep, order, rate, conns,
      f"{d['duration_s']:.3f}", n, d["errors"]["total"], f"{d['rate_per_s']:.0f}",
      f"{fc:.2f}", per(fc), f"{pc:.2f}", per(pc), opr, lat.get("p50", ""), lat.get("p99", "")]))
EOF
  log "$(tail -1 "$CSV")"
}

for kind in $KINDS; do
  PARENT_PORT=$(free_port)
  flag=--http
  [[ $kind == socks5 ]] && flag=--socks
  printf '# the parent: a rustle with one listener from the command line\n' > "$WORK/parent.toml"
  taskset -c "$OTHER_CPU" "$RUSTLE" --config "$WORK/parent.toml" "$flag=127.0.0.1:$PARENT_PORT" \
    --workers 1 --log off > "$WORK/parent.out" 2> "$WORK/parent.err" &
  PARENT_PID=$!
  PIDS+=("$PARENT_PID")
  wait_listening "$PARENT_PID" "$PARENT_PORT" parent
  cat > "$WORK/direct.toml" <<EOF
[[parent]]
name = "p"
kind = "$kind"
address = "127.0.0.1:$PARENT_PORT"
EOF
  { cat "$WORK/direct.toml"; printf '\n[[route]]\nvia = "p"\n'; } > "$WORK/parent-route.toml"
  cp "$WORK/direct.toml" "$WORK/config-$kind-direct.toml"
  cp "$WORK/parent-route.toml" "$WORK/config-$kind-parent.toml"
  for rep in $(seq "$REPS"); do
    for mode in $LOAD_MODES; do
      if (( rep % 2 == 1 )); then order="direct parent"; else order="parent direct"; fi
      i=0
      for route in $order; do
        i=$((i + 1))
        conf=$WORK/direct.toml
        [[ $route == parent ]] && conf=$WORK/parent-route.toml
        run_one "$kind" "$mode" "$route" "$rep" "$i" "$conf" "$PARENT_PID"
      done
    done
  done
  stop_pid "$PARENT_PID"
done

# ------------------------------------------------------------------ summary
{
  echo "# parent-overhead $STAMP (UTC)"
  echo
  echo "- cpu: $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo) x $(nproc --all)"
  echo "- kernel: $(uname -r)"
  echo "- rustle: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), binary $RUSTLE_BIN (sha256 $(sha256sum "$RUSTLE_BIN" | cut -c1-16))"
  echo "- first hop: 1 worker, --log off, taskset -c $FIRST_CPU; parent (rustle, 1 worker, --log off), origin and load: taskset -c $OTHER_CPU"
  echo "- network: $([[ ${PARENT_OVERHEAD_IN_NS:-0} == 1 ]] && echo 'loopback in a namespace of its own' || echo loopback)"
  echo "- load: rustle-bench load, $CONNS kept-alive connections, 1 KB answers, $([[ $RATE == 0 ]] && echo 'closed loop' || echo "$RATE requests/s (open loop)"), ${DURATION}s measured after ${WARMUP}s warmup, $REPS repetitions, order swapped each repetition"
  echo "- first hop's configuration: [[parent]] p (kind, 127.0.0.1:PORT); parent runs add [[route]] via = \"p\""
  echo
  python3 - "$CSV" <<'EOF'
import csv, sys, statistics as st
from collections import defaultdict
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["first_us_per_req"]]
groups = defaultdict(lambda: defaultdict(dict))
for r in rows:
    groups[(r["kind"], r["load_mode"])][int(r["rep"])][r["route"]] = r
def col(rs, k):
    return [float(r[k]) for r in rs if r[k] != ""]
def fmt(v):
    return f"{st.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" if v else "-"
print("First hop's CPU µs per request, median (range); parent / direct per repetition.")
print()
print("| parent kind | load | direct µs/req | via parent µs/req | parent / direct, median (range) | req/s direct / parent | TCP opens per request direct / parent | parent's own µs/req | errors |")
print("| :-- | :-- | --: | --: | --: | --: | --: | --: | --: |")
for (kind, mode), reps in sorted(groups.items()):
    d = [x["direct"] for x in reps.values() if "direct" in x]
    p = [x["parent"] for x in reps.values() if "parent" in x]
    ratios = [float(x["parent"]["first_us_per_req"]) / float(x["direct"]["first_us_per_req"])
              for x in reps.values() if "direct" in x and "parent" in x]
    rt = f"{st.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
    rps = f"{st.median(col(d, 'req_per_s')):.0f} / {st.median(col(p, 'req_per_s')):.0f}" if d and p else "-"
    op = f"{st.median(col(d, 'tcp_opens_per_req')):.3f} / {st.median(col(p, 'tcp_opens_per_req')):.3f}" if d and p else "-"
    errs = sum(int(r["errors"]) for r in d + p)
    print(f"| {kind} | {mode} | {fmt(col(d, 'first_us_per_req'))} | {fmt(col(p, 'first_us_per_req'))} | {rt} | {rps} | {op} | {fmt(col(p, 'parent_us_per_req'))} | {errs} |")
EOF
} | tee "$MD"
log "results: $CSV, $MD"
