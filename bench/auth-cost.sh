#!/usr/bin/env bash
# bench/auth-cost.sh: what an external authentication backend costs the proxy (issue #32).
# For each backend of BACKENDS [http ldap radius], with `rustle-bench auth-servers` serving
# it on CPU 1 (with the load generators and the origin; the proxies on CPU 0):
#   ka, close  bench/ab-cost.sh with one build on both sides: before, alice in [[auth.user]]
#              (a plain password); after, alice known only to the backend (its answer
#              remembered, `cache_ttl` 5m): kept-alive requests (RATE_KA each side) and a
#              new connection per request (RATE_CLOSE), Basic credentials on every request.
#   miss       ab-cost.sh in --close mode at MISS_RATE each side: before, the backend with
#              its answers remembered; after, the same with `cache_ttl = "0s"` (every
#              connection calls it). The difference of CPU µs per exchange is the cost of a
#              cache miss to the proxy; the backend's own CPU per call is printed beside.
#   swap       ka with the sides swapped (the backend's user on the first proxy): how much
#              the side itself weighs.
#   thr        one proxy (workers = 1) under an unthrottled --close load for DUR, with the
#              cache off (every login a call), on, and with the users file: logins
#              completed a second, and the CPU share of the proxy, the backend, and CPU 1
#              (load generator, origin, backend), to tell which one was the limit.
#   icount     instructions per kept-alive request (valgrind's callgrind, user space only),
#              users file against remembered: the difference between 1,000 and 3,000
#              requests on one connection.
# PARTS [ka swap close miss thr icount] picks the parts run.
# Runs with the release build: cargo build --release -p rustle -p rustle-bench.
#   REPS [5], DUR [8] s, RATE_KA [5000], RATE_CLOSE [3000], MISS_RATE [1000] requests/s
#   each side; OUT [a new directory]: every run's output. Prints a summary at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTLE=${RUSTLE:-target/release/rustle}; BENCH=${BENCH:-target/release/rustle-bench}
export BENCH
BACKENDS=${BACKENDS:-http ldap radius}; REPS=${REPS:-5}; DUR=${DUR:-8}
RATE_KA=${RATE_KA:-5000}; RATE_CLOSE=${RATE_CLOSE:-3000}; MISS_RATE=${MISS_RATE:-1000}
OUT=${OUT:-$(mktemp -d /tmp/auth-cost.XXXXXX)}; mkdir -p "$OUT"
export REPS DUR
SP=; ORIGIN=; PX=
stop() {
  for p in $PX $ORIGIN $SP; do kill "$p" 2>/dev/null || true; done
  for p in $PX $ORIGIN $SP; do wait "$p" 2>/dev/null || true; done
  SP=; PX=
}
trap stop EXIT
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
# CPU ticks of the backend: the auth-servers process (the callback runs in it) and its
# children (slapd, freeradius).
server_cpu() {
  local t=0 p
  for p in $SP $(pgrep -P "$SP" || true); do t=$((t + $(cpu "$p"))); done
  echo $t
}
TCK=$(getconf CLK_TCK)
PARTS=${PARTS:-ka swap close miss thr icount}
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# CPU 1's busy and idle ticks (idle + iowait), "busy,idle".
cpu1() { awk '$1 == "cpu1" {print $2+$3+$4+$7+$8+$9 "," $5+$6}' /proc/stat; }
taskset -c 1 $BENCH origin --listen 127.0.0.1:18091 >/dev/null 2>&1 & ORIGIN=$!

{
  echo "date: $(date -u +%FT%TZ)"
  echo "rustle: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with uncommitted changes)')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "kernel: $(uname -r)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "reps: $REPS, duration: ${DUR}s, rates: ka $RATE_KA, close $RATE_CLOSE, miss $MISS_RATE /s each side"
} | tee "$OUT/conditions.txt"

