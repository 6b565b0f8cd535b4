//! The policy a decision needs, in a fixed-size, copyable form so the request path never
//! allocates to read it (D4).

use std::collections::HashMap;

use bus_schemas::limits::PLAN_WINDOWS_MAX;
use bus_schemas::{KeyId, PolicySnapshot, WindowSpec};

use crate::window::Reciprocal;

/// The windows that apply to one key after overrides (S3: one or more fixed windows).
/// In declared order, the window specs first (see `POLICY_WINDOWS_END`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct KeyPolicy {
    windows: [WindowSpec; PLAN_WINDOWS_MAX],
    /// Per window, its length as a precomputed reciprocal: the decision names the current
    /// window without a hardware divide (see `Reciprocal`).
    lengths: [Reciprocal; PLAN_WINDOWS_MAX],
    window_count: u8,
    /// The plan's window lengths in the exact 32-bit form a bucket keeps in its cache line
    /// (`inline_signature`); 0 where they do not fit it.
    signature: u32,
}

/// Where the specs of a two-window plan (the common one; `surface::INLINE_WINDOWS`)
/// end within a policy: a bucket's cold box keeps them in its first cache line
/// (`ColdBucket`), which a const assertion there holds it to.
pub(crate) const POLICY_INLINE_WINDOWS_END: usize = std::mem::offset_of!(KeyPolicy, windows)
    + crate::surface::INLINE_WINDOWS * std::mem::size_of::<WindowSpec>();

/// One window length in 16 bits, exactly or not at all: 2 bits of unit (ms, s, min, h)
/// and 14 of count, in the finest unit that holds it. Decoding is `count * unit`, so two
/// lengths with the same code are the same length.
fn compact_length(length_ms: u32) -> Option<u16> {
    const UNITS_MS: [u32; 4] = [1, 1_000, 60_000, 3_600_000];
    const COUNT_MAX: u32 = (1 << 14) - 1;
    UNITS_MS.iter().enumerate().find_map(|(class, &unit_ms)| {
        let count = length_ms / unit_ms;
        (length_ms.is_multiple_of(unit_ms) && (1..=COUNT_MAX).contains(&count))
            .then_some(((class as u16) << 14) | count as u16)
    })
}

/// The lengths of a plan of one or two windows, exactly, in 32 bits: what a bucket keeps
/// hot so the decision can tell, from its own cache line, that the caller's policy names
/// the same windows as the bucket and use the caller's reciprocals for them. 0 (never
/// equal on the fast path) for a plan of more windows or a length without a compact code.
fn inline_signature(windows: &[WindowSpec]) -> u32 {
    match windows {
        [a] => compact_length(a.length_ms).map_or(0, u32::from),
        [a, b] => match (compact_length(a.length_ms), compact_length(b.length_ms)) {
            (Some(a), Some(b)) => u32::from(a) | u32::from(b) << 16,
            _ => 0,
        },
        _ => 0,
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("a plan needs 1 to {PLAN_WINDOWS_MAX} windows, got {0}")]
    WindowCount(usize),
    #[error("window of {0} ms is shorter than {1} ms (four reconciliation rounds)")]
    WindowTooShort(u32, u32),
    #[error("two windows of {0} ms in one plan")]
    DuplicateWindow(u32),
    #[error("key assignment names plan {0}, which the snapshot does not define")]
    UnknownPlan(u32),
}

/// Windows shorter than this many rounds cannot be reconciled meaningfully.
pub const MIN_WINDOW_ROUNDS: u32 = 4;

impl KeyPolicy {
    pub fn new(windows: &[WindowSpec], round_ms: u32) -> Result<Self, PolicyError> {
        if windows.is_empty() || windows.len() > PLAN_WINDOWS_MAX {
            return Err(PolicyError::WindowCount(windows.len()));
        }
        let min_ms = round_ms * MIN_WINDOW_ROUNDS;
        let mut out = [WindowSpec {
            length_ms: 0,
            limit: 0,
        }; PLAN_WINDOWS_MAX];
        for (i, w) in windows.iter().enumerate() {
            if w.length_ms < min_ms {
                return Err(PolicyError::WindowTooShort(w.length_ms, min_ms));
            }
            if windows[..i].iter().any(|p| p.length_ms == w.length_ms) {
                return Err(PolicyError::DuplicateWindow(w.length_ms));
            }
            out[i] = *w;
        }
        Ok(Self {
            windows: out,
            lengths: std::array::from_fn(|i| Reciprocal::new(out[i].length_ms.max(1))),
            window_count: windows.len() as u8,
            signature: inline_signature(windows),
        })
    }

    /// See `inline_signature`: equal and non-zero means the same one or two window lengths.
    #[inline]
    pub(crate) fn signature(&self) -> u32 {
        self.signature
    }

    #[inline]
    pub(crate) fn window_count(&self) -> usize {
        usize::from(self.window_count)
    }

    /// Window `slot`'s length as a reciprocal (slots past the plan's windows divide by 1).
    #[inline]
    pub fn length(&self, slot: usize) -> Reciprocal {
        self.lengths[slot]
    }

    pub fn windows(&self) -> &[WindowSpec] {
        &self.windows[..usize::from(self.window_count)]
    }

    /// The highest allowed rate across windows, in requests per second: the backstop floor
    /// multiplies this (D8).
    pub fn peak_rate_per_s(&self) -> u64 {
        self.windows()
            .iter()
            .map(|w| (w.limit * 1_000).div_ceil(u64::from(w.length_ms)))
            .max()
            .unwrap_or(0)
    }
}

