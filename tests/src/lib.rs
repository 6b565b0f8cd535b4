//! Cross-crate test support: a tiny fleet of node limiters and a fold owner wired through
//! an in-memory, fault-injecting message queue. The property tests in `tests/` drive it.

pub mod http;
pub mod nats;
pub mod tls;

pub use foldgate_harness::KillOnDrop;

use std::sync::Arc;

use bus_schemas::{
    Envelope, FastPathReply, FastPathRequest, GrantBatch, KeyId, KeyWindow, NodeEpoch, NodeId, Now,
    OwnerEpoch, ReportBatch, ShardId, WindowSpec,
};
use fold_workers::{FoldOwner, OwnerConfig};
use gateway_node::{
    Decision, DecisionSurface, KeyPolicy, NodeConfig, NodeLimiter, SurfaceConfig, Transmit,
};

/// A message in flight.
#[derive(Clone, Debug)]
pub enum Msg {
    Report(ReportBatch),
    FastPath(FastPathRequest),
    Grant(GrantBatch),
    Reply(NodeId, FastPathReply),
}

fn round_trip<E: Envelope + PartialEq + std::fmt::Debug>(value: E) -> E {
    let decoded = E::decode(&value.encode()).expect("a valid envelope decodes");
    assert_eq!(decoded, value);
    decoded
}

fn through_the_wire(msg: Msg) -> Msg {
    match msg {
        Msg::Report(r) => Msg::Report(round_trip(r)),
        Msg::FastPath(f) => Msg::FastPath(round_trip(f)),
        Msg::Grant(g) => Msg::Grant(round_trip(g)),
        Msg::Reply(n, r) => Msg::Reply(n, round_trip(r)),
    }
}

pub struct Fleet {
    pub now: Now,
    pub nodes: Vec<NodeLimiter>,
    pub owner: FoldOwner,
    pub policy: KeyPolicy,
    pub keys: Vec<KeyId>,
    pub in_flight: Vec<Msg>,
    /// Spend of epochs that died, per key-window: admitted requests still count.
    pub dead_spend: Vec<(KeyWindow, u64, u64)>,
    pub next_epoch: u64,
    pub owner_epoch: u64,
    pub owner_changes: u32,
    pub admitted: u64,
}

pub const ROUND_MS: u32 = 25;
pub const SHARDS: u32 = 1;

pub fn windows() -> [WindowSpec; 2] {
    [
        WindowSpec {
            length_ms: 1_000,
            limit: 40,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: 120,
        },
    ]
}

fn node_config(i: u32, fleet: u32) -> NodeConfig {
    NodeConfig {
        fleet_size: fleet,
        shards: SHARDS,
        // The demand-driven protocol; standing options' invariants are the simulator's
        // to check (`ops/tests/sim.rs`, 200 seeds).
        standing_permille: 0,
        ..NodeConfig::reference(NodeId(i))
    }
}

fn owner_config(fleet: u32) -> OwnerConfig {
    OwnerConfig {
        shards: SHARDS,
        fleet_size: fleet,
        standing_permille: 0,
        ..OwnerConfig::reference(ShardId(0))
    }
}

impl Fleet {
    pub fn new(node_count: u32, key_count: u32) -> Self {
        Self::with_node_config(node_count, key_count, |_| {})
    }

    /// A fleet whose node configuration `tweak` adjusts (every node alike).
    pub fn with_node_config(
        node_count: u32,
        key_count: u32,
        tweak: impl Fn(&mut NodeConfig),
    ) -> Self {
        let now = Now {
            wall_ms: 1_764_720_000_000,
            mono_ms: 1_000,
        };
        let nodes = (0..node_count)
            .map(|i| {
                let mut config = node_config(i, node_count);
                tweak(&mut config);
                NodeLimiter::new(
                    config,
                    Arc::new(DecisionSurface::new(SurfaceConfig::default())),
                    NodeEpoch(u64::from(i) + 1),
                    now,
                )
            })
            .collect();
        Self {
            now,
            nodes,
            owner: FoldOwner::new(owner_config(node_count), OwnerEpoch(1), now, false),
            policy: KeyPolicy::new(&windows(), ROUND_MS).unwrap(),
            keys: (0..key_count)
                .map(|k| KeyId {
                    version: 1,
                    digest: 0x1234_5678_9abc_def0_u128 * (u128::from(k) + 3),
                })
                .collect(),
            in_flight: Vec::new(),
            dead_spend: Vec::new(),
            next_epoch: u64::from(node_count) + 1,
            owner_epoch: 1,
            owner_changes: 0,
            admitted: 0,
        }
    }

    pub fn advance(&mut self, ms: u64) {
        self.now.wall_ms += ms;
        self.now.mono_ms += ms;
    }

    fn drain_node(&mut self, i: usize) {
        while let Some(t) = self.nodes[i].poll_transmit() {
            self.in_flight.push(match t {
                Transmit::Report(r) => Msg::Report(r),
                Transmit::FastPath(f) => Msg::FastPath(f),
            });
        }
    }

    fn drain_owner(&mut self) {
        while let Some(g) = self.owner.poll_grant() {
            self.in_flight.push(Msg::Grant(g));
        }
    }

