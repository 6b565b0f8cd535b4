#!/usr/bin/env bash
# The whole test suite, on a fresh machine. Build output is cached outside the clone so
# warm runs are quick. The current suite needs nothing installed beyond the Rust
# toolchain: protoc-free, no servers. (The NATS and Kafka integration suites of later
# issues add their installs and loopback servers here.)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/foldgate-target}"
export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --all-targets
