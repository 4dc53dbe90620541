#!/usr/bin/env bash
# bench/ab-cost.sh BEFORE AFTER: two rustle builds at once on CPU 0, one worker each, each
# under the same fixed rate from its own load generator on CPU 1 (with the origin), so that
# the rest of the machine weighs on both alike; prints the proxies' CPU (utime+stime) per
# exchange and their ratio, per run, then the medians.
#   MODE: http-proxy (default), connect or socks5 (each a 1 KB GET, through the tunnel for
#   the last two); EXTRA="--close" for a new connection per request; REPS [5], DUR [8] s,
#   RATE [5000] requests/s each. Columns: run, before and after CPU µs per exchange, ratio,
#   exchanges answered by each, errors of each.
#   Both sides may be the same build with different settings: BCONF/ACONF name files whose
#   lines go at the end of each side's configuration, BTARGET/ATARGET each side's target
#   (default 127.0.0.1:18090, the origin). LEXTRA: lines for both listeners' tables (for
#   example `auth = true`, with EXTRA="--proxy-user alice:secret"). DNS=1 starts bench/dns-stub.py on
#   127.0.0.1:5353 (every name is 127.0.0.1) for a side whose target is a name.
set -euo pipefail
D=$(mktemp -d); BEFORE=$1; AFTER=$2; BENCH=${BENCH:-target/release/rustle-bench}
REPS=${REPS:-5}; DUR=${DUR:-8}; RATE=${RATE:-5000}; MODE=${MODE:-http-proxy}; EXTRA=${EXTRA:-}
mk() { printf 'workers = 1\n[[listener]]\nkind = "%s"\nlisten = "127.0.0.1:%s"\n%b\n[log]\naccess = "off"\n' $2 $1 "${LEXTRA:-}"; }
KIND=http; [ "$MODE" = socks5 ] && KIND=socks
mk 13128 $KIND > $D/b.toml; mk 13129 $KIND > $D/a.toml
[ -n "${BCONF:-}" ] && cat "$BCONF" >> $D/b.toml
[ -n "${ACONF:-}" ] && cat "$ACONF" >> $D/a.toml
BTARGET=${BTARGET:-127.0.0.1:18090}; ATARGET=${ATARGET:-127.0.0.1:18090}; ARGS="--path /bytes/1024"
taskset -c 1 $BENCH origin --listen 127.0.0.1:18090 >/dev/null 2>&1 & ORIGIN=$!
STUB=
if [ "${DNS:-0}" = 1 ]; then
  taskset -c 1 python3 "$(dirname "$0")/dns-stub.py" 127.0.0.1:5353 & STUB=$!
fi
trap 'kill $ORIGIN $STUB 2>/dev/null || true' EXIT
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
for rep in $(seq 1 $REPS); do
  taskset -c 0 $BEFORE --config $D/b.toml 2>/dev/null & PB=$!
  taskset -c 0 $AFTER --config $D/a.toml 2>/dev/null & PA=$!
  sleep 0.5
  b0=$(cpu $PB); a0=$(cpu $PA)
  taskset -c 1 $BENCH load --mode $MODE --proxy 127.0.0.1:13128 --target $BTARGET $ARGS $EXTRA \
     --connections 64 --duration ${DUR}s --warmup 0s --rate $RATE --json > $D/lb.json &
  LB=$!
  taskset -c 1 $BENCH load --mode $MODE --proxy 127.0.0.1:13129 --target $ATARGET $ARGS $EXTRA \
     --connections 64 --duration ${DUR}s --warmup 0s --rate $RATE --json > $D/la.json
  wait $LB
  b1=$(cpu $PB); a1=$(cpu $PA)
  kill $PB $PA; wait $PB $PA 2>/dev/null || true
  python3 - "$b0" "$b1" "$a0" "$a1" "$rep" <<P | tee -a $D/rows.txt
import json, sys, os
b0,b1,a0,a1=map(int,sys.argv[1:5]); rep=sys.argv[5]
t=os.sysconf("SC_CLK_TCK")
jb=json.load(open("$D/lb.json")); ja=json.load(open("$D/la.json"))
rb=jb["completed"]; ra=ja["completed"]
ub=(b1-b0)/t*1e6/rb; ua=(a1-a0)/t*1e6/ra
print(rep, round(ub,3), round(ua,3), round(ua/ub,4), rb, ra, jb.get("errors",{}).get("total",0), ja.get("errors",{}).get("total",0))
P
done
python3 - <<P
import statistics as s
rows=[l.split() for l in open("$D/rows.txt").read().splitlines()]
q=[float(r[3]) for r in rows]; b=[float(r[1]) for r in rows]; a=[float(r[2]) for r in rows]
print("$MODE $EXTRA: before", s.median(b), "us; after", s.median(a), "us; ratio median", s.median(q), "range", min(q), max(q))
P
