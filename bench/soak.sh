#!/usr/bin/env bash
# =============================================================================
# bench/soak.sh — rustle held near its open-file limit under a steady mixed
#                 load for a long time.
# =============================================================================
#
# WHAT IT DOES
#   One rustle (default workers, access log off) with an HTTP and a SOCKS
#   listener, in a network namespace of its own, with the open-file limit at
#   NOFILE (20000 here, the most a process may hold on this machine):
#
#     idle    TUNNELS CONNECT tunnels (rustle-bench load --hold), opened at
#             the start and kept idle for the whole run: two open files each
#             in rustle, so 9,900 of them leave about 200 files for the rest
#     steady  for DURATION, at fixed rates (open loop):
#               http-keepalive  plain HTTP, kept-alive connections
#               http-new        plain HTTP, a new connection per request
#               connect         requests inside CONNECT tunnels
#               socks5          requests inside SOCKS5 tunnels
#
#   Every SAMPLE seconds it records rustle's resident memory, open files and
#   CPU time. At the end the idle tunnels close, and it waits for rustle's
#   open files to come back to what they were before the load.
#
#   Verdicts (also the exit status: 1 if any fails):
#     - zero failed exchanges in every steady load, every idle tunnel opened
#       and still open when the hold ended
#     - RSS flat after the first minute: the largest sample after minute one
#       is at most RSS_SLACK (default 10%) above the sample at minute one
#     - open files back to the baseline within 30 s of the end
#
# HOW TO RUN (as root: it makes a network namespace of its own)
#   cargo build --release -p rustle -p rustle-bench
#   bench/soak.sh                    # 10 minutes, 9,900 idle tunnels
#   DURATION=2m TUNNELS=2000 bench/soak.sh
#
#   Environment knobs (defaults in brackets):
#     DURATION [10m]  the steady load's length (s, m or h suffix)
#     TUNNELS [9900]  idle CONNECT tunnels held through the run
#     NOFILE [20000]  open-file limit of every process started here
#     RATE_KEEPALIVE [2000]  RATE_NEW [200]  RATE_CONNECT [1000]
#     RATE_SOCKS [1000]      requests/s of each steady load
#     SAMPLE [10] (s)  RSS_SLACK [10] (%)
#     RUSTLE_BIN [target/release/rustle]  BENCH_BIN [target/release/rustle-bench]
#     RESULTS_DIR [bench/results]
#
# OUTPUT (STAMP = UTC date-time of the start)
#   RESULTS_DIR/soak-STAMP-samples.csv  one row per sample
#   RESULTS_DIR/soak-STAMP.md           conditions, loads, verdicts (also printed)
#
# SAFETY
#   Loopback only, inside a network namespace of its own (unshare -n), whose
#   sysctls (ephemeral port range, TIME_WAIT reuse) are the namespace's own.
#   Every process started here is stopped by its PID on EXIT, INT and TERM;
#   the scratch directory is removed.
# =============================================================================
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    *) echo "soak.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

DURATION=${DURATION:-10m}
TUNNELS=${TUNNELS:-9900}
NOFILE=${NOFILE:-20000}
RATE_KEEPALIVE=${RATE_KEEPALIVE:-2000}
RATE_NEW=${RATE_NEW:-200}
RATE_CONNECT=${RATE_CONNECT:-1000}
RATE_SOCKS=${RATE_SOCKS:-1000}
SAMPLE=${SAMPLE:-10}
RSS_SLACK=${RSS_SLACK:-10}
RUSTLE_BIN=${RUSTLE_BIN:-$ROOT/target/release/rustle}
BENCH_BIN=${BENCH_BIN:-$ROOT/target/release/rustle-bench}
RESULTS_DIR=${RESULTS_DIR:-$HERE/results}
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[soak %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

seconds() {  # 10m -> 600
  case "$1" in
    *h) echo $(( ${1%h} * 3600 )) ;;
    *m) echo $(( ${1%m} * 60 )) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
  esac
}
SECS=$(seconds "$DURATION")

[[ -x $RUSTLE_BIN ]] || die "missing $RUSTLE_BIN (cargo build --release -p rustle)"
[[ -x $BENCH_BIN ]] || die "missing $BENCH_BIN (cargo build --release -p rustle-bench)"
for t in ss python3 getconf unshare ip; do command -v "$t" >/dev/null || die "missing tool: $t"; done

if [[ ${SOAK_IN_NS:-0} != 1 ]]; then
  [[ $(id -u) == 0 ]] || die "needs root for its network namespace"
  exec unshare -n -- env SOAK_IN_NS=1 bash "${BASH_SOURCE[0]}"
