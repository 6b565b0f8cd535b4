//! The simulated fleet: node limiters and fold owners (or the global-sync baseline's
//! nodes and owners) on one simulated bus, and what each protocol event does to them.
//! The step loop that drives them is in `step`; the fleet-truth bookkeeping every step
//! is checked against is in `truth`.

mod step;
mod truth;

use std::sync::Arc;

use bus_schemas::hashing::DetMap;
use bus_schemas::{KeyId, KeyWindow, NodeEpoch, NodeId, Now, OwnerEpoch, ShardId, WindowSpec};
use fold_core::{FoldOwner, OwnerConfig, OwnerMode};
use node_core::window::{window_at, window_end_ms};
use node_core::{
    Decision, DecisionSurface, KeyPolicy, Mode, NodeConfig, NodeLimiter, SurfaceConfig, Transmit,
};

use crate::bus::{Bus, BusParams, FastPathFate, Payload, Target};
use crate::config::{SimConfig, SimError, SimMode, WhatIf};
use crate::global_sync::{self, GsNode, GsOwner};
use crate::oracle::{Books, BooksThread};
use crate::report::Counts;
use crate::rng::Rng;
use truth::Truth;

/// The virtual wall clock's origin (true time); nodes add their skew to it.
const WALL0_MS: u64 = 1_764_720_000_000;
const MONO0_MS: u64 = 1_000_000;
const ROUND_MS: u64 = 25;
/// `owner-crash`: a new owner takes over this long after the old one died (the lease of
/// the NATS runtime lapses in a few rounds).
const TAKEOVER_AFTER_MS: u64 = 4 * ROUND_MS;
/// `restarts`: how long a restarting node is gone (its traffic goes to the next node).
const RESTART_DOWN_MS: u64 = 300;
/// Violations kept per run (the count is exact; the text of the first few is enough).
const VIOLATIONS_KEPT: usize = 16;

/// A node: its limiter (leasing and fixed) or its global-sync state, and where its
/// clock and round stand.
struct SimNode {
    limiter: Option<NodeLimiter>,
    gs: GsNode,
    skew_ms: i64,
    phase_ms: u64,
    down_until_ms: u64,
}

/// A shard's owner: its fold owner (leasing and fixed) or its global-sync state.
struct SimOwner {
    owner: Option<FoldOwner>,
    gs: GsOwner,
    epoch: u64,
    revive_at_ms: Option<u64>,
    phase_ms: u64,
}

impl SimNode {
    /// Node `i` at the start of a run. Draws its clock skew, then its round phase.
    fn start(cfg: &SimConfig, i: u32, rng: &mut Rng) -> Self {
        let skew_ms = if cfg.skew_ms == 0 {
            0
        } else {
            rng.below(cfg.skew_ms + 1) as i64 - (cfg.skew_ms / 2) as i64
        };
        SimNode {
            limiter: (cfg.mode != SimMode::GlobalSync).then(|| {
                let mut l = NodeLimiter::new(
                    node_config(cfg, i),
                    surface_for(cfg),
                    NodeEpoch(1),
                    start_now(skew_ms),
                );
                l.track_changes();
                l
            }),
            gs: GsNode::default(),
            skew_ms,
            phase_ms: rng.below(ROUND_MS),
            down_until_ms: 0,
        }
    }
}

impl SimOwner {
    /// Shard `s`'s owner at the start of a run. Draws its round phase.
    fn start(cfg: &SimConfig, s: u32, rng: &mut Rng) -> Self {
        SimOwner {
            owner: (cfg.mode != SimMode::GlobalSync)
                .then(|| FoldOwner::new(owner_config(cfg, s), OwnerEpoch(1), start_now(0), false)),
            gs: GsOwner::default(),
            epoch: 1,
            revive_at_ms: None,
            phase_ms: rng.below(ROUND_MS),
        }
    }
}

/// The clocks at t = 0 of a process whose wall clock is off by `skew_ms`.
fn start_now(skew_ms: i64) -> Now {
    Now {
        wall_ms: WALL0_MS.wrapping_add_signed(skew_ms),
        mono_ms: MONO0_MS,
    }
}

/// A run's keys, drawn from its seed.
fn draw_keys(cfg: &SimConfig, rng: &mut Rng) -> Vec<KeyId> {
    (0..cfg.keys)
        .map(|_| KeyId {
            version: 1,
            digest: (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64()) | 1,
        })
        .collect()
}

