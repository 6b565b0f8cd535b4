//! Window arithmetic (D3, ADR-5). A window's identity is a pure function of wall time and
//! the key, so every node computes the same id without talking to any other; clock skew
//! only moves *when* a node crosses a boundary, never *which* window it names.

use bus_schemas::{KeyId, WindowId};

/// Window number containing `wall_ms` for `key` in windows of `length_ms`.
pub fn window_at(key: KeyId, length_ms: u32, wall_ms: u64) -> WindowId {
    debug_assert!(length_ms > 0);
    let offset_ms = key.phase_offset_ms(length_ms);
    let number = wall_ms.saturating_sub(offset_ms) / u64::from(length_ms);
    WindowId { length_ms, number }
}

/// Wall time at which `window` starts for `key`.
pub fn window_start_ms(key: KeyId, window: WindowId) -> u64 {
    window.number * u64::from(window.length_ms) + key.phase_offset_ms(window.length_ms)
}

/// Wall time at which `window` ends (exclusive) for `key`.
pub fn window_end_ms(key: KeyId, window: WindowId) -> u64 {
    window_start_ms(key, window) + u64::from(window.length_ms)
}

/// Division by a window length fixed when the policy is built: a hardware 64-bit divide
/// costs ~40 cycles on this machine's cores and sat on the decision's critical path twice
/// (BENCHMARKS.md, run 4). `m = floor((2^64 - 1) / d)` makes `mulhi(x, m)` equal to
/// `x / d` or one less for every `x < 2^63`; one compare corrects it, so the result is
/// exact, not approximate (`reciprocal_division_is_exact` checks the edges).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reciprocal {
    divisor: u64,
    multiplier: u64,
}

impl Reciprocal {
    pub fn new(divisor: u32) -> Self {
        assert!(divisor > 0, "window length must be positive");
        Self {
            divisor: u64::from(divisor),
            multiplier: u64::MAX / u64::from(divisor),
        }
    }

    pub fn divisor(self) -> u64 {
        self.divisor
    }

    #[inline]
    pub fn quotient(self, x: u64) -> u64 {
        debug_assert!(x < 1 << 63);
        let q = ((u128::from(x) * u128::from(self.multiplier)) >> 64) as u64;
        if x - q * self.divisor >= self.divisor {
            q + 1
        } else {
            q
        }
    }

    /// `x % divisor` for every `u64`, the whole range of `KeyId::hash64`: the phase
    /// offset, computed per decision because the bucket's cache line has no room to
    /// keep it. For `x >= 2^63` the estimate may be two short, so up to two corrections.
    #[inline]
    pub fn remainder(self, x: u64) -> u64 {
        let q = ((u128::from(x) * u128::from(self.multiplier)) >> 64) as u64;
        let mut r = x - q * self.divisor;
        if r >= self.divisor {
            r -= self.divisor;
        }
        if r >= self.divisor {
            r -= self.divisor;
        }
        debug_assert!(r < self.divisor);
        r
    }
}

/// The next window instance of the same kind.
pub fn next_window(window: WindowId) -> WindowId {
    WindowId {
        length_ms: window.length_ms,
        number: window.number + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(d: u128) -> KeyId {
        KeyId {
            version: 1,
            digest: d,
        }
    }

    #[test]
    fn reciprocal_division_is_exact() {
        for d in [1u32, 3, 7, 100, 1_000, 60_000, 86_400_000, u32::MAX] {
            let r = Reciprocal::new(d);
            let d64 = u64::from(d);
            let mut xs = vec![0u64, 1, d64 - 1, d64, d64 + 1, (1 << 63) - 1];
            for q in [1u64, 2, 1_764_720, 1_764_720_000, (1 << 62) / d64] {
                xs.extend([q * d64 - 1, q * d64, q * d64 + 1]);
            }
            let mut x = 0x9e37_79b9_7f4a_7c15_u64;
            for _ in 0..10_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                xs.push(x >> 1);
                xs.push((x >> 22) % (1 << 42));
            }
            for x in &xs {
                assert_eq!(r.quotient(*x), x / d64, "{x} / {d}");
            }
            // The remainder takes the whole u64 range (a key's hash).
            let high = xs.iter().map(|x| x | 1 << 63);
            for x in xs
                .iter()
                .copied()
                .chain(high)
                .chain([u64::MAX, u64::MAX - d64])
            {
                assert_eq!(r.remainder(x), x % d64, "{x} % {d}");
            }
        }
    }

    #[test]
    fn window_contains_its_instant_and_boundaries_are_exact() {
        for d in [0u128, 1, 77, u128::MAX / 3, u128::MAX] {
            let k = key(d);
            for len in [1_000u32, 60_000, 250] {
                for t in [1_764_720_000_000u64, 1_764_720_000_999, 1_764_720_059_999] {
                    let w = window_at(k, len, t);
                    assert!(window_start_ms(k, w) <= t && t < window_end_ms(k, w));
                    let end = window_end_ms(k, w);
                    assert_eq!(window_at(k, len, end), next_window(w));
                    assert_eq!(window_at(k, len, end - 1), w);
                }
            }
        }
    }

    #[test]
    fn phase_offset_spreads_boundaries_across_keys() {
        // A45: boundaries must not align fleet-wide, or every client retries at once.
        let starts: std::collections::HashSet<u64> = (0..200u128)
            .map(|i| key(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)))
            .map(|k| window_start_ms(k, window_at(k, 60_000, 1_764_720_000_000)) % 60_000)
            .collect();
        assert!(starts.len() > 150, "only {} distinct phases", starts.len());
    }

    /// Nodes whose clocks differ by up to 50 ms (ADR-5) name the same window except within
    /// 50 ms of a boundary, and there they differ by exactly one window.
    #[test]
    fn window_ids_agree_across_skewed_clocks() {
        struct Case {
            len_ms: u32,
            skews_ms: [i64; 5],
        }
        let cases = [
            Case {
                len_ms: 1_000,
                skews_ms: [-50, -25, 0, 25, 50],
            },
            Case {
                len_ms: 60_000,
                skews_ms: [-50, -1, 0, 1, 50],
            },
            Case {
                len_ms: 100,
                skews_ms: [-50, -10, 0, 10, 50],
            },
        ];
        let k = key(0xdead_beef_0000_1111_2222_3333_4444_5555);
        for case in &cases {
            let base = 1_764_720_000_000u64;
            for step in 0..(case.len_ms as u64 * 3) {
                let t = base + step;
                let ids: Vec<WindowId> = case
                    .skews_ms
                    .iter()
                    .map(|s| window_at(k, case.len_ms, t.saturating_add_signed(*s)))
                    .collect();
                let reference = window_at(k, case.len_ms, t);
                let near_boundary = {
                    let start = window_start_ms(k, reference);
                    let end = window_end_ms(k, reference);
                    t - start < 50 || end - t <= 50
                };
                let min = ids.iter().map(|w| w.number).min().unwrap();
                let max = ids.iter().map(|w| w.number).max().unwrap();
                if near_boundary {
                    assert!(max - min <= 1, "len {} t {t}: {ids:?}", case.len_ms);
                } else {
                    assert_eq!(min, max, "len {} t {t}: {ids:?}", case.len_ms);
                }
                assert!(ids.iter().all(|w| w.length_ms == case.len_ms));
            }
        }
    }
}