fi
ip link set lo up || die "cannot bring up lo in the namespace"
# The namespace's own: room for the new-connection load's TIME_WAIT sockets beside the
# idle tunnels (each side of rustle has its own four-tuples).
sysctl -qw net.ipv4.ip_local_port_range="1024 65000"
sysctl -qw net.ipv4.tcp_tw_reuse=1
ulimit -n "$NOFILE" || die "cannot set the open-file limit to $NOFILE (ulimit -Hn: $(ulimit -Hn))"

WORK=$(mktemp -d /tmp/soak.XXXXXX)
PIDS=()
STOP_WAIT=100
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

files() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

STAMP=$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
CSV=$RESULTS_DIR/soak-$STAMP-samples.csv
MD=$RESULTS_DIR/soak-$STAMP.md
echo "t_s,rss_kb,open_files,cpu_s" > "$CSV"

# ------------------------------------------------------------------ peers
ORIGIN_PORT=$(free_port)
ORIGIN=127.0.0.1:$ORIGIN_PORT
"$BENCH" origin --listen "$ORIGIN" > "$WORK/origin.out" 2> "$WORK/origin.err" &
ORIGIN_PID=$!
PIDS+=("$ORIGIN_PID")
wait_listening "$ORIGIN_PID" "$ORIGIN_PORT" origin

HTTP_PORT=$(free_port)
SOCKS_PORT=$(free_port)
cat > "$WORK/rustle.toml" <<EOF
[[listener]]
kind = "http"
listen = "127.0.0.1:$HTTP_PORT"

[[listener]]
kind = "socks"
listen = "127.0.0.1:$SOCKS_PORT"

[log]
access = "off"

[timeouts]
tunnel_idle = "$(( SECS + 600 ))s"
keepalive = "$(( SECS + 600 ))s"

[limits]
max_connections = $(( TUNNELS + 200 ))
EOF
"$RUSTLE" --config "$WORK/rustle.toml" > "$WORK/rustle.out" 2> "$WORK/rustle.err" &
RUSTLE_PID=$!
PIDS+=("$RUSTLE_PID")
wait_listening "$RUSTLE_PID" "$HTTP_PORT" rustle
wait_listening "$RUSTLE_PID" "$SOCKS_PORT" rustle
BASE_FILES=$(files "$RUSTLE_PID")
BASE_RSS=$(rss_kb "$RUSTLE_PID")
log "rustle $RUSTLE_PID up: $BASE_FILES open files, RSS $BASE_RSS kB"

# ------------------------------------------------------------------ idle tunnels
# The hold's time runs from when every tunnel is settled (it then says "holding N" on
# stderr) and outlasts the steady load by a margin; it ends by itself and reports.
HOLD_SECS=$(( SECS + 10 ))
"$BENCH" load --json --mode connect --proxy "127.0.0.1:$HTTP_PORT" --target "$ORIGIN" \
  --hold "$TUNNELS" --connections "$TUNNELS" --duration "${HOLD_SECS}s" --timeout 30s \
  > "$WORK/hold.json" 2> "$WORK/hold.err" &
HOLD_PID=$!
PIDS+=("$HOLD_PID")
for i in $(seq 1200); do
  grep -q '^holding' "$WORK/hold.err" && break
  kill -0 "$HOLD_PID" 2>/dev/null || die "the hold ended early: $(tail -3 "$WORK/hold.err")"
  sleep 0.1
done
grep -q '^holding' "$WORK/hold.err" || die "the idle tunnels did not settle within 120 s"
log "idle tunnels open: rustle holds $(files "$RUSTLE_PID") files"

# ------------------------------------------------------------------ steady load
steady() {  # steady NAME MODE RATE CONNECTIONS [extra args]
  local name=$1 mode=$2 rate=$3 conns=$4
  shift 4
  local proxy=127.0.0.1:$HTTP_PORT
  [[ $mode == socks5 ]] && proxy=127.0.0.1:$SOCKS_PORT
  "$BENCH" load --json --mode "$mode" --proxy "$proxy" --target "$ORIGIN" \
    --rate "$rate" --connections "$conns" --duration "${SECS}s" --warmup 0s "$@" \
    > "$WORK/$name.json" 2> "$WORK/$name.err" &
  PIDS+=("$!")
  LOAD_PIDS+=("$!")
}
LOADS=(http-keepalive http-new connect socks5)
LOAD_PIDS=()
steady http-keepalive http-proxy "$RATE_KEEPALIVE" 16
steady http-new http-proxy "$RATE_NEW" 8 --close
steady connect connect "$RATE_CONNECT" 8
steady socks5 socks5 "$RATE_SOCKS" 8
START=$(date +%s)
log "steady load for ${SECS}s"

while :; do
  now=$(( $(date +%s) - START ))
  echo "$now,$(rss_kb "$RUSTLE_PID"),$(files "$RUSTLE_PID"),$(python3 -c "print($(cpu_ticks "$RUSTLE_PID") / $CLK_TCK)")" >> "$CSV"
  running=0
  for p in "${LOAD_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && running=1; done
  (( running )) || break
  kill -0 "$RUSTLE_PID" 2>/dev/null || die "rustle exited: $(tail -5 "$WORK/rustle.err")"
  sleep "$SAMPLE"
