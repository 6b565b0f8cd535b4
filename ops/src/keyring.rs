//! The hash-key keyring (P3, ADR-7): the versioned HMAC secrets that turn raw API keys
//! into key ids, in one TOML file given by `--keyring FILE`:
//!
//! ```toml
//! [[key]]
//! version = 1
//! created = "2026-12-06T10:00:00Z"
//! secret_hex = "…64 hex digits…"
//!
//! [[key]]
//! version = 2
//! created = "2026-12-06T11:00:00Z"
//! destroyed = "2026-12-07T09:00:00Z"   # its secret is gone; the version is never reused
//! ```
//!
//! The file is a secret: it is written with mode 0600 (and refused when group or others
//! can read it), never inside the archive, and no command prints or logs a key's bytes.
//! A version with a secret is *retained*: subject access, erasure and `history
//! --keys-from` hash under every retained version.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, Result, bail};
use gateway_node::http::auth::KeyHasher;
use serde::{Deserialize, Serialize};

#[derive(Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Keyring {
    #[serde(default, rename = "key")]
    pub keys: Vec<KeyEntry>,
}

#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub version: u8,
    /// RFC 3339, UTC.
    pub created: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_hex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destroyed: Option<String>,
}

impl std::fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("KeyEntry")
            .field("version", &self.version)
            .field("created", &self.created)
            .field("destroyed", &self.destroyed)
            .finish_non_exhaustive()
    }
}

pub fn now_text() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Refuses a keyring inside the archive: the archive is shared with readers of history,
/// and the secrets would let them hash guessed keys.
pub fn check_outside(keyring: &Path, archive: &Path) -> Result<()> {
    let abs = |p: &Path| -> Result<std::path::PathBuf> {
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir()?.join(p)
        };
        // The keyring may not exist yet: resolve its folder.
        Ok(match (p.parent(), p.file_name()) {
            (Some(dir), Some(name)) if dir.exists() => dir.canonicalize()?.join(name),
            _ => p,
        })
    };
    let archive_abs = if archive.exists() {
        archive.canonicalize()?
    } else {
        abs(archive)?
    };
    if abs(keyring)?.starts_with(&archive_abs) {
        bail!(
            "the keyring must not be inside the archive ({})",
            archive.display()
        );
    }
    Ok(())
}

impl Keyring {
    /// Reads the keyring; refuses one that group or others may read.
    pub fn load(path: &Path) -> Result<Self> {
        let meta = fs::metadata(path).with_context(|| {
            format!(
                "keyring {}: not found (create it with `foldgate hash-key add`)",
                path.display()
            )
        })?;
        if meta.permissions().mode() & 0o077 != 0 {
            bail!(
                "keyring {} is readable by group or others: chmod 600 it",
                path.display()
            );
        }
        let text = fs::read_to_string(path)
            .with_context(|| format!("reading keyring {}", path.display()))?;
        // The parse error could quote a line: a secret. Name the file only.
        let ring: Keyring = toml::from_str(&text).map_err(|_| {
            anyhow::anyhow!("keyring {} is not a valid keyring file", path.display())
        })?;
        Ok(ring)
    }

    pub fn load_or_empty(path: &Path) -> Result<Self> {
        if path.exists() {
            Self::load(path)
        } else {
            Ok(Self::default())
        }
    }

    /// Writes the keyring crash-safe with mode 0600 from its creation.
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        fs::create_dir_all(&dir)?;
        let temp = path.with_extension("tmp");
        let text = format!(
            "# Foldgate hash-key keyring: SECRETS. Mode 0600; keep it out of the archive.\n{}",
            toml::to_string(self).context("encoding the keyring")?
        );
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)
            .with_context(|| format!("writing {}", temp.display()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&temp, path)?;
        fs::File::open(&dir)?.sync_all()?;
        Ok(())
    }

    /// Adds a version (one above every version ever used) holding `secret`, or 32 fresh
    /// random bytes. Returns the version.
    pub fn add(&mut self, secret: Option<Vec<u8>>) -> Result<u8> {
        let next = self.keys.iter().map(|k| k.version).max().unwrap_or(0);
        let version = next
            .checked_add(1)
            .context("all 255 hash key versions are used")?;
        let secret = match secret {
            Some(s) => s,
            None => foldgate_archive::erasure::random_bytes(32).context("reading /dev/urandom")?,
        };
        // Checked as the node checks it (length, version).
        KeyHasher::new(version, &secret)?;
        self.keys.push(KeyEntry {
            version,
            created: now_text(),
            secret_hex: Some(foldgate_archive::audit::hex(&secret)),
            destroyed: None,
        });
        Ok(version)
    }

    /// Forgets a version's secret; the entry stays, so the version is never reused.
    pub fn destroy(&mut self, version: u8) -> Result<()> {
        let Some(k) = self.keys.iter_mut().find(|k| k.version == version) else {
            bail!("no hash key version {version} in the keyring");
        };
        if k.secret_hex.is_none() {
            bail!("hash key version {version} is already destroyed");
        }
        k.secret_hex = None;
        k.destroyed = Some(now_text());
        Ok(())
    }

    /// A hasher per retained version, newest first.
    pub fn hashers(&self) -> Result<Vec<KeyHasher>> {
        let mut out = Vec::new();
        let mut keys: Vec<&KeyEntry> = self.keys.iter().collect();
        keys.sort_by_key(|k| std::cmp::Reverse(k.version));
        for k in keys {
            if let Some(hex) = &k.secret_hex {
                out.push(
                    KeyHasher::from_hex(k.version, hex)
                        .with_context(|| format!("hash key version {}", k.version))?,
                );
            }
        }
        Ok(out)
    }

    pub fn retained_versions(&self) -> Vec<u8> {
        let mut v: Vec<u8> = self
            .keys
            .iter()
            .filter(|k| k.secret_hex.is_some())
            .map(|k| k.version)
            .collect();
        v.sort_unstable();
        v
    }
}

/// Hashers of a keyring that must hold at least one retained version.
pub fn retained_hashers(path: &Path) -> Result<(Vec<KeyHasher>, Vec<u8>)> {
    let ring = Keyring::load(path)?;
    let hashers = ring.hashers()?;
    if hashers.is_empty() {
        bail!("keyring {} holds no retained hash key", path.display());
    }
    Ok((hashers, ring.retained_versions()))
}