fn bus_params(cfg: &SimConfig) -> BusParams {
    BusParams {
        loss_pct: cfg.loss_pct,
        dup_pct: cfg.dup_pct,
        reorder_pct: cfg.reorder_pct,
        base_us: 150,
        jitter_mean_us: 100.0,
        reorder_max_us: 2 * ROUND_MS * 1_000,
        codec: cfg.codec,
        no_fast_path_misses: cfg.lifts(WhatIf::NoFastPathMisses),
    }
}

/// One run: the fleet, the bus, the oracle's books, the counts, and the fleet truth the
/// checks hold the fleet to.
pub(crate) struct Sim {
    cfg: SimConfig,
    policy: KeyPolicy,
    plan: [WindowSpec; 2],
    keys: Vec<KeyId>,
    nodes: Vec<SimNode>,
    owners: Vec<SimOwner>,
    bus: Bus,
    books: BooksThread,
    counts: Counts,
    violations: Vec<String>,
    violation_count: u64,
    next_node_epoch: u64,
    /// Spend of node epochs that died: admitted requests still count (C9).
    dead_spend: Vec<(KeyWindow, u64, u64)>,
    /// Fleet truth per key-window, kept up to date by every step (`node_step`).
    truth: DetMap<KeyWindow, Truth>,
    /// The cross-check's walk (`check_fleet_truth`), kept between walks: built from
    /// empty each time, the map's growth cost as much as filling it.
    truth_walk: DetMap<KeyWindow, (u64, u64, u64)>,
    changed: Vec<node_core::LineChange>,
}

fn node_config(cfg: &SimConfig, i: u32) -> NodeConfig {
    NodeConfig {
        fleet_size: cfg.nodes,
        shards: cfg.nodes,
        mode: if cfg.mode == SimMode::Fixed {
            Mode::Fixed
        } else {
            Mode::Leasing
        },
        degraded_after_ms: cfg.degraded_after_ms,
        standing_permille: cfg
            .standing_permille
            .unwrap_or(NodeConfig::reference(NodeId(i)).standing_permille),
        // Every decision goes through `decide_leasing`, which says so.
        decisions_hinted: true,
        ..NodeConfig::reference(NodeId(i))
    }
}

fn owner_config(cfg: &SimConfig, shard: u32) -> OwnerConfig {
    let reference = OwnerConfig::reference(ShardId(shard));
    OwnerConfig {
        lead_rounds: cfg.lead_rounds.unwrap_or(reference.lead_rounds),
        headroom_permille: cfg.headroom_permille.unwrap_or(reference.headroom_permille),
        burst_sigmas: cfg.burst_sigmas.unwrap_or(reference.burst_sigmas),
        standing_permille: cfg.standing_permille.unwrap_or(reference.standing_permille),
        what_if_central_endgame: cfg.lifts(WhatIf::CentralEndgame),
        shards: cfg.nodes,
        fleet_size: cfg.nodes,
        mode: if cfg.mode == SimMode::Fixed {
            OwnerMode::Fixed
        } else {
            OwnerMode::Leasing
        },
        ..reference
    }
}

fn surface_for(cfg: &SimConfig) -> Arc<DecisionSurface> {
    Arc::new(DecisionSurface::new(SurfaceConfig {
        // Room for every key with eviction headroom (D7 starts at 90% of the cap).
        bucket_cap: (cfg.keys as usize * 2).max(1_024),
        // Nothing here races a rehash, and compact tables keep the fleet in cache.
        presize: false,
        what_if_fast_path_every_request: cfg.lifts(WhatIf::FastPathEveryRequest),
        ..SurfaceConfig::default()
    }))
}

impl Sim {
    pub(crate) fn new(cfg: SimConfig) -> Result<Self, SimError> {
        if !(2..=1_024).contains(&cfg.nodes) || cfg.keys == 0 || cfg.seconds < 2 || cfg.rate == 0 {
            return Err(SimError::Shape);
        }
        let plan = cfg.plan();
        let policy = KeyPolicy::new(&plan, ROUND_MS as u32)?;
        // One stream, drawn keys first, then nodes, then owners: a seed's run depends on
        // that order.
        let mut rng = Rng::stream(cfg.seed, 0x5e7);
        let keys = draw_keys(&cfg, &mut rng);
        let nodes = (0..cfg.nodes)
            .map(|i| SimNode::start(&cfg, i, &mut rng))
            .collect();
        let owners = (0..cfg.nodes)
            .map(|s| SimOwner::start(&cfg, s, &mut rng))
            .collect();
        Ok(Self {
            bus: Bus::new(bus_params(&cfg), cfg.seed),
            books: BooksThread::start(Books::new(keys.clone(), plan.to_vec())),
            policy,
            plan,
            keys,
            nodes,
            owners,
            counts: Counts::default(),
            violations: Vec::new(),
            violation_count: 0,
            next_node_epoch: 2,
            dead_spend: Vec::new(),
            truth: DetMap::default(),
            truth_walk: DetMap::default(),
            changed: Vec::new(),
            cfg,
        })
    }

