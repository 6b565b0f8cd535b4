//! The credit word: one `AtomicU64` per (key, window slot, window parity).
//!
//! ```text
//!  63            41   40        39                         0
//! +----------------+-----------+----------------------------+
//! | window tag (23)| exhausted | remaining credit (40 bits) |
//! +----------------+-----------+----------------------------+
//! ```
//!
//! Tag, flag and credit live in one word so a compare-and-swap decrements credit *of a
//! named window* atomically: a request can never spend the previous window's leftovers,
//! and the reconciler can close a window and learn its exact remainder in one swap.
//! Each window slot has two words indexed by window-number parity, so the next window can
//! be filled (pre-granted) while the current one is still being spent.
//!
//! Writers: request tasks only ever decrement (or refund their own decrement); the single
//! reconciler adds, installs and drains. All updates are CAS loops on the whole word.
//!
//! This module is the only code that reads or writes a word's fields. The surface and the
//! reconciler name a window by its number and call the operations below: `charge` and
//! `uncharge` on the request path; `fill`, `grant`, `mark_exhausted`, `drain_to` and
//! `close` in the reconciler; `read`, `held` and `holds_no_credit` to look. The tag-level
//! primitives under them (`try_charge`, `add_credit`, `install`, `drain_above`, ...) stay
//! public for tools that inspect words.

use std::sync::atomic::{AtomicU64, Ordering};

const TAG_SHIFT: u32 = 41;
const EXHAUSTED_BIT: u64 = 1 << 40;
pub const CREDIT_MAX: u64 = (1 << 40) - 1;
/// A tag is the window number's low 22 bits with the top (23rd) bit set; the all-zero tag
/// means "empty" and no window's tag is ever zero. A mask and an or keep it to two
/// instructions per window on the decision path.
const TAG_NUMBER_MASK: u64 = (1 << 22) - 1;
const TAG_LIVE_BIT: u64 = 1 << 22;
pub const TAG_EMPTY: u64 = 0;
pub const EMPTY_WORD: u64 = TAG_EMPTY << TAG_SHIFT;

/// Tag of a window number. Adjacent windows never share a tag, which is all the parity
/// double buffer needs (a word is only ever compared with the window a caller names).
#[inline]
pub fn tag_of(number: u64) -> u64 {
    (number & TAG_NUMBER_MASK) | TAG_LIVE_BIT
}

#[inline]
pub fn parity(number: u64) -> usize {
    (number & 1) as usize
}

#[inline]
pub fn word_tag(word: u64) -> u64 {
    word >> TAG_SHIFT
}

#[inline]
pub fn word_credit(word: u64) -> u64 {
    word & CREDIT_MAX
}

#[inline]
pub fn word_exhausted(word: u64) -> bool {
    word & EXHAUSTED_BIT != 0
}

#[inline]
pub fn pack(tag: u64, exhausted: bool, credit: u64) -> u64 {
    debug_assert!(tag < 1 << 23);
    assert!(
        credit <= CREDIT_MAX,
        "credit {credit} exceeds the 40-bit word"
    );
    (tag << TAG_SHIFT) | if exhausted { EXHAUSTED_BIT } else { 0 } | credit
}

/// Request path: take one unit of `tag`'s credit. Returns the word seen on failure.
#[inline]
pub fn try_charge(word: &AtomicU64, tag: u64) -> Result<(), u64> {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        if word_tag(cur) != tag || word_credit(cur) == 0 {
            return Err(cur);
        }
        match word.compare_exchange_weak(cur, cur - 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(seen) => cur = seen,
        }
    }
}

/// Request path: give back a unit taken by `try_charge` when another window denied (D4:
/// one unit in every window or in none). If the window was closed meanwhile the unit stays
/// counted as spent, which can only under-admit.
#[inline]
pub fn refund(word: &AtomicU64, tag: u64) {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        if word_tag(cur) != tag || word_credit(cur) == CREDIT_MAX {
            return;
        }
        match word.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(seen) => cur = seen,
        }
    }
}

