#!/usr/bin/env bash
# bench/ab-capped.sh BEFORE AFTER: two rustle builds, one after the other in alternation,
# each at half a core (a cgroup-v1 cpu group, cfs quota 50 ms per 100 ms) pinned to CPU 0,
# saturated by the project's load generator (64 kept-alive or close-per-request clients,
# closed loop) on CPU 1 beside the origin. Prints each run's CPU time per exchange of the
# proxy (utime+stime from /proc/PID/stat over the measured window) and the ratio of the
# paired runs, then the medians and the spread. Needs root (cgroups, pinning).
#   FAMILIES: any of ka close connect socks5 [all four]; REPS [5]; DUR [8] s; CONNS [64].
#   BENCH: the load generator [target/release/rustle-bench]; OUT: a directory for the raw
#   rows [a temporary one].
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "ab-capped: needs root (cgroup cpu quota)" >&2; exit 1; }
BEFORE=$(realpath "$1"); AFTER=$(realpath "$2"); BENCH=$(realpath "${BENCH:-target/release/rustle-bench}")
FAMILIES=${FAMILIES:-"ka close connect socks5"}; REPS=${REPS:-5}; DUR=${DUR:-8}; CONNS=${CONNS:-64}
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
CG=/sys/fs/cgroup/cpu/rustle-ab-$$
mkdir "$CG"; echo 100000 > "$CG/cpu.cfs_period_us"; echo 50000 > "$CG/cpu.cfs_quota_us"
OPORT=18190; PPORT=13190
taskset -c 1 "$BENCH" origin --listen 127.0.0.1:$OPORT >/dev/null 2>&1 & ORIGIN=$!
PROXY=
cleanup() {
  [ -n "$PROXY" ] && kill "$PROXY" 2>/dev/null || true
  kill "$ORIGIN" 2>/dev/null || true
  wait 2>/dev/null || true
  rmdir "$CG" 2>/dev/null || true
}
trap cleanup EXIT
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
# run BIN FAMILY: one measured run; prints "µs-per-exchange exchanges errors"
run() {
  local bin=$1 fam=$2 kind=http mode=http-proxy extra=
  case $fam in
    ka) ;; close) extra=--close ;; connect) mode=connect ;; socks5) mode=socks5; kind=socks ;;
  esac
  printf 'workers = 1\n[[listener]]\nkind = "%s"\nlisten = "127.0.0.1:%s"\n[log]\naccess = "off"\n' \
    $kind $PPORT > "$OUT/proxy.toml"
  ( echo $BASHPID > "$CG/cgroup.procs"; exec taskset -c 0 "$bin" --config "$OUT/proxy.toml" ) \
    >/dev/null 2>&1 &
  PROXY=$!
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PPORT) 2>/dev/null && break; sleep 0.1; done
  taskset -c 1 "$BENCH" load --mode $mode --proxy 127.0.0.1:$PPORT --target 127.0.0.1:$OPORT \
    --path /bytes/1024 $extra --connections "$CONNS" --duration 1s --warmup 0s >/dev/null
  local c0; c0=$(cpu $PROXY)
  taskset -c 1 "$BENCH" load --mode $mode --proxy 127.0.0.1:$PPORT --target 127.0.0.1:$OPORT \
    --path /bytes/1024 $extra --connections "$CONNS" --duration "${DUR}s" --warmup 0s --json \
    > "$OUT/load.json"
  local c1; c1=$(cpu $PROXY)
  kill $PROXY; wait $PROXY 2>/dev/null || true; PROXY=
  python3 - "$c0" "$c1" "$OUT/load.json" <<'P'
import json, os, sys
c0, c1 = int(sys.argv[1]), int(sys.argv[2]); j = json.load(open(sys.argv[3]))
n = j["completed"]; t = os.sysconf("SC_CLK_TCK")
print(round((c1 - c0) / t * 1e6 / max(n, 1), 3), n, j["errors"]["total"])
P
}
for fam in $FAMILIES; do
  for rep in $(seq 1 "$REPS"); do
    # Alternate which build goes first, so that a drift in the machine weighs on both.
    if [ $((rep % 2)) = 1 ]; then b=$(run "$BEFORE" $fam); a=$(run "$AFTER" $fam)
    else a=$(run "$AFTER" $fam); b=$(run "$BEFORE" $fam); fi
    echo "$fam $rep $b $a" | tee -a "$OUT/rows.txt"
  done
done
python3 - "$OUT/rows.txt" <<'P'
import statistics as s, sys
rows = [l.split() for l in open(sys.argv[1])]
for fam in dict.fromkeys(r[0] for r in rows):
    r = [x for x in rows if x[0] == fam]
    b = [float(x[2]) for x in r]; a = [float(x[5]) for x in r]; q = [y / x for x, y in zip(b, a)]
    dearer = sum(1 for v in q if v > 1)
    print(f"{fam:8} before {s.median(b):6.2f} µs  after {s.median(a):6.2f} µs  ratio median "
          f"{s.median(q):.3f} (range {min(q):.3f}-{max(q):.3f}), after dearer in {dearer} of {len(q)}")
P
echo "raw rows: $OUT/rows.txt"
