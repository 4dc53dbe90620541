#!/usr/bin/env bash
# bench/metrics-cost.sh: what counting for /metrics costs. Two rustle builds run at once,
# both pinned to CPU 0, each under the same fixed rate of kept-alive 1 KB HTTP requests
# from its own `rustle-bench load` (CPU 1, with the origin), so that whatever else the
# machine does hits both alike. AFTER runs with [admin] on and is scraped every second
# (curl); BEFORE runs without it (a build from before the metrics, or the same build).
# Prints the proxy CPU (utime+stime) per request of each, and their ratio, per run.
#
#   BEFORE=path/to/rustle-old AFTER=target/release/rustle bench/metrics-cost.sh
#   knobs: REPS [5], DUR [10] seconds, RATE [6000] requests/s each,
#          BENCH [target/release/rustle-bench], D [a scratch directory]
set -euo pipefail
D=${D:-$(mktemp -d)}
BEFORE=${BEFORE:?BEFORE=rustle binary without metrics}; AFTER=${AFTER:-target/release/rustle}
BENCH=${BENCH:-target/release/rustle-bench}
REPS=${REPS:-5}; DUR=${DUR:-10}; RATE=${RATE:-6000}
mk() { printf 'workers = 1\n[[listener]]\nkind = "http"\nlisten = "127.0.0.1:%s"\n[log]\naccess = "off"\n' $1; }
mk 13128 > $D/b.toml; mk 13129 > $D/a.toml; printf '[admin]\nlisten = "127.0.0.1:19090"\n' >> $D/a.toml
taskset -c 1 $BENCH origin --listen 127.0.0.1:18090 >/dev/null 2>&1 & ORIGIN=$!
trap 'kill $ORIGIN 2>/dev/null || true' EXIT
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
echo "rep before_us after_us ratio scrapes" | tee $D/same-run.txt
for rep in $(seq 1 $REPS); do
  taskset -c 0 $BEFORE --config $D/b.toml 2>/dev/null & PB=$!
  taskset -c 0 $AFTER --config $D/a.toml 2>/dev/null & PA=$!
  for port in 13128 13129; do
    for i in $(seq 1 50); do curl -s -o /dev/null -x http://127.0.0.1:$port http://127.0.0.1:18090/bytes/1024 && break; sleep 0.1; done
  done
  rm -f $D/scrapes
  ( while true; do taskset -c 1 curl -s -o /dev/null http://127.0.0.1:19090/metrics; echo x >> $D/scrapes; sleep 1; done ) & S=$!
  b0=$(cpu $PB); a0=$(cpu $PA)
  taskset -c 1 $BENCH load --mode http-proxy --proxy 127.0.0.1:13128 --target 127.0.0.1:18090 \
     --path /bytes/1024 --connections 64 --duration ${DUR}s --warmup 0s --rate $RATE --json > $D/lb.json &
  LB=$!
  taskset -c 1 $BENCH load --mode http-proxy --proxy 127.0.0.1:13129 --target 127.0.0.1:18090 \
     --path /bytes/1024 --connections 64 --duration ${DUR}s --warmup 0s --rate $RATE --json > $D/la.json
  wait $LB
  b1=$(cpu $PB); a1=$(cpu $PA)
  kill $S; wait $S 2>/dev/null || true
  kill $PB $PA; wait $PB $PA 2>/dev/null || true
  python3 - "$b0" "$b1" "$a0" "$a1" "$rep" "$(wc -l < $D/scrapes)" <<P | tee -a $D/same-run.txt
import json, sys, os
b0,b1,a0,a1=map(int,sys.argv[1:5]); rep=sys.argv[5]; n=sys.argv[6]
t=os.sysconf("SC_CLK_TCK")
rb=json.load(open("$D/lb.json"))["completed"]; ra=json.load(open("$D/la.json"))["completed"]
ub=(b1-b0)/t*1e6/rb; ua=(a1-a0)/t*1e6/ra
print(rep, round(ub,3), round(ua,3), round(ua/ub,4), n)
P
done
python3 - <<P
import statistics as s
rows=[l.split() for l in open("$D/same-run.txt").read().splitlines()[1:]]
b=[float(r[1]) for r in rows]; a=[float(r[2]) for r in rows]; q=[float(r[3]) for r in rows]
print("before median", s.median(b), "range", min(b), max(b))
print("after median", s.median(a), "range", min(a), max(a))
print("ratio median", s.median(q), "range", min(q), max(q))
P