/// Reconciler: add granted credit to `tag`'s word and set its exhausted flag.
/// Returns false (and changes nothing) if the word holds another window.
pub fn add_credit(word: &AtomicU64, tag: u64, delta: u64, exhausted: bool) -> bool {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        if word_tag(cur) != tag {
            return false;
        }
        let next = pack(tag, exhausted, word_credit(cur) + delta);
        match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(seen) => cur = seen,
        }
    }
}

/// Reconciler: make the word hold `tag` with `credit`. Returns the previous word so the
/// caller can close out whichever window it held.
pub fn install(word: &AtomicU64, tag: u64, credit: u64, exhausted: bool) -> u64 {
    word.swap(pack(tag, exhausted, credit), Ordering::AcqRel)
}

/// Reconciler: take all remaining credit of `tag` (closing a window). Returns what was
/// taken, or None if the word holds another window.
pub fn drain(word: &AtomicU64, tag: u64) -> Option<u64> {
    drain_above(word, tag, 0)
}

/// Reconciler: take what `tag`'s word holds above `keep` (returning credit to the pool:
/// all of an idle node's, or what the rest of a window cannot spend). Returns what was
/// taken (0 when it holds `keep` or less), or None if the word holds another window.
pub fn drain_above(word: &AtomicU64, tag: u64, keep: u64) -> Option<u64> {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        if word_tag(cur) != tag {
            return None;
        }
        let held = word_credit(cur);
        if held <= keep {
            return Some(0);
        }
        let next = pack(tag, word_exhausted(cur), keep);
        match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(held - keep),
            Err(seen) => cur = seen,
        }
    }
}

/// A word's view of the window a caller names, when the word holds that window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowCredit {
    pub credit: u64,
    /// The owner has said the window's pool is spent (D6: a 429 waits for its boundary).
    pub exhausted: bool,
}

/// The two words of one window slot, both empty.
pub fn empty_pair() -> [AtomicU64; 2] {
    [AtomicU64::new(EMPTY_WORD), AtomicU64::new(EMPTY_WORD)]
}

/// The word of a slot's pair that window `number` uses.
#[inline(always)]
pub fn word_of(words: &[AtomicU64; 2], number: u64) -> &AtomicU64 {
    &words[parity(number)]
}

/// Request path: take one unit of window `number`'s credit from its slot's pair.
#[inline(always)]
pub fn charge(words: &[AtomicU64; 2], number: u64) -> bool {
    try_charge(word_of(words, number), tag_of(number)).is_ok()
}

/// Request path: give back a unit `charge` took (D4's all or none).
#[inline(always)]
pub fn uncharge(words: &[AtomicU64; 2], number: u64) {
    refund(word_of(words, number), tag_of(number));
}

/// What `word` holds of window `number`: `None` when it holds another window (or none).
#[inline]
pub fn read(word: &AtomicU64, number: u64) -> Option<WindowCredit> {
    let w = word.load(Ordering::Acquire);
    (word_tag(w) == tag_of(number)).then_some(WindowCredit {
        credit: word_credit(w),
        exhausted: word_exhausted(w),
    })
}

/// Credit `word` holds of window `number` (0 when it holds another window).
#[inline]
pub fn held(word: &AtomicU64, number: u64) -> u64 {
    read(word, number).map_or(0, |c| c.credit)
}

/// Whether `word` holds no credit, of whatever window (D7 evicts only such buckets).
#[inline]
pub fn holds_no_credit(word: &AtomicU64) -> bool {
    word_credit(word.load(Ordering::Acquire)) == 0
}

/// Reconciler: make `word` hold window `number` with `credit`, whatever it held. The caller
/// has closed the window it held first (`drain`/`close`), so nothing is lost.
pub fn fill(word: &AtomicU64, number: u64, credit: u64, exhausted: bool) {
    install(word, tag_of(number), credit, exhausted);
}

