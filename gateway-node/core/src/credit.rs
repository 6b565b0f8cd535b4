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
//! A closed window leaves a *closed marker*: the window's number without the live bit,
//! no credit. A word that holds no live window (empty, or a marker of a window older
//! than the one a request names) may be *opened* by the request path with the node's
//! standing option for that window (`open_standing`); a marker of the named window
//! itself never can, so a window is opened at most once per word. The reconciler
//! places credit with `place`, which never overwrites a window a request just opened.
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
/// received and returned, this fixes the window's spend. The word is left holding the
/// window's closed marker, which no request can charge or open again. `None` when the
/// word holds another window.
pub fn close(word: &AtomicU64, number: u64) -> Option<u64> {
    let tag = tag_of(number);
    // The exhausted bit sets a marker apart from an empty word even where the number's
    // low bits are all zero.
    let marker = pack(closed_tag_of(number), true, 0);
    let mut cur = word.load(Ordering::Acquire);
    loop {
        if word_tag(cur) != tag {
            return None;
        }
        match word.compare_exchange_weak(cur, marker, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(word_credit(cur)),
            Err(seen) => cur = seen,
        }
    }
}

/// The closed marker's tag of window `number`: its number without the live bit.
#[inline]
fn closed_tag_of(number: u64) -> u64 {
    number & TAG_NUMBER_MASK
}

/// Whether a request may open window `number` in a word that holds `cur`: no live
/// window in it, and any closed marker older than `number` (tag numbers wrap at 2^22;
/// the parity double buffer only ever holds windows two apart).
#[inline]
fn openable(cur: u64, number: u64) -> bool {
    let tag = word_tag(cur);
    if tag & TAG_LIVE_BIT != 0 {
        return false;
    }
    let behind = (number & TAG_NUMBER_MASK).wrapping_sub(tag) & TAG_NUMBER_MASK;
    cur == EMPTY_WORD || (behind > 0 && behind < TAG_NUMBER_MASK / 2)
}

/// Request path (cold): open window `number` with `credit` units of the node's standing
/// option, if the word holds no live window and never held this one. False when the
/// word is not openable (a live window, or this window's closed marker).
pub fn open_standing(words: &[AtomicU64; 2], number: u64, credit: u64) -> bool {
    let word = word_of(words, number);
    let next = pack(tag_of(number), false, credit);
    let mut cur = word.load(Ordering::Acquire);
    loop {
        if !openable(cur, number) {
            return false;
        }
        match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(seen) => cur = seen,
        }
    }
}

/// What `place` found in the word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// The word now holds window `number` with exactly the credit placed.
    Filled,
    /// A request had opened window `number` with the standing option first: the credit
    /// placed was added to what it holds, and the caller books the standing share.
    AddedToOpened,
}

/// Reconciler: make `word` hold window `number` with `credit` (the caller has closed
/// whatever live window it held), unless a request opened `number` there meanwhile
/// (`open_standing`), in which case `credit` is added to that. One compare-and-swap
/// decides which, so standing credit a request opened is never overwritten.
pub fn place(word: &AtomicU64, number: u64, credit: u64, exhausted: bool) -> Placed {
    let tag = tag_of(number);
    let mut cur = word.load(Ordering::Acquire);
    loop {
        let (next, placed) = if word_tag(cur) == tag {
            (
                pack(tag, exhausted, word_credit(cur) + credit),
                Placed::AddedToOpened,
            )
        } else {
            (pack(tag, exhausted, credit), Placed::Filled)
        };
        match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return placed,
            Err(seen) => cur = seen,
        }
    }
}

/// Whether `word` holds window `number` live (opened or placed).
#[inline]
pub fn holds_live(word: &AtomicU64, number: u64) -> bool {
    word_tag(word.load(Ordering::Acquire)) == tag_of(number)
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

    #[test]
    fn a_closed_window_cannot_be_opened_again_but_a_later_one_can() {
        let words = empty_pair();
        assert!(open_standing(&words, 10, 3), "an empty word opens");
        assert!(
            !open_standing(&words, 10, 3),
            "a live window does not open twice"
        );
        assert!(charge(&words, 10));
        assert_eq!(close(word_of(&words, 10), 10), Some(2));
        assert!(!charge(&words, 10), "a closed marker takes no charge");
        assert!(
            !open_standing(&words, 10, 3),
            "nor opens its own window again"
        );
        assert!(!open_standing(&words, 8, 3), "nor an older one");
        assert!(
            open_standing(&words, 12, 1),
            "the next window of the parity opens"
        );
        assert_eq!(held(word_of(&words, 12), 12), 1);
        // Wrapping tag numbers: a marker just below the wrap, the next window above it.
        let n = TAG_NUMBER_MASK - 1;
        let words = empty_pair();
        assert!(open_standing(&words, n, 1));
        assert_eq!(close(word_of(&words, n), n), Some(1));
        assert!(open_standing(&words, n + 2, 1));
    }

    #[test]
    fn place_adds_to_a_window_a_request_opened_and_fills_otherwise() {
        let words = empty_pair();
        assert_eq!(place(word_of(&words, 4), 4, 5, false), Placed::Filled);
        assert_eq!(held(word_of(&words, 4), 4), 5);
        assert!(open_standing(&words, 7, 2));
        assert_eq!(place(word_of(&words, 7), 7, 3, true), Placed::AddedToOpened);
        let c = read(word_of(&words, 7), 7).unwrap();
        assert_eq!((c.credit, c.exhausted), (5, true));
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
