#!/usr/bin/env bash
# Fast-path reply latency from two fold workers competing for two shards' leases, on a
# nats-server started here on a random loopback port (D5; BENCHMARKS.md):
#
#   ./scripts/fast-path-probe.sh [BINDIR]     # BINDIR holds foldgate-fold (default: release)
#
# Prints n, p50/p99/p99.9/max in microseconds, replies over 1 ms and unanswered requests.
set -euo pipefail
export PATH=$HOME/.local/bin:$PATH
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/foldgate-target}"
cd "$(dirname "$0")/.."
cargo build -q --release -p fold-workers --bin foldgate-fold -p ops --example fp_probe
BIN="${1:-$CARGO_TARGET_DIR/release}"
D=$(mktemp -d); PORT=$((20000 + RANDOM % 20000))
nats-server -a 127.0.0.1 -p $PORT -js -sd $D >/dev/null 2>&1 & NS=$!
sleep 0.5
$BIN/foldgate-fold --nats nats://127.0.0.1:$PORT --name a --shards 2 --fleet 1 --lease-ms 500 2>/dev/null & A=$!
$BIN/foldgate-fold --nats nats://127.0.0.1:$PORT --name b --shards 2 --fleet 1 --lease-ms 500 2>/dev/null & B=$!
$CARGO_TARGET_DIR/release/examples/fp_probe nats://127.0.0.1:$PORT 4
kill $A $B; sleep 0.3; kill $NS; wait 2>/dev/null || true; rm -rf "$D"