for b in $BACKENDS; do
  mkfifo "$OUT/$b.in"
  taskset -c 1 $BENCH auth-servers "--$b" $([ "$b" = http ] && echo 127.0.0.1:0) \
    < "$OUT/$b.in" > "$OUT/$b.servers" & SP=$!
  exec 3> "$OUT/$b.in"
  for _ in $(seq 100); do grep -q '^ready' "$OUT/$b.servers" && break; sleep 0.1; done
  grep -q '^ready' "$OUT/$b.servers" || { echo "auth-servers --$b did not start" >&2; exit 1; }
  read -r _ url secret < <(grep "^$b " "$OUT/$b.servers")
  case $b in
    http) PW=secret; backend="kind = \"http\"\nurl = \"$url\"" ;;
    ldap) PW=wonderland
          backend="kind = \"ldap\"\nurl = \"$url\"\nbind_dn_template = \"uid={user},ou=people,dc=example,dc=org\"\ngroup_attribute = \"memberOf\"" ;;
    radius) PW=wonderland; backend="kind = \"radius\"\nservers = [\"$url\"]\nsecret_file = \"$secret\"\naccounting = false" ;;
  esac
  # Many logins at once from one address: the failure budget must not refuse them.
  auth='[auth]\nfailures_burst = 1000000\nfailures_per_minute = 1000000\nrefusal_delay = "0s"'
  printf "$auth\n[[auth.user]]\nname = \"alice\"\npassword = \"plain:$PW\"\ngroups = [\"staff\"]\n" > "$OUT/$b.file.toml"
  printf "$auth\n[[auth.backend]]\n$backend\nmax_in_flight = 1024\n" > "$OUT/$b.cached.toml"
  printf "$auth\n[[auth.backend]]\n$backend\nmax_in_flight = 1024\ncache_ttl = \"0s\"\n" > "$OUT/$b.miss.toml"

  # The credentials are checked: without them 407, with them 200, through each config.
  for c in file cached miss; do
    printf 'workers = 1\n[[listener]]\nlisten = "127.0.0.1:13130"\nauth = true\n[log]\naccess = "off"\n' > "$OUT/$b.$c.full.toml"
    cat "$OUT/$b.$c.toml" >> "$OUT/$b.$c.full.toml"
    $RUSTLE --config "$OUT/$b.$c.full.toml" 2>"$OUT/$b.$c.log" & PX=$!
    for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:13130/ 2>/dev/null && break; sleep 0.1; done
    no=$(curl -s -o /dev/null -w '%{http_code}' -x 127.0.0.1:13130 http://127.0.0.1:18091/bytes/10)
    yes=$(curl -s -o /dev/null -w '%{http_code}' -x 127.0.0.1:13130 -U "alice:$PW" http://127.0.0.1:18091/bytes/10)
    kill $PX; wait $PX 2>/dev/null || true; PX=
    echo "$b $c: without credentials $no, with $yes" | tee -a "$OUT/checks.txt"
    [ "$no" = 407 ] && [ "$yes" = 200 ] || { echo "check failed ($OUT/$b.$c.log)" >&2; exit 1; }
  done

  if has ka; then
    LEXTRA='auth = true' BCONF="$OUT/$b.file.toml" ACONF="$OUT/$b.cached.toml" MODE=http-proxy \
      RATE=$RATE_KA EXTRA="--proxy-user alice:$PW" \
      bench/ab-cost.sh $RUSTLE $RUSTLE | tee "$OUT/$b.ka.txt"
  fi
  if has swap; then # the same with the sides swapped: what the side itself weighs
    LEXTRA='auth = true' BCONF="$OUT/$b.cached.toml" ACONF="$OUT/$b.file.toml" MODE=http-proxy \
      RATE=$RATE_KA EXTRA="--proxy-user alice:$PW" \
      bench/ab-cost.sh $RUSTLE $RUSTLE | tee "$OUT/$b.swap.txt"
  fi
  if has close; then
    LEXTRA='auth = true' BCONF="$OUT/$b.file.toml" ACONF="$OUT/$b.cached.toml" MODE=http-proxy \
      RATE=$RATE_CLOSE EXTRA="--close --proxy-user alice:$PW" \
      bench/ab-cost.sh $RUSTLE $RUSTLE | tee "$OUT/$b.close.txt"
  fi
  if has miss; then
    s0=$(server_cpu)
    LEXTRA='auth = true' BCONF="$OUT/$b.cached.toml" ACONF="$OUT/$b.miss.toml" MODE=http-proxy \
      RATE=$MISS_RATE EXTRA="--close --proxy-user alice:$PW" \
      bench/ab-cost.sh $RUSTLE $RUSTLE | tee "$OUT/$b.miss.txt"
    s1=$(server_cpu)
    echo "backend ticks $s0 $s1" >> "$OUT/$b.miss.txt"
  fi

  # Calls a second one worker sustains: unthrottled, cache off ("miss"); the same with
  # the cache on ("cached": no call after the first) and with the users file ("file")
  # show what the rest of the machine allows.
  for c in $(has thr && echo file cached miss); do
    taskset -c 0 $RUSTLE --config "$OUT/$b.$c.full.toml" 2>>"$OUT/$b.thr.log" & PX=$!
    sleep 0.5
    p0=$(cpu $PX); s0=$(server_cpu); t0=$(date +%s.%N); c0=$(cpu1)
    taskset -c 1 $BENCH load --mode http-proxy --proxy 127.0.0.1:13130 --target 127.0.0.1:18091 \
      --path /bytes/1024 --close --proxy-user "alice:$PW" --connections 64 \
      --duration ${DUR}s --warmup 0s --json > "$OUT/$b.thr.$c.json"
    p1=$(cpu $PX); s1=$(server_cpu); t1=$(date +%s.%N); c1=$(cpu1)
    kill $PX; wait $PX 2>/dev/null || true; PX=
    python3 - "$b $c" "$OUT/$b.thr.$c.json" $p0 $p1 $s0 $s1 $t0 $t1 $TCK "$c0" "$c1" <<'P' | tee "$OUT/$b.thr.$c.txt"
import json, sys
b, f = sys.argv[1:3]; p0, p1, s0, s1 = map(int, sys.argv[3:7]); t0, t1 = map(float, sys.argv[7:9])
tck = int(sys.argv[9]); j = json.load(open(f)); wall = t1 - t0
(b0, i0), (b1, i1) = (map(int, a.split(",")) for a in sys.argv[10:12])
print(f"{b} thr: {j['rate_per_s']:.0f} logins/s, errors {j['errors'].get('total', 0)}, "
      f"proxy CPU {(p1 - p0) / tck / wall * 100:.0f}%, backend CPU {(s1 - s0) / tck / wall * 100:.0f}% "
      f"CPU 1 (load, origin, backend) busy {(b1 - b0) / ((b1 - b0) + (i1 - i0)) * 100:.0f}% "
      f"(over {wall:.1f} s)")
P
  done
  # Instructions per kept-alive request (callgrind, user space): the difference between
  # 1,000 and 3,000 requests on one connection, users file against remembered.
  for c in $(has icount && echo file cached); do
    for n in 1000 3000; do
      valgrind --tool=callgrind --callgrind-out-file="$OUT/$b.cg.$c.$n" \
        $RUSTLE --config "$OUT/$b.$c.full.toml" 2>/dev/null & PX=$!
      for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:13130/ && break; sleep 0.2; done
      $BENCH load --mode http-proxy --proxy 127.0.0.1:13130 --target 127.0.0.1:18091 \
        --path /bytes/1024 --proxy-user "alice:$PW" --connections 1 --count $n --json \
        > "$OUT/$b.cg.$c.$n.json"
      kill $PX; wait $PX 2>/dev/null || true; PX=
    done
  done
  if has icount; then
    python3 - "$OUT" "$b" <<'P' | tee "$OUT/$b.icount.txt"
import json, sys
out, b = sys.argv[1:]
per = {}
for c in ("file", "cached"):
    tot = {}
    for n in (1000, 3000):
        j = json.load(open(f"{out}/{b}.cg.{c}.{n}.json"))
        assert j["completed"] == n and j["errors"]["total"] == 0, (c, n, j["errors"])
        tot[n] = next(int(l.split()[1]) for l in open(f"{out}/{b}.cg.{c}.{n}") if l.startswith("summary:"))
    per[c] = (tot[3000] - tot[1000]) / 2000
print(f"{b} icount: users file {per['file']:.0f}, remembered {per['cached']:.0f} instructions "
      f"per kept-alive request (user space): {per['cached'] / per['file']:.4f}")
P
  fi
  exec 3>&-
  kill $SP 2>/dev/null || true; wait $SP 2>/dev/null || true; SP=
  rm -f "$OUT/$b.in"
done

python3 - "$OUT" $BACKENDS <<'P' | tee "$OUT/summary.txt"
import re, statistics as s, sys, os
out, backends = sys.argv[1], sys.argv[2:]
tck = os.sysconf("SC_CLK_TCK")
def rows(f):
    r = []
    for l in open(f):
        x = l.split()
        if len(x) == 8 and x[0].isdigit():
            r.append(x)
    return r
for b in backends:
    for kind in ("ka", "swap", "close"):
        if not os.path.exists(f"{out}/{b}.{kind}.txt"):
            continue
        r = rows(f"{out}/{b}.{kind}.txt"); q = [float(x[3]) for x in r]
        if kind == "swap":  # the backend on the first side: inverted
            q = [1 / v for v in q]; r = [[x[0], x[2], x[1]] + x[3:] for x in r]
        bu = [float(x[1]) for x in r]; au = [float(x[2]) for x in r]
        errs = sum(int(x[6]) + int(x[7]) for x in r)
        print(f"{b} {kind}: users file {s.median(bu):.2f} us, cached backend {s.median(au):.2f} us per request; "
              f"ratio median {s.median(q):.4f} range {min(q):.4f}-{max(q):.4f}; errors {errs}")
    if os.path.exists(f"{out}/{b}.icount.txt"):
        print(open(f"{out}/{b}.icount.txt").read().strip())
    for c in ("file", "cached", "miss"):
        if os.path.exists(f"{out}/{b}.thr.{c}.txt"):
            print(open(f"{out}/{b}.thr.{c}.txt").read().strip())
    if not os.path.exists(f"{out}/{b}.miss.txt"):
        continue
    r = rows(f"{out}/{b}.miss.txt")
    d = [float(x[2]) - float(x[1]) for x in r]; calls = sum(int(x[5]) for x in r)
    t = open(f"{out}/{b}.miss.txt").read().split("backend ticks")[1].split()
    per_call = (int(t[1]) - int(t[0])) / tck * 1e6 / calls
    errs = sum(int(x[6]) + int(x[7]) for x in r)
    print(f"{b} miss: cached {s.median(float(x[1]) for x in r):.2f} us, miss {s.median(float(x[2]) for x in r):.2f} us "
          f"per connection; miss cost median {s.median(d):.2f} us range {min(d):.2f}-{max(d):.2f}; "
          f"backend {per_call:.1f} us CPU per call; errors {errs}")
P
echo "results in $OUT"