/// Key -> resolved policy, built from a snapshot (P1). Read by whoever authenticates the
/// key (D1); the limiter itself only ever sees a `KeyPolicy`.
#[derive(Clone, Debug, Default)]
pub struct PolicyIndex {
    pub version: u64,
    keys: HashMap<KeyId, KeyPolicy>,
    /// A rotation's carries, new id -> old id (`KeyAssignment::carry_from`).
    carries: HashMap<KeyId, KeyId>,
}

impl PolicyIndex {
    pub fn from_snapshot(snapshot: &PolicySnapshot, round_ms: u32) -> Result<Self, PolicyError> {
        let mut plans = HashMap::with_capacity(snapshot.plans.len());
        for plan in &snapshot.plans {
            plans.insert(plan.id, KeyPolicy::new(&plan.windows, round_ms)?);
        }
        let mut keys = HashMap::with_capacity(snapshot.keys.len());
        let mut carries = HashMap::new();
        for a in &snapshot.keys {
            if let Some(old) = a.carry_from {
                carries.insert(a.key, old);
            }
            let policy = if a.override_windows.is_empty() {
                *plans
                    .get(&a.plan_id)
                    .ok_or(PolicyError::UnknownPlan(a.plan_id))?
            } else {
                KeyPolicy::new(&a.override_windows, round_ms)?
            };
            keys.insert(a.key, policy);
        }
        Ok(Self {
            version: snapshot.version,
            keys,
            carries,
        })
    }

    /// The id whose windows still bind `key` in a hash-key rotation, if any.
    pub fn carry_from(&self, key: &KeyId) -> Option<KeyId> {
        self.carries.get(key).copied()
    }

    pub fn get(&self, key: &KeyId) -> Option<&KeyPolicy> {
        self.keys.get(key)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schemas::{KeyAssignment, Plan};

    fn w(length_ms: u32, limit: u64) -> WindowSpec {
        WindowSpec { length_ms, limit }
    }

    #[test]
    fn overrides_replace_plan_windows() {
        let key_a = KeyId {
            version: 1,
            digest: 1,
        };
        let key_b = KeyId {
            version: 1,
            digest: 2,
        };
        let snap = PolicySnapshot {
            version: 7,
            plans: vec![Plan {
                id: 1,
                name: "std".into(),
                windows: vec![w(1_000, 10), w(60_000, 300)],
            }],
            keys: vec![
                KeyAssignment {
                    key: key_a,
                    plan_id: 1,
                    override_windows: vec![],
                    carry_from: None,
                },
                KeyAssignment {
                    key: key_b,
                    plan_id: 1,
                    override_windows: vec![w(1_000, 50)],
                    carry_from: None,
                },
            ],
        };
        let idx = PolicyIndex::from_snapshot(&snap, 25).unwrap();
        assert_eq!(
            idx.get(&key_a).unwrap().windows(),
            &[w(1_000, 10), w(60_000, 300)]
        );
        assert_eq!(idx.get(&key_b).unwrap().windows(), &[w(1_000, 50)]);
        assert_eq!(idx.get(&key_a).unwrap().peak_rate_per_s(), 10);
    }

    #[test]
    fn signatures_are_exact_or_absent() {
        let sig = |ws: &[WindowSpec]| KeyPolicy::new(ws, 25).unwrap().signature();
        let codes: Vec<u16> = [1_000u32, 16_383, 17_000, 60_000, 3_600_000, 86_400_000]
            .iter()
            .map(|&l| compact_length(l).unwrap())
            .collect();
        let mut unique = codes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), codes.len());
        // 16,384 ms is not whole seconds and too many ms: no exact code.
        assert_eq!(compact_length(16_384), None);
        assert_eq!(compact_length(16_385), None);
        assert_ne!(sig(&[w(1_000, 5)]), 0);
        assert_ne!(sig(&[w(1_000, 5)]), sig(&[w(1_000, 5), w(60_000, 9)]));
        assert_ne!(
            sig(&[w(1_000, 5), w(60_000, 9)]),
            sig(&[w(60_000, 9), w(1_000, 5)])
        );
        // Limits do not enter it: only lengths name windows.
        assert_eq!(
            sig(&[w(1_000, 5), w(60_000, 9)]),
            sig(&[w(1_000, 7), w(60_000, 90)])
        );
        assert_eq!(sig(&[w(1_000, 5), w(16_385, 9)]), 0);
        assert_eq!(sig(&[w(1_000, 5), w(2_000, 9), w(3_000, 1)]), 0);
    }

    #[test]
    fn bad_plans_are_rejected() {
        assert_eq!(KeyPolicy::new(&[], 25), Err(PolicyError::WindowCount(0)));
        assert_eq!(
            KeyPolicy::new(&[w(50, 1)], 25),
            Err(PolicyError::WindowTooShort(50, 100))
        );
        assert_eq!(
            KeyPolicy::new(&[w(1_000, 1), w(1_000, 2)], 25),
            Err(PolicyError::DuplicateWindow(1_000))
        );
        let five = [
            w(1_000, 1),
            w(2_000, 1),
            w(3_000, 1),
            w(4_000, 1),
            w(5_000, 1),
        ];
        assert_eq!(KeyPolicy::new(&five, 25), Err(PolicyError::WindowCount(5)));
    }
}