    fn node_now(&self, i: usize, t_ms: u64) -> Now {
        Now {
            wall_ms: (WALL0_MS + t_ms).wrapping_add_signed(self.nodes[i].skew_ms),
            mono_ms: MONO0_MS + t_ms,
        }
    }

    fn owner_now(t_ms: u64) -> Now {
        Now {
            wall_ms: WALL0_MS + t_ms,
            mono_ms: MONO0_MS + t_ms,
        }
    }

    fn violation(&mut self, t_ms: u64, what: String) {
        self.violation_count += 1;
        if self.violations.len() < VIOLATIONS_KEPT {
            self.violations.push(format!(
                "t={t_ms} ms seed={}: {what}\n  replay: {}",
                self.cfg.seed,
                self.cfg.replay_command()
            ));
        }
    }

    /// Sends what node `i` has to send as it gives it out, without collecting it first.
    fn send_transmits(&mut self, i: usize, t_ms: u64) {
        let Some(limiter) = self.nodes[i].limiter.as_mut() else {
            return;
        };
        while let Some(t) = limiter.poll_transmit() {
            let (shard, payload) = match t {
                Transmit::Report(r) => (r.shard.0, Payload::Report(r)),
                Transmit::FastPath(f) => (f.shard.0, Payload::FastPathRequest(f)),
            };
            self.bus.send(t_ms * 1_000, Target::Owner(shard), payload);
        }
    }

    fn send_grants(&mut self, s: usize, t_ms: u64) {
        let Some(owner) = self.owners[s].owner.as_mut() else {
            return;
        };
        while let Some(g) = owner.poll_grant() {
            let node = g.node.0;
            self.bus
                .send(t_ms * 1_000, Target::Node(node), Payload::Grant(g));
        }
    }

    fn send_grant_batches(&mut self, t_ms: u64, out: Vec<bus_schemas::GrantBatch>) {
        for g in out {
            let node = g.node.0;
            self.bus
                .send(t_ms * 1_000, Target::Node(node), Payload::Grant(g));
        }
    }

    fn deliver(&mut self, t_ms: u64, target: Target, payload: &Payload) {
        match (target, payload) {
            (Target::Owner(s), Payload::Report(r)) => {
                let now = Self::owner_now(t_ms);
                let Some(owner) = self.owners[s as usize].owner.as_mut() else {
                    return;
                };
                owner.handle_report_batch(now, r);
                if let Err(e) = owner.check_key_windows(r.entries.iter().map(|e| &e.key_window)) {
                    self.violation(t_ms, format!("owner {s}: {e}"));
                }
                self.send_grants(s as usize, t_ms);
            }
            (Target::Owner(s), Payload::FastPathRequest(f)) => {
                let now = Self::owner_now(t_ms);
                let Some(owner) = self.owners[s as usize].owner.as_mut() else {
                    return;
                };
                let reply = owner.handle_fast_path_request(now, f);
                if let Err(e) = owner.check_key_windows([&f.entry.key_window]) {
                    self.violation(t_ms, format!("owner {s}: {e}"));
                }
                self.bus.send(
                    t_ms * 1_000,
                    Target::Node(f.node.0),
                    Payload::FastPathReply(reply),
                );
            }
            (Target::Node(n), Payload::Grant(g)) => {
                let now = self.node_now(n as usize, t_ms);
                let Some(limiter) = self.nodes[n as usize].limiter.as_mut() else {
                    return;
                };
                limiter.handle_grant_batch(now, g);
                self.node_step(n as usize, t_ms);
            }
            (Target::Node(n), Payload::FastPathReply(r)) => {
                let now = self.node_now(n as usize, t_ms);
                if let Some(limiter) = self.nodes[n as usize].limiter.as_mut() {
                    limiter.handle_fast_path_reply(now, r);
                    self.node_step(n as usize, t_ms);
                }
            }
            (Target::Owner(s), Payload::GsHits(h)) => {
                let plan = self.plan;
                let limit_of = |len: u32| {
                    plan.iter()
                        .find(|w| w.length_ms == len)
                        .map_or(0, |w| w.limit)
                };
                if self.owners[s as usize].revive_at_ms.is_none() {
                    self.owners[s as usize].gs.handle_hits(h, limit_of);
                }
            }
            (Target::Node(n), Payload::GsRemaining(r)) => {
                self.nodes[n as usize].gs.handle_remaining(r);
            }
            _ => {}
        }
    }

