//! Archive files named by the Kafka offset range they account for, as `foldgate-archiver`
//! writes them: `<topic>+<partition>+<first>-<last>.parquet`, offsets zero-padded to 20
//! digits so a directory listing sorts by offset. Kafka topic names cannot hold `+`, so
//! the name splits back without ambiguity. A name is the archiver's only record of what
//! it has written: after a crash it lists these to find where each partition stands.

use std::fs;
use std::path::{Path, PathBuf};

use crate::ArchiveError;
use crate::service::{PARQUET_SUFFIX, TEMP_SUFFIX};

/// One finished file of one partition's offset range, both ends included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeFile {
    pub path: PathBuf,
    pub topic: String,
    pub partition: i32,
    pub first: i64,
    pub last: i64,
}

/// The prefix every file (and temporary file) of one partition starts with.
pub fn partition_prefix(topic: &str, partition: i32) -> String {
    format!("{topic}+{partition}+")
}

pub fn range_file_name(topic: &str, partition: i32, first: i64, last: i64) -> String {
    format!(
        "{}{first:020}-{last:020}{PARQUET_SUFFIX}",
        partition_prefix(topic, partition)
    )
}

/// `(topic, partition, first, last)` of a name `range_file_name` made; `None` for any other
/// file (a node's own files, a compacted day file, a temporary file).
pub fn parse_range_file_name(name: &str) -> Option<(String, i32, i64, i64)> {
    let stem = name.strip_suffix(PARQUET_SUFFIX)?;
    let mut parts = stem.rsplitn(3, '+');
    let range = parts.next()?;
    let partition = parts.next()?.parse().ok()?;
    let topic = parts.next()?;
    let (first, last) = range.split_once('-')?;
    let (first, last): (i64, i64) = (first.parse().ok()?, last.parse().ok()?);
    (!topic.is_empty() && first >= 0 && first <= last)
        .then(|| (topic.to_string(), partition, first, last))
}

/// Every finished range file of `topic` under `table` (all days), for one partition or
/// all, sorted by partition and first offset.
pub fn list_range_files(
    table: &Path,
    topic: &str,
    partition: Option<i32>,
) -> Result<Vec<RangeFile>, ArchiveError> {
    let mut out = Vec::new();
    let Ok(days) = fs::read_dir(table) else {
        return Ok(out);
    };
    for day in days {
        let dir = day.map_err(|e| ArchiveError::io(table, e))?.path();
        if !dir.is_dir() {
            continue;
        }
        for entry in fs::read_dir(&dir).map_err(|e| ArchiveError::io(&dir, e))? {
            let path = entry.map_err(|e| ArchiveError::io(&dir, e))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some((t, p, first, last)) = parse_range_file_name(name) else {
                continue;
            };
            if t == topic && partition.is_none_or(|want| want == p) {
                out.push(RangeFile {
                    path,
                    topic: t,
                    partition: p,
                    first,
                    last,
                });
            }
        }
    }
    out.sort_by_key(|f| (f.partition, f.first, f.last));
    Ok(out)
}

/// Removes the temporary files a crashed writer of this one partition left under `dir`
/// (recursively); returns how many. Scoped to the partition so that a writer owning it
/// never removes a file another writer (compaction, another partition's owner) is
/// still writing.
pub fn remove_partition_leftovers(
    dir: &Path,
    topic: &str,
    partition: i32,
) -> Result<usize, ArchiveError> {
    let prefix = partition_prefix(topic, partition);
    let mut removed = 0;
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(0);
    };
    for entry in entries {
        let path = entry.map_err(|e| ArchiveError::io(dir, e))?.path();
        if path.is_dir() {
            removed += remove_partition_leftovers(&path, topic, partition)?;
            continue;
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(&prefix) && name.ends_with(TEMP_SUFFIX) {
            fs::remove_file(&path).map_err(|e| ArchiveError::io(&path, e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_offset() {
        let a = range_file_name("foldgate.limit-events", 2, 9, 120);
        let b = range_file_name("foldgate.limit-events", 2, 121, 1_000);
        assert_eq!(
            parse_range_file_name(&a),
            Some(("foldgate.limit-events".into(), 2, 9, 120))
        );
        assert!(a < b);
        assert_eq!(parse_range_file_name("node1-e2-s1-5.parquet"), None);
        assert_eq!(parse_range_file_name(&format!("{a}{TEMP_SUFFIX}")), None);
        assert_eq!(parse_range_file_name("t+1+5-4.parquet"), None);
    }

    #[test]
    fn lists_one_partition_and_removes_only_its_leftovers() {
        let root = tempfile::tempdir().unwrap();
        let day = root.path().join("day=2026-12-06");
        fs::create_dir_all(&day).unwrap();
        for (p, a, b) in [(0, 0, 9), (1, 0, 4), (0, 10, 19)] {
            fs::write(day.join(range_file_name("t", p, a, b)), b"x").unwrap();
        }
        let mine = format!("{}{TEMP_SUFFIX}", range_file_name("t", 0, 20, 29));
        let other = format!("{}{TEMP_SUFFIX}", range_file_name("t", 1, 5, 9));
        fs::write(day.join(&mine), b"x").unwrap();
        fs::write(day.join(&other), b"x").unwrap();
        let files = list_range_files(root.path(), "t", Some(0)).unwrap();
        let ranges: Vec<_> = files.iter().map(|f| (f.first, f.last)).collect();
        assert_eq!(ranges, [(0, 9), (10, 19)]);
        assert_eq!(remove_partition_leftovers(root.path(), "t", 0).unwrap(), 1);
        assert!(!day.join(mine).exists());
        assert!(day.join(other).exists());
    }
}
