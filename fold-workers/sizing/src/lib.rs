//! The credit arithmetic both sides of the protocol compute, in one place.
//!
//! A fold owner sizes a node's grant from the node's reported demand; the node, in turn,
//! decides what to hand back and how much to ask for on a fast path from the very same
//! numbers. If the two sides computed them differently, a node would hand back credit the
//! owner is about to re-grant, or ask for less than the owner's least grant, and the fleet
//! would churn credit instead of holding it. So the formulas live here, once, with no
//! dependency at all, and both `node-core` and `fold-core` call them.
//!
//! Integer arithmetic only: the simulator's output must be byte-identical run to run and
//! machine to machine.

/// C4: the credit a node holds for `mean_milli` thousandths of a request expected over
/// some rounds: h x that mean (`headroom_permille`), plus `sigmas` standard deviations of
/// Poisson arrivals over it. The owner grants up to it for a line's lead; a node hands
/// back what it holds above it for the rest of a window (the node's `rest_of_window`).
pub fn held_target(mean_milli: u64, headroom_permille: u64, sigmas: u64) -> u64 {
    (mean_milli * headroom_permille).div_ceil(1_000_000) + burst_allowance(mean_milli, sigmas)
}

/// `sigmas` standard deviations of Poisson arrivals whose mean is `mean_milli` / 1000.
fn burst_allowance(mean_milli: u64, sigmas: u64) -> u64 {
    if mean_milli == 0 || sigmas == 0 {
        return 0;
    }
    // sqrt(mean) = sqrt(mean_milli * 1000) / 1000, in integers.
    (sigmas * (mean_milli * 1_000).isqrt()).div_ceil(1_000)
}

/// C5: one round of a window's average pace split across the fleet, rounded up: the
/// least a fast path is granted (`least_want`, which makes it at least 1), and so what a
/// node holding less asks for along with the window that ran dry
/// (`NodeLimiter::handle_fast_path_need`).
pub fn round_of_pace(allowance: u64, length_ms: u32, round_ms: u32, fleet_size: u32) -> u64 {
    (u128::from(allowance) * u128::from(round_ms))
        .div_ceil(u128::from(length_ms) * u128::from(fleet_size.max(1))) as u64
}

/// A-fixed: a node's share of a window in fixed mode, the reserve held back, rounded
/// down. The node takes it unasked; the owner counts it as committed for every node not
/// yet heard from, so the two must agree to the unit.
pub fn fixed_share(allowance: u64, reserve_permille: u64, fleet_size: u32) -> u64 {
    allowance * (1_000 - reserve_permille) / 1_000 / u64::from(fleet_size)
}

/// One round of a node's demand smoothing taking in a rise from `held` to `sample`: an
/// eighth of the step, rounded up (never a fall). The owner takes in a reported rise of
/// a key spread thin this way, as the node itself would.
pub fn smoothed_rise(held: u64, sample: u64) -> u64 {
    held + sample.saturating_sub(held).div_ceil(8)
}

/// Standing options: the credit a key-window's pool hands out by rule, with no message.
/// Every fleet node may take its share of the window unasked the first time it needs
/// the window; the owner counts the share of every node it has not heard from as
/// committed. This is the total over the fleet: `standing_permille` of what may be
/// leased (the allowance less the reserve), and at least one unit for every node while
/// the pool keeps one unit for the fast path (a plan smaller than twice the fleet would
/// otherwise leave most nodes with nothing, and a spread key's first request at each of
/// them would be a fast path). 0 turns standing options off.
pub fn standing_total(
    allowance: u64,
    reserve_permille: u64,
    fleet_size: u32,
    standing_permille: u64,
) -> u64 {
    if standing_permille == 0 || fleet_size == 0 {
        return 0;
    }
    let leasable = allowance - allowance * reserve_permille / 1_000;
    let share = leasable * standing_permille.min(1_000) / 1_000;
    share.max(u64::from(fleet_size).min(leasable.saturating_sub(1)))
}

/// Which node takes the first of the units `standing_total` does not split evenly, for
/// one key-window: a mix of the key's hash and the window number, so the nodes that
/// hold one more unit rotate from window to window and key to key.
pub fn standing_rotation(key_hash: u64, window_number: u64, fleet_size: u32) -> u32 {
    let mut x = key_hash ^ window_number.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    (x % u64::from(fleet_size.max(1))) as u32
}

/// Node `node`'s standing option out of `total` (`standing_total`): an even split, and
/// one unit more for the `total % fleet_size` nodes from `rotation` on. A node id
/// outside the fleet has none. Summed over `0..fleet_size` it is exactly `total`.
pub fn standing_share(total: u64, fleet_size: u32, node: u32, rotation: u32) -> u64 {
    if node >= fleet_size {
        return 0;
    }
    let fleet = u64::from(fleet_size);
    let place = (u64::from(node) + fleet - u64::from(rotation % fleet_size)) % fleet;
    total / fleet + u64::from(place < total % fleet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standing_shares_sum_to_the_total_and_leave_the_pool_a_unit() {
        for allowance in [0u64, 1, 2, 9, 10, 19, 20, 21, 40, 100, 3_000] {
            for fleet in [1u32, 3, 20, 64] {
                let total = standing_total(allowance, 20, fleet, 500);
                let leasable = allowance - allowance * 20 / 1_000;
                assert!(
                    total <= leasable,
                    "{allowance}/{fleet}: {total} > {leasable}"
                );
                if leasable > 1 {
                    assert!(total < leasable || leasable * 500 / 1_000 == total);
                }
                for rotation in [0u32, 1, fleet - 1, 7_777] {
                    let sum: u64 = (0..fleet)
                        .map(|n| standing_share(total, fleet, n, rotation))
                        .sum();
                    assert_eq!(sum, total, "{allowance}/{fleet}/{rotation}");
                }
                assert_eq!(standing_share(total, fleet, fleet, 0), 0);
            }
        }
        assert_eq!(
            standing_total(10, 20, 20, 500),
            9,
            "L < N: one unit each for 9 nodes"
        );
        assert_eq!(standing_total(100, 20, 20, 500), 49);
        assert_eq!(standing_total(3_000, 20, 20, 500), 1_470);
        assert_eq!(standing_total(3_000, 20, 20, 0), 0);
    }
}
