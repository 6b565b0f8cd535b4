//! Who sends which key to which node, millisecond by millisecond. Traffic draws from its
//! own random stream, so every mode sees the same requests for the same seed.

use super::Scenario;
use super::rng::{Rng, Zipf};

/// Traffic for one run. Node choice is returned as the node the load balancer *wanted*;
/// the driver reroutes it when that node is down.
pub struct Traffic {
    scenario: Scenario,
    rng: Rng,
    keys: usize,
    nodes: usize,
    per_ms_milli: u64,
    carry_milli: u64,
    /// A55: the one or two nodes each key's clients are pinned to.
    homes: Vec<[u16; 2]>,
    /// `shift`: when each key's traffic moves to other nodes.
    shift_at_ms: Vec<u64>,
    /// `bursty`: each key's phase in its on/off cycle.
    phase_ms: Vec<u64>,
    zipf: Option<Zipf>,
    sim_ms: u64,
}

/// `bursty`: each key is on for 1 s of every 4 s.
const BURST_PERIOD_MS: u64 = 4_000;
const BURST_ON_MS: u64 = 1_000;
/// `hot-key`: key 0's share of all requests, from every node.
const HOT_KEY_PCT: f64 = 20.0;
/// `all-burst`: every 10 s, for 200 ms, every node sends key 0 on top of the background.
const ALL_BURST_EVERY_MS: u64 = 10_000;
const ALL_BURST_MS: u64 = 200;
const ALL_BURST_PER_NODE_PER_MS: u64 = 2;

impl Traffic {
    pub fn new(
        scenario: Scenario,
        seed: u64,
        keys: usize,
        nodes: usize,
        rate_per_s: u64,
        sim_ms: u64,
    ) -> Self {
        let mut rng = Rng::stream(seed, 0x7a1);
        let homes = (0..keys)
            .map(|_| {
                let a = rng.below(nodes as u64) as u16;
                // Half the keys are pinned to one node, half to two (A55).
                let b = if rng.below(2) == 0 {
                    a
                } else {
                    rng.below(nodes as u64) as u16
                };
                [a, b]
            })
            .collect();
        let shift_at_ms = (0..keys).map(|_| sim_ms / 2 + rng.below(1_000)).collect();
        let phase_ms = (0..keys).map(|_| rng.below(BURST_PERIOD_MS)).collect();
        let zipf = (scenario == Scenario::Zipf).then(|| Zipf::new(keys, 1.0));
        Self {
            scenario,
            rng,
            keys,
            nodes,
            per_ms_milli: rate_per_s,
            carry_milli: 0,
            homes,
            shift_at_ms,
            phase_ms,
            zipf,
            sim_ms,
        }
    }

    fn pinned_node(&mut self, k: usize, t_ms: u64) -> usize {
        let h = self.homes[k][self.rng.below(2) as usize] as usize;
        if self.scenario == Scenario::Shift && t_ms >= self.shift_at_ms[k] {
            (h + self.nodes / 2) % self.nodes
        } else {
            h
        }
    }

    fn is_on(&self, k: usize, t_ms: u64) -> bool {
        (t_ms + self.phase_ms[k]) % BURST_PERIOD_MS < BURST_ON_MS
    }

    /// Appends this millisecond's requests as (key index, node index).
    pub fn arrivals(&mut self, t_ms: u64, out: &mut Vec<(u32, u32)>) {
        debug_assert!(t_ms < self.sim_ms);
        self.carry_milli += self.per_ms_milli;
        let count = self.carry_milli / 1_000;
        self.carry_milli %= 1_000;
        for _ in 0..count {
            let (k, n) = match self.scenario {
                Scenario::Uniform => (
                    self.rng.below(self.keys as u64) as usize,
                    self.rng.below(self.nodes as u64) as usize,
                ),
                Scenario::Zipf => {
                    let k = self.zipf.as_ref().map_or(0, |z| z.sample(&mut self.rng));
                    (k, self.rng.below(self.nodes as u64) as usize)
                }
                Scenario::Bursty => {
                    // Draw until an "on" key comes up (a quarter of keys are on at any
                    // time), so the offered rate stays the same and lands on fewer keys.
                    let mut k = self.rng.below(self.keys as u64) as usize;
                    for _ in 0..16 {
                        if self.is_on(k, t_ms) {
                            break;
                        }
                        k = self.rng.below(self.keys as u64) as usize;
                    }
                    (k, self.pinned_node(k, t_ms))
                }
                Scenario::HotKey if self.rng.chance_pct(HOT_KEY_PCT) => {
                    (0, self.rng.below(self.nodes as u64) as usize)
                }
                _ => {
                    let k = self.rng.below(self.keys as u64) as usize;
                    (k, self.pinned_node(k, t_ms))
                }
            };
            out.push((k as u32, n as u32));
        }
        if self.scenario == Scenario::AllBurst && t_ms % ALL_BURST_EVERY_MS < ALL_BURST_MS {
            for n in 0..self.nodes {
                for _ in 0..ALL_BURST_PER_NODE_PER_MS {
                    out.push((0, n as u32));
                }
            }
        }
    }
}
