//! Events into archive files: split by UTC day, at most `file_events_max` per file, each
//! file written crash-safe (`service::write_atomic`). The caller names the files, so that
//! the same events always map to the same name: a node names them by its event ids, the
//! archiver by topic, partition and offset range.

use std::path::PathBuf;

use bus_schemas::LimitEvent;

use crate::ArchiveError;
use crate::config::{ArchiveLayout, SinkConfig};
use crate::encoder::{day_of, encode};
use crate::service::{PARQUET_SUFFIX, write_atomic};

/// `node<N>-e<epoch>-s<first>-<last>.parquet`: a node's events name their file, so two
/// node epochs never write the same name.
pub fn node_file_name(events: &[LimitEvent]) -> String {
    match (events.first(), events.last()) {
        (Some(a), Some(b)) => format!(
            "node{}-e{}-s{}-{}{PARQUET_SUFFIX}",
            a.id.node.0, a.id.node_epoch.0, a.id.seq, b.id.seq
        ),
        _ => format!("empty{PARQUET_SUFFIX}"),
    }
}

/// What a write left on disk: whole files, and the events in them.
#[derive(Debug, Default)]
pub struct Written {
    pub files: Vec<PathBuf>,
    pub events: usize,
}

/// A write that stopped part way: the files before the error stay, each whole.
#[derive(Debug, thiserror::Error)]
#[error("{error} (after {} events in {} files)", written.events, written.files.len())]
pub struct PartialWrite {
    pub written: Written,
    pub error: ArchiveError,
}

/// Writes `events` under `layout`'s `events/` table, one file per day and chunk, named by
/// `name`.
pub fn write_events(
    config: &SinkConfig,
    events: &[LimitEvent],
    name: impl Fn(&[LimitEvent]) -> String,
) -> Result<Written, PartialWrite> {
    let table = config.layout.events_dir();
    let mut written = Written::default();
    let mut by_day: Vec<(i32, Vec<&LimitEvent>)> = Vec::new();
    for e in events {
        let day = day_of(e.at_ms);
        match by_day.iter_mut().find(|(d, _)| *d == day) {
            Some((_, v)) => v.push(e),
            None => by_day.push((day, vec![e])),
        }
    }
    for (day, day_events) in by_day {
        let dir = ArchiveLayout::day_dir(&table, day);
        for chunk in day_events.chunks(config.file_events_max.max(1)) {
            let owned: Vec<LimitEvent> = chunk.iter().map(|e| (*e).clone()).collect();
            match write_atomic(&dir, &name(&owned), &[encode(&owned)]) {
                Ok(file) => {
                    written.files.push(file);
                    written.events += owned.len();
                }
                Err(error) => return Err(PartialWrite { written, error }),
            }
        }
    }
    Ok(written)
}