/// Reconciler: add a grant's `delta` to window `number`'s word and set its exhausted flag.
/// False (nothing changed) when the word holds another window.
pub fn grant(word: &AtomicU64, number: u64, delta: u64, exhausted: bool) -> bool {
    add_credit(word, tag_of(number), delta, exhausted)
}

/// Reconciler: the owner said window `number`'s pool is spent; the word keeps its credit.
pub fn mark_exhausted(word: &AtomicU64, number: u64) -> bool {
    add_credit(word, tag_of(number), 0, true)
}

/// Reconciler: take what window `number`'s word holds above `keep` (credit going back to
/// the pool). `None` when the word holds another window.
pub fn drain_to(word: &AtomicU64, number: u64, keep: u64) -> Option<u64> {
    drain_above(word, tag_of(number), keep)
}

/// Reconciler: close window `number`, taking everything its word holds: with what was
/// received and returned, this fixes the window's spend. `None` when the word holds
/// another window.
pub fn close(word: &AtomicU64, number: u64) -> Option<u64> {
    drain(word, tag_of(number))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn pack_roundtrip_and_tags() {
        let w = pack(tag_of(12345), true, 77);
        assert_eq!(word_tag(w), tag_of(12345));
        assert!(word_exhausted(w));
        assert_eq!(word_credit(w), 77);
        for n in [0, 1, TAG_NUMBER_MASK, TAG_NUMBER_MASK + 1, u64::MAX] {
            assert_ne!(tag_of(n), TAG_EMPTY, "window {n}");
            assert_ne!(tag_of(n), tag_of(n.wrapping_add(1)), "adjacent windows {n}");
        }
        assert_eq!(word_tag(EMPTY_WORD), TAG_EMPTY);
        assert_ne!(tag_of(7), tag_of(8));
    }

    #[test]
    fn charge_only_the_named_window() {
        let word = AtomicU64::new(pack(tag_of(10), false, 2));
        assert!(try_charge(&word, tag_of(11)).is_err());
        assert!(try_charge(&word, tag_of(10)).is_ok());
        assert!(try_charge(&word, tag_of(10)).is_ok());
        assert!(try_charge(&word, tag_of(10)).is_err());
        refund(&word, tag_of(10));
        assert_eq!(word_credit(word.load(Ordering::Relaxed)), 1);
        assert!(!add_credit(&word, tag_of(11), 5, false));
        assert!(add_credit(&word, tag_of(10), 5, true));
        assert_eq!(drain(&word, tag_of(10)), Some(6));
        assert!(word_exhausted(word.load(Ordering::Relaxed)));
        assert_eq!(drain(&word, tag_of(9)), None);
        let prev = install(&word, tag_of(12), 3, false);
        assert_eq!(word_tag(prev), tag_of(10));
    }

    #[test]
    fn drain_above_leaves_what_it_keeps_and_only_in_its_window() {
        let word = AtomicU64::new(pack(tag_of(4), true, 9));
        assert_eq!(drain_above(&word, tag_of(5), 2), None);
        assert_eq!(drain_above(&word, tag_of(4), 12), Some(0));
        assert_eq!(drain_above(&word, tag_of(4), 2), Some(7));
        let w = word.load(Ordering::Relaxed);
        assert_eq!((word_credit(w), word_exhausted(w)), (2, true));
        assert_eq!(drain_above(&word, tag_of(4), 2), Some(0));
    }

    /// Concurrent charges never take more than the credit present, and the reconciler's
    /// drain sees exactly what is left.
    #[test]
    fn concurrent_charges_never_overspend() {
        let word = Arc::new(AtomicU64::new(pack(tag_of(1), false, 10_000)));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let word = Arc::clone(&word);
                std::thread::spawn(move || {
                    (0..5_000)
                        .filter(|_| try_charge(&word, tag_of(1)).is_ok())
                        .count()
                })
            })
            .collect();
        let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 10_000);
        assert_eq!(drain(&word, tag_of(1)), Some(0));
    }
}
