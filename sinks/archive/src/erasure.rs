//! Erasure (E5, ADR-7): a subject's rows out of every archive file, raw and roll-up, each
//! file rewritten crash-safe without them; and the erased-key set, which lets the archiver
//! drop the subject's events if they arrive again from Kafka (a replay, a late partition).
//!
//! The erased-key set must answer "is this key id erased?" without keeping the key ids:
//! a list of erased ids would itself name the subjects. It keeps HMAC-SHA256 of each
//! erased key id text under a random salt of this archive (`erasure/salt`, mode 0600):
//! the set alone names nobody, and testing a candidate needs both the salt and a key id,
//! which itself needs the raw key and a live hash key. Once the hash versions involved are
//! destroyed (`foldgate hash-key destroy`), no one can compute the ids again.

use std::collections::{BTreeSet, HashSet};
use std::fs::{self, File};
use std::io::Read;
use std::path::Path;

use arrow::array::{Array, BooleanArray};
use arrow::compute::filter_record_batch;
use hmac::{Hmac, KeyInit, Mac};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sha2::Sha256;

use crate::ArchiveError;
use crate::compact::{COMPACTED_PREFIX, days_in, parquet_files, relative};
use crate::config::ArchiveLayout;
use crate::encoder::{rollup_schema, schema};
use crate::service::{
    AtomicParquet, compacted_properties, remove_durably, write_bytes_atomic, writer_properties,
};

pub const SALT_FILE: &str = "salt";
pub const ERASED_FILE: &str = "erased-keys.txt";

/// The erased key ids, as salted digests (see the module's note).
#[derive(Clone, Debug, Default)]
pub struct ErasedKeys {
    salt: Option<Vec<u8>>,
    digests: HashSet<String>,
}

impl ErasedKeys {
    /// The archive's erased-key set; empty when nothing was ever erased.
    pub fn load(layout: &ArchiveLayout) -> Result<ErasedKeys, ArchiveError> {
        let dir = layout.erasure_dir();
        let salt_path = dir.join(SALT_FILE);
        let salt = match fs::read_to_string(&salt_path) {
            Ok(hex) => Some(
                decode_hex(hex.trim())
                    .ok_or_else(|| ArchiveError::io(&salt_path, bad_data("not hex")))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ArchiveError::io(&salt_path, e)),
        };
        let set_path = dir.join(ERASED_FILE);
        let digests = match fs::read_to_string(&set_path) {
            Ok(text) => text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
            Err(e) => return Err(ArchiveError::io(&set_path, e)),
        };
        if salt.is_none() && !digests.is_empty() {
            return Err(ArchiveError::io(
                &salt_path,
                bad_data("erased keys without a salt"),
            ));
        }
        Ok(ErasedKeys { salt, digests })
    }

    /// Whether the key id (`v<version>:<hex>`) was erased.
    pub fn contains(&self, key_id_text: &str) -> bool {
        match &self.salt {
            Some(salt) if !self.digests.is_empty() => {
                self.digests.contains(&digest(salt, key_id_text))
            }
            _ => false,
        }
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }
}

fn bad_data(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string())
}

fn digest(salt: &[u8], key_id_text: &str) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(salt).expect("any key length");
    mac.update(key_id_text.as_bytes());
    crate::audit::hex(&mac.finalize().into_bytes())
}

pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `n` bytes from the kernel's random source.
pub fn random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf)
}

/// Adds `key_ids` to the archive's erased-key set (making its salt on first use) and
/// rewrites the set crash-safe. Returns how many entries the set has.
pub fn record_erased<'a>(
    layout: &ArchiveLayout,
    key_ids: impl IntoIterator<Item = &'a str>,
) -> Result<usize, ArchiveError> {
    let dir = layout.erasure_dir();
    let mut set = ErasedKeys::load(layout)?;
    let salt = match set.salt.clone() {
        Some(s) => s,
        None => {
            let salt = random_bytes(32).map_err(|e| ArchiveError::io(&dir, e))?;
            let path = write_bytes_atomic(&dir, SALT_FILE, crate::audit::hex(&salt).as_bytes())?;
            restrict(&path)?;
            salt
        }
    };
    for k in key_ids {
        set.digests.insert(digest(&salt, k));
    }
    let mut lines: Vec<&String> = set.digests.iter().collect();
    lines.sort();
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    write_bytes_atomic(&dir, ERASED_FILE, text.as_bytes())?;
    Ok(set.digests.len())
}

/// Owner read/write only: the salt is what makes the set's digests checkable.
pub fn restrict(path: &Path) -> Result<(), ArchiveError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(|e| ArchiveError::io(path, e))
}

