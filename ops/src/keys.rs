//! Key ids for operators and benches (D2): `foldgate key-id` turns raw API keys into the
//! ids a policy names, `foldgate bench-policy` prints a policy for seeded bench keys, and
//! `foldgate bench-key` prints one such key. Ids are printed, never the keys they come
//! from, except the one bench key asked for.

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use foldgate_harness::http_tools;
use gateway_node::http::auth::{KeyHasher, KeyIdText, well_formed_key};

/// The node's hash key, from its file (hex).
pub fn hasher_from_file(path: &Path, version: u8) -> Result<KeyHasher> {
    let hex =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(KeyHasher::from_hex(version, &hex)?)
}

/// `foldgate key-id`: standard input's keys, one a line, to their ids on standard output.
pub fn key_id(hash_key_file: &Path, hash_key_version: u8) -> Result<()> {
    let hasher = hasher_from_file(hash_key_file, hash_key_version)?;
    write_key_ids(&hasher, std::io::stdin().lock(), std::io::stdout().lock())
}

/// Each non-blank line of `input`, a key, as its id on a line of `out`.
pub fn write_key_ids(hasher: &KeyHasher, input: impl BufRead, mut out: impl Write) -> Result<()> {
    for (n, line) in input.lines().enumerate() {
        // The error names the line, never its text: that is a key.
        let line = line.with_context(|| format!("reading line {} of standard input", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        // Taken as the gateway takes it, or refused: an id for a key the gateway
        // would trim differently or refuse would be a dead policy entry.
        let Some(raw) = well_formed_key(line.as_bytes()) else {
            bail!(
                "line {} of standard input is not a well-formed API key (8 to 256 \
                 printable ASCII bytes)",
                n + 1
            );
        };
        writeln!(out, "{}", KeyIdText(hasher.key_id(raw)))?;
    }
    Ok(())
}

/// `foldgate bench-policy`: a node config's `[policy]` table putting `keys` bench keys
/// from `key_seed` on one plan of `limit_1s` per second and `limit_60s` per minute.
pub fn bench_policy(
    hasher: &KeyHasher,
    key_seed: u64,
    keys: u64,
    limit_1s: u64,
    limit_60s: u64,
) -> String {
    http_tools::bench_policy_toml(
        hasher,
        key_seed,
        keys,
        &[(1_000, limit_1s), (60_000, limit_60s)],
    )
}

/// `foldgate bench-key`: the bench key `index` from `key_seed`.
pub fn bench_key(key_seed: u64, index: u64) -> String {
    http_tools::bench_key(key_seed, index)
}
