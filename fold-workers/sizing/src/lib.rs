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