/// What erasure did to one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileErasure {
    /// Archive-relative name.
    pub file: String,
    pub rows_before: u64,
    pub rows_removed: u64,
    /// The file held nothing else, and is gone.
    pub removed: bool,
}

/// The outcome of [`erase_rows`].
#[derive(Debug, Default)]
pub struct Erasure {
    pub files: Vec<FileErasure>,
    /// Files that could not be read (and so could not be checked): an operator must look.
    pub warnings: Vec<String>,
}

/// Rewrites every raw and roll-up file of the archive that holds a row of `key_ids`
/// without those rows (every day, today's too, and files a merge already absorbed).
pub fn erase_rows(
    layout: &ArchiveLayout,
    key_ids: &HashSet<String>,
) -> Result<Erasure, ArchiveError> {
    let keys: BTreeSet<String> = key_ids.iter().cloned().collect();
    let mut out = Erasure::default();
    for (table, expected) in [
        (layout.events_dir(), schema()),
        (layout.rollup_dir(), rollup_schema()),
    ] {
        for day in days_in(&table) {
            let dir = ArchiveLayout::day_dir(&table, day);
            for path in parquet_files(&dir) {
                match erase_in_file(layout, &path, &expected, &keys) {
                    Ok(Some(e)) => out.files.push(e),
                    Ok(None) => {}
                    Err(e) => out
                        .warnings
                        .push(format!("{}: not checked ({e})", path.display())),
                }
            }
        }
    }
    Ok(out)
}

fn erase_in_file(
    layout: &ArchiveLayout,
    path: &Path,
    expected: &arrow::datatypes::SchemaRef,
    keys: &BTreeSet<String>,
) -> Result<Option<FileErasure>, ArchiveError> {
    let open = || -> Result<ParquetRecordBatchReaderBuilder<File>, ArchiveError> {
        let file = File::open(path).map_err(|e| ArchiveError::io(path, e))?;
        let b = ParquetRecordBatchReaderBuilder::try_new(file)?;
        if b.schema().fields() != expected.fields() {
            return Err(ArchiveError::Schema("key_id"));
        }
        Ok(b)
    };
    let b = open()?;
    let rows_before = b.metadata().file_metadata().num_rows().max(0) as u64;
    let groups = crate::reader::row_groups_for_keys(b.metadata(), keys);
    if groups.is_empty() {
        return Ok(None);
    }
    // Count first, reading the key column of candidate groups only: most files hold none.
    let mask = ProjectionMask::columns(b.parquet_schema(), ["key_id"]);
    let mut matches = 0u64;
    for batch in b.with_row_groups(groups).with_projection(mask).build()? {
        let batch = batch?;
        let ids = crate::encoder::key_ids(&batch)?;
        matches += (0..ids.len())
            .filter(|&i| keys.contains(ids.value(i)))
            .count() as u64;
    }
    if matches == 0 {
        return Ok(None);
    }
    let file = relative(&layout.root, path);
    if matches == rows_before {
        remove_durably(path)?;
        return Ok(Some(FileErasure {
            file,
            rows_before,
            rows_removed: matches,
            removed: true,
        }));
    }
    let b = open()?;
    // The merge bookkeeping in the footer (what a compacted file absorbed) must survive.
    let metadata: Vec<(String, String)> = b
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .into_iter()
        .flatten()
        .filter(|kv| kv.key.starts_with("foldgate."))
        .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?)))
        .collect();
    let kv: Vec<(&str, String)> = metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = path.parent().unwrap_or(Path::new("."));
    let properties = if name.starts_with(COMPACTED_PREFIX) {
        compacted_properties()
    } else {
        writer_properties()
    };
    let mut w = AtomicParquet::create(dir, &name, expected.clone(), properties, &kv)?;
    for batch in b.build()? {
        let batch = batch?;
        let ids = crate::encoder::key_ids(&batch)?;
        let keep: BooleanArray = (0..ids.len())
            .map(|i| Some(!keys.contains(ids.value(i))))
            .collect();
        let kept = filter_record_batch(&batch, &keep)?;
        if kept.num_rows() > 0 {
            w.write(&kept)?;
        }
    }
    let rows_left = w.rows();
    w.commit()?;
    Ok(Some(FileErasure {
        file,
        rows_before,
        rows_removed: rows_before - rows_left,
        removed: false,
    }))
}

/// Where the archive's erasure salt lives.
pub fn salt_path(layout: &ArchiveLayout) -> std::path::PathBuf {
    layout.erasure_dir().join(SALT_FILE)
}
