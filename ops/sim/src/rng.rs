//! The simulator's only source of randomness: SplitMix64, seeded per stream, so a seed
//! replays byte for byte and traffic does not change when the bus draws differently.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A stream derived from `seed` and a stream label, so independent parts of the run
    /// (traffic, bus, faults) never share draws.
    pub fn stream(seed: u64, label: u64) -> Self {
        let mut r = Rng(seed ^ label.wrapping_mul(0xd1b5_4a32_d192_ed03));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift: no modulo bias worth naming at n < 2^32.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `pct` percent.
    pub fn chance_pct(&mut self, pct: f64) -> bool {
        pct > 0.0 && self.unit() * 100.0 < pct
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// Zipf(s) over `0..n` by inverse CDF: built once, sampled by binary search.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / (k as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Self { cdf }
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_replay_and_differ() {
        let a: Vec<u64> = (0..4).map(|_| Rng::stream(7, 1).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]), "same seed, same stream");
        let mut x = Rng::stream(7, 1);
        let mut y = Rng::stream(7, 2);
        assert_ne!(x.next_u64(), y.next_u64());
        let mut r = Rng::stream(1, 0);
        assert!((0..10_000).all(|_| r.below(20) < 20));
    }

    #[test]
    fn zipf_favours_the_head() {
        let z = Zipf::new(1_000, 1.0);
        let mut r = Rng::stream(3, 0);
        let head = (0..10_000).filter(|_| z.sample(&mut r) < 10).count();
        // H(1000) ~ 7.49; the first ten ranks carry ~39% of the mass.
        assert!((3_400..4_400).contains(&head), "head draws {head}");
    }
}
