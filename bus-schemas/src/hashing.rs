//! A fast, deterministic hasher for the state machines' maps (keyed by `KeyWindow`,
//! `KeyId`, node ids). Their keys are HMAC digests and small integers, not attacker-chosen
//! byte strings, so SipHash's flood resistance buys nothing and cost the simulator more
//! than half its time; a fixed hasher also keeps iteration order, and therefore the
//! simulator's output, a function of the seed alone.
//!
//! The mixing step is FxHash's (rustc's own hasher): rotate, xor, multiply.

use std::hash::{BuildHasherDefault, Hasher};

#[derive(Clone, Copy, Default)]
pub struct FoldHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FoldHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FoldHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.mix(u64::from(v));
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.mix(u64::from(v));
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.mix(v);
    }
    #[inline]
    fn write_u128(&mut self, v: u128) {
        self.mix(v as u64);
        self.mix((v >> 64) as u64);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.mix(v as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // hashbrown takes its control byte from the top bits: fold the low bits up.
        self.0 ^ (self.0 >> 29)
    }
}

pub type FoldHashBuilder = BuildHasherDefault<FoldHasher>;

/// A `HashMap` with deterministic, fast hashing.
pub type DetMap<K, V> = std::collections::HashMap<K, V, FoldHashBuilder>;

/// A `HashSet` with deterministic, fast hashing.
pub type DetSet<K> = std::collections::HashSet<K, FoldHashBuilder>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn same_input_same_hash_and_spread() {
        let b = FoldHashBuilder::default();
        assert_eq!(b.hash_one(42u64), b.hash_one(42u64));
        let mut top = std::collections::HashSet::new();
        for i in 0..10_000u64 {
            top.insert(b.hash_one(i) >> 57);
        }
        assert_eq!(top.len(), 128, "every control-byte value is reached");
    }
}