    fn tick_node(&mut self, i: usize, t_ms: u64) {
        let now = self.node_now(i, t_ms);
        if self.cfg.mode == SimMode::GlobalSync {
            let nodes = self.cfg.nodes;
            let keys = &self.keys;
            let hits = self.nodes[i].gs.flush(|k| {
                KeyWindow {
                    key: keys[k as usize],
                    window: bus_schemas::WindowId {
                        length_ms: 1_000,
                        number: 0,
                    },
                }
                .shard(nodes)
                .0
            });
            for h in hits {
                let shard = h.shard;
                self.bus
                    .send(t_ms * 1_000, Target::Owner(shard), Payload::GsHits(h));
            }
            if t_ms.is_multiple_of(1_000) {
                self.nodes[i].gs.reap(|kw| gs_ended(keys, kw, now.wall_ms));
            }
            return;
        }
        let Some(limiter) = self.nodes[i].limiter.as_mut() else {
            return;
        };
        limiter.handle_tick(now);
        let degraded = limiter.surface().degraded();
        self.node_step(i, t_ms);
        let limiter = self.nodes[i].limiter.as_mut().expect("ticked above");
        if (t_ms / ROUND_MS).is_multiple_of(self.cfg.full_check_rounds)
            && let Err(e) = limiter.check_invariants()
        {
            self.violation(t_ms, format!("node {i}: {e}"));
        }
        self.counts.degraded_node_rounds += u64::from(degraded);
        self.send_transmits(i, t_ms);
    }

    fn tick_owner(&mut self, s: usize, t_ms: u64) {
        let now = Self::owner_now(t_ms);
        if self.cfg.mode == SimMode::GlobalSync {
            if self.owners[s].revive_at_ms.is_some() {
                return;
            }
            for r in self.owners[s].gs.broadcast(self.cfg.nodes) {
                let node = r.node;
                self.bus
                    .send(t_ms * 1_000, Target::Node(node), Payload::GsRemaining(r));
            }
            if t_ms.is_multiple_of(1_000) {
                let keys = self.keys.clone();
                self.owners[s]
                    .gs
                    .reap(|kw| gs_ended(&keys, kw, now.wall_ms));
            }
            return;
        }
        let Some(owner) = self.owners[s].owner.as_mut() else {
            return;
        };
        owner.handle_tick(now);
        let mut out = Vec::new();
        while let Some(g) = owner.poll_grant() {
            out.push(g);
        }
        // A tick changes the ledgers it grants from (the hot lane) and drops reaped ones.
        let checked = if (t_ms / ROUND_MS).is_multiple_of(self.cfg.full_check_rounds) {
            owner.check_invariants()
        } else {
            owner.check_key_windows(
                out.iter()
                    .flat_map(|g| g.entries.iter().map(|e| &e.key_window)),
            )
        };
        if let Err(e) = checked {
            self.violation(t_ms, format!("owner {s}: {e}"));
        }
        self.send_grant_batches(t_ms, out);
    }

    fn restart_node(&mut self, i: usize, t_ms: u64) {
        if let Some(old) = self.nodes[i].limiter.take() {
            self.retire_lines(&old, t_ms);
            self.counts.add_node_outcomes(old.stats());
        }
        self.nodes[i].gs = GsNode::default();
        self.nodes[i].down_until_ms = t_ms + RESTART_DOWN_MS;
        self.counts.node_restarts += 1;
    }

    fn revive_node(&mut self, i: usize, t_ms: u64) {
        if self.cfg.mode == SimMode::GlobalSync || self.nodes[i].limiter.is_some() {
            return;
        }
        // A later life's epoch is its start in wall ms (C9), as the runtimes make it:
        // a window that began before it is not this epoch's to take an option of.
        let now = self.node_now(i, t_ms);
        let epoch = NodeEpoch(now.wall_ms.max(self.next_node_epoch));
        self.next_node_epoch = epoch.0 + 1;
        let mut limiter = NodeLimiter::new(
            node_config(&self.cfg, i as u32),
            surface_for(&self.cfg),
            epoch,
            now,
        );
        limiter.track_changes();
        self.nodes[i].limiter = Some(limiter);
    }