    /// One request at node `i` for key `k`. The fast path, if taken, is sent and the
    /// request re-decided as if its 1 ms deadline passed (the reply is just another
    /// message in flight, delivered or not by the test).
    pub fn request(&mut self, i: usize, k: usize) -> Decision {
        let key = self.keys[k];
        let surface = Arc::clone(self.nodes[i].surface());
        let mut d = surface.decide(key, self.now.wall_ms, &self.policy);
        if let Decision::FastPath(need) = d {
            self.nodes[i].handle_fast_path_need(self.now, need);
            self.drain_node(i);
            d = surface.decide_after_fast_path(key, self.now.wall_ms, &self.policy, true);
        }
        if matches!(d, Decision::Admit | Decision::FailOpen) {
            self.admitted += 1;
        }
        d
    }

    pub fn tick_node(&mut self, i: usize) {
        self.nodes[i].handle_tick(self.now);
        self.drain_node(i);
    }

    pub fn tick_owner(&mut self) {
        self.owner.handle_tick(self.now);
    }

    /// Deliver message `idx` (removing it unless `keep`, which duplicates it).
    pub fn deliver(&mut self, idx: usize, keep: bool) {
        if self.in_flight.is_empty() {
            return;
        }
        let idx = idx % self.in_flight.len();
        let msg = if keep {
            self.in_flight[idx].clone()
        } else {
            self.in_flight.remove(idx)
        };
        // Every message crosses the real codec, as it would on the bus.
        let msg = through_the_wire(msg);
        match msg {
            Msg::Report(r) => {
                self.owner.handle_report_batch(self.now, &r);
                self.drain_owner();
            }
            Msg::FastPath(f) => {
                let reply = self.owner.handle_fast_path_request(self.now, &f);
                self.in_flight.push(Msg::Reply(f.node, reply));
            }
            Msg::Grant(g) => {
                if let Some(n) = self.nodes.iter_mut().find(|n| n.node() == g.node) {
                    n.handle_grant_batch(self.now, &g);
                }
            }
            Msg::Reply(node, r) => {
                if let Some(n) = self.nodes.iter_mut().find(|n| n.node() == node) {
                    n.handle_fast_path_reply(self.now, &r);
                }
            }
        }
    }

    pub fn drop_msg(&mut self, idx: usize) {
        if !self.in_flight.is_empty() {
            let idx = idx % self.in_flight.len();
            self.in_flight.remove(idx);
        }
    }

    /// The process dies with its memory (C9): its admitted spend stays in the world.
    pub fn restart(&mut self, i: usize) {
        let old = &self.nodes[i];
        for kw in old.key_windows().collect::<Vec<_>>() {
            let line = old.line_for(&kw).unwrap();
            self.dead_spend
                .push((kw, line.cumulative_spend, line.self_granted));
        }
        // A later life's epoch is its start in wall ms (C9), as the runtimes make it.
        let epoch = NodeEpoch(self.now.wall_ms.max(self.next_epoch));
        self.next_epoch = epoch.0 + 1;
        let config = old.config().clone();
        self.nodes[i] = NodeLimiter::new(
            config,
            Arc::new(DecisionSurface::new(SurfaceConfig::default())),
            epoch,
            self.now,
        );
    }

    pub fn change_owner(&mut self) {
        self.owner_epoch += 1;
        self.owner_changes += 1;
        let fleet = self.nodes.len() as u32;
        self.owner = FoldOwner::new(
            owner_config(fleet),
            OwnerEpoch(self.owner_epoch),
            self.now,
            true,
        );
    }

    /// Fleet-wide truth for every key-window anyone knows: admitted plus still-spendable
    /// credit, less what nodes gave themselves (F4, A-fixed), never exceeds the allowance.
    pub fn check_fleet_truth(&self) -> Result<(), String> {
        let mut totals: std::collections::BTreeMap<KeyWindow, (u64, u64, u64)> = Default::default();
        for n in &self.nodes {
            for kw in n.key_windows() {
                let l = n.line_for(&kw).unwrap();
                let t = totals.entry(kw).or_insert((0, 0, l.allowance));
                t.0 += l.cumulative_spend + l.held_credit;
                t.1 += l.self_granted;
            }
        }
        for (kw, spend, self_granted) in &self.dead_spend {
            // A key-window only dead epochs knew is held to the plan's allowance too.
            let plan = windows()
                .iter()
                .find(|w| w.length_ms == kw.window.length_ms)
                .map(|w| w.limit)
                .expect("a dead epoch's key-window is one of the plan's windows");
            let t = totals.entry(*kw).or_insert((0, 0, plan));
            t.0 += spend;
            t.1 += self_granted;
        }
        for (kw, (used, self_granted, allowance)) in totals {
            if used > allowance.saturating_add(self_granted) {
                return Err(format!(
                    "{kw:?}: used {used} > allowance {allowance} + self-granted {self_granted}"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spend of dead epochs alone (no live node has a line for the key-window any more)
    /// is still held to the plan's allowance: it once read as unlimited.
    #[test]
    fn dead_epochs_alone_over_the_allowance_breach_fleet_truth() {
        let mut fleet = Fleet::new(2, 1);
        let kw = KeyWindow {
            key: fleet.keys[0],
            window: bus_schemas::WindowId {
                length_ms: 1_000,
                number: 7,
            },
        };
        fleet.dead_spend.push((kw, 30, 0));
        assert_eq!(fleet.check_fleet_truth(), Ok(()));
        fleet.dead_spend.push((kw, 11, 0));
        let err = fleet.check_fleet_truth().expect_err("41 spent of 40");
        assert!(err.contains("used 41 > allowance 40"), "{err}");
    }
}
