//! Where a partition stands, read from the archive itself rather than from Kafka: the
//! committed offset can lag the files by one write (a crash between the rename and the
//! commit), so the file names are the truth. Files of one partition are written in offset
//! order, each renamed whole, and their ranges tile the offsets read; so every offset up
//! to the highest `last` in a name is archived (or quarantined, or dropped on purpose),
//! and a message at or below it is skipped when read again.

use std::collections::{HashSet, VecDeque};
use std::path::Path;

use bus_schemas::EventId;
use foldgate_archive::ArchiveError;
use foldgate_archive::encoder::decode;
use foldgate_archive::ranges::list_range_files;
use foldgate_archive::reader::read_file;

/// The highest offset a finished file of `topic`/`partition` accounts for.
pub fn archived_to(
    events_dir: &Path,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, ArchiveError> {
    Ok(list_range_files(events_dir, topic, Some(partition))?
        .iter()
        .map(|f| f.last)
        .max())
}

/// The event ids of the partition's newest file, to seed de-duplication across a restart.
/// A file that does not read gives none (and the reason), never a failed start.
pub fn newest_ids(
    events_dir: &Path,
    topic: &str,
    partition: i32,
) -> Result<Vec<EventId>, ArchiveError> {
    let files = list_range_files(events_dir, topic, Some(partition))?;
    let Some(newest) = files.iter().max_by_key(|f| f.last) else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::new();
    for batch in read_file(&newest.path)? {
        ids.extend(decode(&batch)?.into_iter().map(|e| e.id));
    }
    Ok(ids)
}

/// The last `capacity` event ids seen on a partition: a producer that retried without
/// idempotence puts one event at two nearby offsets, and keying by key id keeps both on
/// one partition, so a window per partition catches them.
#[derive(Debug)]
pub struct RecentIds {
    capacity: usize,
    set: HashSet<EventId>,
    order: VecDeque<EventId>,
}

impl RecentIds {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            set: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// False when `id` is already in the window (a duplicate); else remembers it.
    pub fn insert(&mut self, id: EventId) -> bool {
        if self.capacity == 0 {
            return true;
        }
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schemas::{NodeEpoch, NodeId};

    fn id(seq: u64) -> EventId {
        EventId {
            node: NodeId(1),
            node_epoch: NodeEpoch(1),
            seq,
        }
    }

    #[test]
    fn the_window_forgets_the_oldest() {
        let mut r = RecentIds::new(2);
        assert!(r.insert(id(1)));
        assert!(!r.insert(id(1)));
        assert!(r.insert(id(2)));
        assert!(r.insert(id(3)));
        assert!(r.insert(id(1)), "1 left the window");
        assert_eq!(r.len(), 2);
    }
}
