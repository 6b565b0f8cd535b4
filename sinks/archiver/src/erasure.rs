//! The archiver's side of erasure (E5, ADR-7): an erased subject's events that arrive
//! again from Kafka (a replay, a late partition) are dropped here rather than written back
//! into the archive the eraser cleaned.

/// Which hashed key ids are erased. The archiver asks once per event, before the event
/// joins a file; an event whose key is erased is dropped and counted
/// (`foldgate_archiver_erased_dropped_total`), its offset still accounted for by the file
/// that covers it.
///
/// The erasure work plugs its erased-key set in by implementing this trait (for example
/// over the keys its audit records name, in every hash version) and handing it to
/// [`crate::consumer::Archiver::with_erased`]. Until then [`NothingErased`] is used.
pub trait ErasedKeys: Send {
    /// Whether events of `key_id_text` (`v<version>:<32 hex>`, as the archive stores
    /// `key_id`) must not be archived.
    fn erased(&self, key_id_text: &str) -> bool;

    /// True when no key can be erased, so the archiver skips formatting each key id.
    fn erases_nothing(&self) -> bool {
        false
    }
}

/// The default: nothing erased.
#[derive(Clone, Copy, Debug, Default)]
pub struct NothingErased;

impl ErasedKeys for NothingErased {
    fn erased(&self, _key_id_text: &str) -> bool {
        false
    }

    fn erases_nothing(&self) -> bool {
        true
    }
}

/// A fixed set, for tests and for an eraser that loads its list once.
impl ErasedKeys for std::collections::HashSet<String> {
    fn erased(&self, key_id_text: &str) -> bool {
        self.contains(key_id_text)
    }

    fn erases_nothing(&self) -> bool {
        self.is_empty()
    }
}
