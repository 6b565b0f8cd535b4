//! D8's backstop: the per-key floor that bounds fail-open admissions.
//!
//! Kept apart from the decision path because it only runs when the limiter itself has
//! failed (a fault, a stalled reconciler, a full map), and the edge guard (`http::edge`)
//! uses it on its own.

use std::sync::atomic::{AtomicU64, Ordering};

use bus_schemas::KeyId;

/// D8's per-key backstop floor for fail-open admissions: per-second counters indexed by
/// key hash, in two rows indexed by different bits of it (a count-min sketch of depth 2).
/// Every admission of a hash is counted in both of its slots, and a hash is turned away
/// only when both are full: one row of 65,536 slots puts ~78% of 10^5 keys in a shared
/// slot, and one key flooding its slot would 429 every key beside it for the rest of each
/// second. A key's own admissions still stay within its floor (its row-1 slot counts every
/// one of them; concurrent deciders may pass it by their number), so collisions make the
/// bound stricter, never looser. Allocated once, at construction. The edge guard (`http::edge`) keeps its
/// per-key floor and its fleet ceiling in one too.
pub struct Backstop {
    rows: [Box<[AtomicU64]>; 2],
}

const BACKSTOP_SLOTS: usize = 1 << 16;
/// A slot is its second (the high 32 bits) and the count admitted in it (the low 32).
const SECOND_SHIFT: u32 = 32;
const COUNT_MAX: u64 = u32::MAX as u64;

impl Default for Backstop {
    fn default() -> Self {
        Self::new()
    }
}

impl Backstop {
    pub fn new() -> Self {
        let row = || (0..BACKSTOP_SLOTS).map(|_| AtomicU64::new(0)).collect();
        Self {
            rows: [row(), row()],
        }
    }

    pub(super) fn try_admit(&self, key: KeyId, wall_ms: u64, floor_per_s: u64) -> bool {
        self.try_admit_hash(key.hash64(), wall_ms, floor_per_s)
    }

    /// One admission for whatever hashes to `hash` in the second `wall_ms` falls in, if
    /// either of its slots admitted fewer than `floor_per_s` in it.
    pub fn try_admit_hash(&self, hash: u64, wall_ms: u64, floor_per_s: u64) -> bool {
        // Whole seconds since the epoch fit the slot's 32 bits until 2106.
        let second = (wall_ms / 1_000).min(u64::from(u32::MAX));
        let first = &self.rows[0][(hash as usize) & (BACKSTOP_SLOTS - 1)];
        let other = &self.rows[1][((hash >> 32) as usize) & (BACKSTOP_SLOTS - 1)];
        if Self::count(first, second, floor_per_s) {
            // Counted past the floor if need be: this slot must know every admission of
            // the hash for the bound to hold once the first is full.
            Self::count(other, second, u64::MAX);
            return true;
        }
        Self::count(other, second, floor_per_s)
    }

    /// Counts one in `slot` for `second` if it holds fewer than `below`.
    fn count(slot: &AtomicU64, second: u64, below: u64) -> bool {
        let mut cur = slot.load(Ordering::Acquire);
        loop {
            let (sec, count) = (cur >> SECOND_SHIFT, cur & COUNT_MAX);
            // Only a later second starts the count again. A call with an earlier one (a
            // clock read before a wait) counts against the slot's second: resetting on it
            // would give the second's keys their floor twice over.
            let next = if second > sec {
                (second << SECOND_SHIFT) | 1
            } else if count < below.min(COUNT_MAX) {
                cur + 1
            } else {
                return false;
            };
            match slot.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Backstop;

    const FLOOR: u64 = 5;
    const T: u64 = 1_000_000;

    fn admitted(b: &Backstop, hash: u64, tries: u64) -> u64 {
        (0..tries)
            .filter(|_| b.try_admit_hash(hash, T, FLOOR))
            .count() as u64
    }

    #[test]
    fn a_hash_alone_gets_its_floor_a_second_and_again_the_next() {
        let b = Backstop::new();
        assert_eq!(admitted(&b, 42, 100), FLOOR);
        assert!(b.try_admit_hash(42, T + 1_000, FLOOR), "a new second");
    }

    /// A flood in one slot does not 429 every key sharing it for the rest of the second.
    #[test]
    fn a_flood_sharing_one_slot_leaves_its_neighbour_its_floor() {
        let b = Backstop::new();
        let flood = 0x0000_0001_0000_0007;
        let neighbour = 0x0000_0002_0000_0007; // same first slot, another second slot
        assert_eq!(admitted(&b, flood, 1_000), FLOOR);
        assert_eq!(admitted(&b, neighbour, 1_000), FLOOR);
    }

    /// Whatever its neighbours did first, a hash never gets more than its floor.
    #[test]
    fn a_hash_whose_first_slot_is_full_stays_within_its_floor() {
        let b = Backstop::new();
        let (x, y) = (0x0000_0001_0000_0007, 0x0000_0002_0000_0007);
        assert_eq!(admitted(&b, x, 3), 3);
        assert_eq!(admitted(&b, y, 1_000), FLOOR);
        assert_eq!(admitted(&b, x, 1_000), FLOOR - 3);
    }

    /// A call with an earlier second (a clock read before a wait) does not start the slot
    /// over, which would give the second's keys their floor twice.
    #[test]
    fn a_late_call_with_an_earlier_second_does_not_reset_the_count() {
        let b = Backstop::new();
        assert_eq!(admitted(&b, 42, 100), FLOOR);
        assert!(
            !b.try_admit_hash(42, T - 1_000, FLOOR),
            "counted against the newer second"
        );
        assert_eq!(admitted(&b, 42, 100), 0);
        assert!(
            b.try_admit_hash(42, T + 1_000, FLOOR),
            "a later second starts over"
        );
    }

    /// What is left: a key sharing both slots with full ones is turned away.
    #[test]
    fn both_slots_full_turn_a_hash_away() {
        let b = Backstop::new();
        let (p, q) = (0x0000_0001_0000_0007, 0x0000_0002_0000_0009);
        assert_eq!(admitted(&b, p, 1_000), FLOOR);
        assert_eq!(admitted(&b, q, 1_000), FLOOR);
        assert_eq!(admitted(&b, 0x0000_0002_0000_0007, 10), 0);
    }
}