    fn crash_owners(&mut self, t_ms: u64) {
        // Half the shards lose their owner mid-window.
        for s in (0..self.owners.len()).step_by(2) {
            if let Some(dead) = self.owners[s].owner.take() {
                self.counts.add_owner(&dead);
            }
            self.owners[s].gs = GsOwner::default();
            self.owners[s].revive_at_ms = Some(t_ms + TAKEOVER_AFTER_MS);
        }
    }

    fn revive_owners(&mut self, t_ms: u64) {
        for s in 0..self.owners.len() {
            if self.owners[s].revive_at_ms.is_some_and(|at| at <= t_ms) {
                self.owners[s].revive_at_ms = None;
                self.owners[s].epoch += 1;
                self.counts.owner_changes += 1;
                if self.cfg.mode != SimMode::GlobalSync {
                    // C8: the new owner rebuilds from reports and withholds.
                    self.owners[s].owner = Some(FoldOwner::new(
                        owner_config(&self.cfg, s as u32),
                        OwnerEpoch(self.owners[s].epoch),
                        Self::owner_now(t_ms),
                        true,
                    ));
                }
            }
        }
    }

    /// One request at node `i` (already rerouted if its node was down).
    fn request(&mut self, k: u32, i: usize, t_ms: u64) {
        self.counts.offered += 1;
        let now = self.node_now(i, t_ms);
        let key = self.keys[k as usize];
        let admitted = if self.cfg.mode == SimMode::GlobalSync {
            let kws = self.plan.map(|w| {
                (
                    (
                        k,
                        w.length_ms,
                        window_at(key, w.length_ms, now.wall_ms).number,
                    ),
                    w.limit,
                )
            });
            self.nodes[i].gs.decide(&kws)
        } else {
            self.decide_leasing(key, i, t_ms, now)
        };
        if admitted {
            self.counts.admitted += 1;
        } else {
            self.counts.denied += 1;
        }
        // Booked in the windows this node named, as its limiter spent them (`oracle`).
        self.books.book(k, now.wall_ms, admitted);
    }

    fn decide_leasing(&mut self, key: KeyId, i: usize, t_ms: u64, now: Now) -> bool {
        let Some(limiter) = self.nodes[i].limiter.as_mut() else {
            return false;
        };
        let surface = Arc::clone(limiter.surface());
        let mut d = surface.decide(key, now.wall_ms, &self.policy);
        limiter.note_decision(key);
        if let Decision::FastPath(need) = d {
            self.counts.fast_path += 1;
            limiter.handle_fast_path_need(now, need);
            let mut requests = Vec::new();
            while let Some(t) = limiter.poll_transmit() {
                if let Transmit::FastPath(f) = t {
                    requests.push(f);
                }
            }
            let mut missed = false;
            for f in requests {
                let s = f.shard.0 as usize;
                match self.bus.fast_path(t_ms * 1_000) {
                    FastPathFate::OnTime if self.owners[s].owner.is_some() => {
                        let owner_now = Self::owner_now(t_ms);
                        let owner = self.owners[s].owner.as_mut().expect("checked");
                        let reply = owner.handle_fast_path_request(owner_now, &f);
                        if let Err(e) = owner.check_key_windows([&f.entry.key_window]) {
                            self.violation(t_ms, format!("owner {s}: {e}"));
                        }
                        let limiter = self.nodes[i].limiter.as_mut().expect("present");
                        limiter.handle_fast_path_reply(now, &reply);
                    }
                    FastPathFate::OnTime | FastPathFate::Lost => missed = true,
                    FastPathFate::Late { at_us } => {
                        missed = true;
                        self.bus.schedule(
                            at_us,
                            Target::Owner(s as u32),
                            Payload::FastPathRequest(f),
                        );
                    }
                }
            }
            self.counts.fast_path_deadline_missed += u64::from(missed);
            // The exchange is one step: the records the need made, the replies applied.
            self.node_step(i, t_ms);
            d = surface.decide_after_fast_path(key, now.wall_ms, &self.policy, missed);
        }
        match d {
            Decision::Admit => true,
            Decision::FailOpen => {
                self.counts.fail_open_admitted += 1;
                true
            }
            Decision::Deny(_) => false,
            Decision::FastPath(_) => {
                self.violation(t_ms, "fast path offered twice for one request".into());
                false
            }
        }
    }
}

fn gs_ended(keys: &[KeyId], kw: &global_sync::GsKw, wall_ms: u64) -> bool {
    let id = bus_schemas::WindowId {
        length_ms: kw.1,
        number: kw.2,
    };
    window_end_ms(keys[kw.0 as usize], id) + 1_000 < wall_ms
}
