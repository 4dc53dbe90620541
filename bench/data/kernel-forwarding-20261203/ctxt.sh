#!/usr/bin/env bash
# Context switches of the whole machine per kept-alive CONNECT exchange (/proc/stat ctxt),
# rustle with kernel_forwarding "require" against "off": one worker on CPU 1, the origin
# and the load (64 connections, 10,000 exchanges/s, 5 s after 1 s of warm-up) on CPU 0, in
# a network namespace of its own (root). Run from the repository after
# `cargo build --release -p rustle -p rustle-bench`; prints the lines kept in ctxt.txt.
set -euo pipefail
if [[ ${IN_NS:-0} != 1 ]]; then exec unshare -n -- env IN_NS=1 bash "$0"; fi
ip link set lo up
B=target/release/rustle-bench; R=target/release/rustle
taskset -c 0 $B origin --listen 127.0.0.1:18200 >/dev/null 2>&1 & OP=$!
sleep 0.5
for rep in 1 2 3; do
for mode in require off; do
  printf '[relay]\nkernel_forwarding = "%s"\n' $mode > /tmp/kf-$mode.toml
  taskset -c 1 $R --config /tmp/kf-$mode.toml --http=127.0.0.1:18201 --workers 1 --log off >/dev/null 2>&1 & P=$!
  sleep 0.5
  taskset -c 0 $B load --json --mode connect --proxy 127.0.0.1:18201 --target 127.0.0.1:18200 --connections 64 --rate 10000 --duration 5s --warmup 1s > /tmp/ld.json 2>/dev/null & L=$!
  sleep 1
  c0=$(awk '/^ctxt/ {print $2}' /proc/stat)
  wait $L
  c1=$(awk '/^ctxt/ {print $2}' /proc/stat)
  n=$(python3 -c 'import json;print(json.load(open("/tmp/ld.json"))["completed"])')
  echo "rep $rep $mode: context switches per exchange $(python3 -c "print(round(($c1-$c0)/$n,2))")"
  kill $P; wait $P 2>/dev/null || true
done; done
kill $OP
