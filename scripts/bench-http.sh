#!/usr/bin/env bash
# Added latency of the limiter (issue 5, S1): the same foldgate-node with the limiter on
# and off, and the upstream straight, at 2,778 req/s open loop, interleaved in one run;
# then maximum throughput on/off (closed loop), and oha as the external cross-check.
#   ./scripts/bench-http.sh [seconds_per_run] [reps]
# AA=1 adds, in every rep, an A/A pair: two identical limiter-off nodes interleaved the same
# way, whose difference is the noise floor the on-vs-off difference has to be read against.
# Prints JSON lines; BENCHMARKS.md quotes them. Everything binds 127.0.0.1 and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-10}
REPS=${2:-3}
RATE=${RATE:-2778}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/foldgate-target}
cargo build --release -q -p ops --bin foldgate -p gateway-node --bin foldgate-node
BIN=$CARGO_TARGET_DIR/release
DIR=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT

port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$DIR/hash-key.hex"
"$BIN/foldgate" bench-policy --hash-key-file "$DIR/hash-key.hex" --keys 100 --key-seed 1 > "$DIR/policy.toml"

UP=$(port); ON=$(port); OFF=$(port); ONA=$(port); OFFA=$(port); OFF2=$(port); OFF2A=$(port)
"$BIN/foldgate" upstream --listen 127.0.0.1:$UP 2>/dev/null & PIDS+=($!)
node() { # port admin limiter
  { echo "server.listen = \"127.0.0.1:$1\""; echo "server.admin_listen = \"127.0.0.1:$2\"";
    echo "upstream.urls = [\"http://127.0.0.1:$UP\"]"; echo "hash_key_file = \"$DIR/hash-key.hex\"";
    echo "limiter_enabled = $3"; echo 'log_level = "warn"'; cat "$DIR/policy.toml"; } > "$DIR/node-$1.toml"
  "$BIN/foldgate-node" --config "$DIR/node-$1.toml" 2>>"$DIR/node-$1.log" & PIDS+=($!)
}
node $ON $ONA true
node $OFF $OFFA false
ADMINS="$ONA $OFFA"
if [ "${AA:-0}" = 1 ]; then node $OFF2 $OFF2A false; ADMINS="$ADMINS $OFF2A"; fi
for a in $ADMINS; do
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$a/readyz" >/dev/null && break; sleep 0.05; done
done

bench() { "$BIN/foldgate" bench http --target "http://127.0.0.1:$1" --rate "$2" --seconds "$3" --keys 100 --key-seed 1 "${@:4}"; }
echo "# machine: $(nproc) vCPU, $(uname -r); rate $RATE req/s, $SECONDS_PER_RUN s per run, $REPS reps"
# Warm-up: connections pooled, buckets created and credited.
for p in $UP $ON $OFF; do bench $p $RATE 2 >/dev/null; done
if [ "${AA:-0}" = 1 ]; then bench $OFF2 $RATE 2 >/dev/null; fi
name_of() { case $1 in $UP) echo "$2";; $ON) echo limiter_on;; $OFF) echo "limiter_off${OFFB:+_b}${OFFAA:+_aa}";; $OFF2) echo limiter_off2;; esac; }
# Each rep is two paired runs. In a pair, arrivals interleave between two targets (each at
# $RATE req/s), so both sides see the same moments of a shared 2-vCPU machine: on vs off
# (the limiter's cost), then off vs direct (the proxy hop). The order in a pair turns each
# rep, so any first-target bias cancels out.
pair() { # rep a b upstream-name
  bench "$2" $RATE "$SECONDS_PER_RUN" --target "http://127.0.0.1:$3" | {
    read -r first; read -r second
    echo "{\"run\":\"$(name_of "$2" "$4")\",\"rep\":$1,\"report\":$first}"
    echo "{\"run\":\"$(name_of "$3" "$4")\",\"rep\":$1,\"report\":$second}"
  }
}
for r in $(seq "$REPS"); do
  if [ $((r % 2)) = 1 ]; then pair "$r" $ON $OFF direct; OFFB=1 pair "$r" $OFF $UP direct
  else pair "$r" $OFF $ON direct; OFFB=1 pair "$r" $UP $OFF direct; fi
  if [ "${AA:-0}" = 1 ]; then
    if [ $((r % 2)) = 1 ]; then OFFAA=1 pair "$r" $OFF $OFF2 direct; else OFFAA=1 pair "$r" $OFF2 $OFF direct; fi
  fi
done
# The node's own histogram of time spent in the limiter, for the same runs.
curl -fs "http://127.0.0.1:$ONA/metrics" | grep -E '^foldgate_(limiter_added_latency_seconds_(bucket|count|sum)|fast_path_triggered_total|decisions_total)' | sed 's/^/# /'

# Maximum throughput, closed loop with 64 connections: oha (external) and the limiter on/off.
KEY=$("$BIN/foldgate" bench-key --key-seed 1 --index 0)
if command -v oha >/dev/null; then
  for r in $(seq "$REPS"); do
    if [ $((r % 2)) = 1 ]; then ORDER="$ON $OFF"; else ORDER="$OFF $ON"; fi
    for p in $ORDER; do
      name=$([ $p = $ON ] && echo limiter_on || echo limiter_off)
      out=$(oha -z "${MAX_SECONDS:-5}s" -c 64 --no-tui --output-format json -H "Authorization: Bearer $KEY" "http://127.0.0.1:$p/" 2>/dev/null)
      echo "{\"run\":\"oha_max_$name\",\"rep\":$r,\"rps\":$(echo "$out" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(round(d["summary"]["requestsPerSec"],1))'),\"p50_us\":$(echo "$out" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(round(d["latencyPercentiles"]["p50"]*1e6,1))'),\"p99_us\":$(echo "$out" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(round(d["latencyPercentiles"]["p99"]*1e6,1))'),\"status\":$(echo "$out" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(json.dumps(d["statusCodeDistribution"]))')}"
    done
  done
  # Cross-check of the open-loop figure: oha at a fixed rate on the limiter-on node.
  out=$(oha -z "${SECONDS_PER_RUN}s" -q "$RATE" -c 32 --latency-correction --no-tui --output-format json -H "Authorization: Bearer $KEY" "http://127.0.0.1:$ON/" 2>/dev/null)
  echo "{\"run\":\"oha_rate_limiter_on\",\"rate\":$RATE,\"p50_us\":$(echo "$out" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(round(d["latencyPercentiles"]["p50"]*1e6,1))'),\"p99_us\":$(echo "$out" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(round(d["latencyPercentiles"]["p99"]*1e6,1))'),\"status\":$(echo "$out" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(json.dumps(d["statusCodeDistribution"]))')}"
else
  echo "# oha not installed (cargo install oha --locked): no external cross-check"
fi