done
for p in "${LOAD_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
log "steady load done; waiting for the hold to end"
wait "$HOLD_PID" || log "the hold exited with an error: $(tail -1 "$WORK/hold.err")"

END_FILES=0
for i in $(seq 300); do
  END_FILES=$(files "$RUSTLE_PID")
  (( END_FILES <= BASE_FILES )) && break
  sleep 0.1
done
END_RSS=$(rss_kb "$RUSTLE_PID")
PANICS=$(grep -c panicked "$WORK/rustle.err" || true)
stop_pid "$RUSTLE_PID"

# ------------------------------------------------------------------ report
{
  echo "# soak $STAMP (UTC)"
  echo
  echo "- cpu: $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo) x $(nproc --all)"
  echo "- kernel: $(uname -r)"
  echo "- rustle: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') (release), default workers, access log off, max_connections $(( TUNNELS + 200 ))"
  echo "- open-file limit: $NOFILE for every process; loopback in a namespace of its own"
  echo "- idle: $TUNNELS CONNECT tunnels held; steady for ${SECS}s: http-keepalive $RATE_KEEPALIVE/s on 16 connections, http-new $RATE_NEW/s on 8 (a connection each), connect $RATE_CONNECT/s on 8 tunnels, socks5 $RATE_SOCKS/s on 8 tunnels; 1 KB answers"
  echo
  python3 - "$WORK" "$CSV" "$TUNNELS" "$BASE_FILES" "$END_FILES" "$BASE_RSS" "$END_RSS" "$RSS_SLACK" "$PANICS" "${LOADS[@]}" <<'EOF'
import csv, json, sys
work, samples, tunnels, base_files, end_files, base_rss, end_rss, slack, panics = sys.argv[1:10]
loads = sys.argv[10:]
ok = True
print("| load | requests | errors | req/s | p50 µs | p99 µs | p99.9 µs |")
print("| :-- | --: | --: | --: | --: | --: | --: |")
failed = 0
for name in loads:
    try:
        d = json.load(open(f"{work}/{name}.json"))
    except Exception as e:
        print(f"| {name} | no report ({e}) | | | | | |")
        ok = False
        continue
    lat = d.get("latency_us") or {}
    errs = d["errors"]["total"]
    failed += errs
    print(f"| {name} | {d['completed']} | {errs} | {d['rate_per_s']:.0f} | {lat.get('p50', '')} | {lat.get('p99', '')} | {lat.get('p99_9', '')} |")
try:
    h = json.load(open(f"{work}/hold.json"))["hold"]
except Exception as e:
    h = None
print()
if h:
    print(f"- idle tunnels: {h['requested']} asked, {h['established']} opened, {h['open']} still open at the end of the hold")
    held = h["established"] == int(tunnels) and h["open"] == int(tunnels)
else:
    print("- idle tunnels: the hold gave no report")
    held = False
rows = list(csv.DictReader(open(samples)))
after = [r for r in rows if int(r["t_s"]) >= 60]
if after:
    at1 = int(after[0]["rss_kb"])
    peak = max(int(r["rss_kb"]) for r in after)
    last = int(rows[-1]["rss_kb"])
    growth = (peak - at1) * 100 / at1
    flat = growth <= float(slack)
    print(f"- RSS: {int(base_rss)/1024:.1f} MB before the load; {at1/1024:.1f} MB at minute one, peak after it {peak/1024:.1f} MB (+{growth:.1f}%), {last/1024:.1f} MB at the end of the load, {int(end_rss)/1024:.1f} MB after the tunnels closed")
else:
    flat = False
    print("- RSS: the run was shorter than a minute: no verdict")
cpu = float(rows[-1]["cpu_s"]) - float(rows[0]["cpu_s"]) if len(rows) > 1 else 0
print(f"- rustle CPU during the steady load: {cpu:.1f} s over {rows[-1]['t_s']} s")
back = int(end_files) <= int(base_files)
print(f"- open files: {base_files} before the load, peak {max(int(r['open_files']) for r in rows)}, {end_files} after the tunnels closed")
print(f"- panics in rustle's log: {panics}")
print()
verdicts = [("zero failed exchanges", failed == 0 and held), ("RSS flat after the first minute", flat),
            ("open files back to the baseline", back), ("no panic", int(panics) == 0)]
for name, v in verdicts:
    print(f"- {'PASS' if v else 'FAIL'}: {name}")
sys.exit(0 if all(v for _, v in verdicts) and ok else 1)
EOF
} | tee "$MD"
status=${PIPESTATUS[0]}
log "results: $CSV, $MD"
exit "$status"
