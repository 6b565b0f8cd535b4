//! The fleet truth (F4): per key-window, what every node epoch has used and given
//! itself, dead epochs included, kept up to date by each step's changes and cross-checked
//! against a walk of every node's books.

use bus_schemas::KeyWindow;
use bus_schemas::hashing::DetMap;
use node_core::NodeLimiter;
use node_core::window::window_end_ms;

use super::{Sim, WALL0_MS};

/// One key-window's fleet truth: live node epochs' lines and dead epochs' spend.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Truth {
    allowance: u64,
    live_used: u64,
    live_self_granted: u64,
    live_lines: u32,
    dead_used: u64,
    dead_self_granted: u64,
    dead_lines: u32,
}

impl Truth {
    /// (used, self-granted) across the fleet, or None while no live node has a line (a
    /// dead epoch's spend alone cannot grow, and was checked while its line was live).
    fn sums(&self) -> Option<(u64, u64)> {
        (self.live_lines > 0).then_some((
            self.live_used + self.dead_used,
            self.live_self_granted + self.dead_self_granted,
        ))
    }
}

impl Sim {
    /// After a step that touched node `i`: its book and the fleet truth, checked for the
    /// key-windows the step changed, the truth's sums moved by what changed (see the
    /// module comment for why that is complete).
    pub(super) fn node_step(&mut self, i: usize, t_ms: u64) {
        let mut changed = std::mem::take(&mut self.changed);
        changed.clear();
        let Some(limiter) = self.nodes[i].limiter.as_mut() else {
            self.changed = changed;
            return;
        };
        let mut found = Vec::new();
        match limiter.take_changes(&mut changed) {
            Ok(true) => {}
            Ok(false) => found.push(format!("node {i}: more changes than its log holds")),
            Err(e) => found.push(format!("node {i}: {e}")),
        }
        // A reaped line's removal comes before any new line for its key-window, so a
        // sum checked as each change lands never exceeds the step's final one.
        let mut breached = Vec::new();
        for c in &changed {
            if truth_move(
                &mut self.truth,
                c.key_window,
                c.allowance,
                c.before,
                c.after,
            ) {
                breached.push(c.key_window);
            }
        }
        self.changed = changed;
        breached.sort_unstable();
        breached.dedup();
        found.extend(
            breached
                .iter()
                .filter_map(|kw| truth_breach(&self.truth, kw)),
        );
        for f in found {
            self.violation(t_ms, f);
        }
    }

    /// Fleet-wide truth per key-window: admitted plus still-spendable credit across every
    /// epoch, dead ones included, never exceeds the allowance plus what nodes gave
    /// themselves (F4). Every step checks the key-windows it changed (`node_step`); this
    /// walk of every node's books, every `full_check_rounds` rounds, checks them all and
    /// cross-checks the kept sums against it.
    pub(super) fn check_fleet_truth(&mut self, t_ms: u64) {
        let mut walk = std::mem::take(&mut self.truth_walk);
        for n in &self.nodes {
            let Some(l) = n.limiter.as_ref() else {
                continue;
            };
            l.for_each_truth_line(|line| {
                let t = walk
                    .entry(line.key_window)
                    .or_insert((0, 0, line.allowance));
                t.0 += line.cumulative_spend + line.held_credit;
                t.1 += line.self_granted;
            });
        }
        for (kw, spend, self_granted) in &self.dead_spend {
            if let Some(t) = walk.get_mut(kw) {
                t.0 += spend;
                t.1 += self_granted;
            }
        }
        let kept_live = self.truth.values().filter(|t| t.live_lines > 0).count();
        if kept_live != walk.len() {
            let count = walk.len();
            self.violation(
                t_ms,
                format!("fleet truth: {kept_live} key-windows kept, {count} walked"),
            );
        }
        let mut bad: Vec<(KeyWindow, String)> = Vec::new();
        // Only breaches are sorted (for a stable report order); the scan itself is O(lines).
        for (kw, (used, self_granted, allowance)) in walk.drain() {
            let kept = self.truth.get(&kw).and_then(Truth::sums);
            if kept != Some((used, self_granted)) {
                bad.push((
                    kw,
                    format!("fleet truth {kw:?}: kept {kept:?}, walked ({used}, {self_granted})"),
                ));
            }
            if used > allowance.saturating_add(self_granted) {
                bad.push((
                    kw,
                    format!(
                        "fleet truth {kw:?}: used {used} > allowance {allowance} + self-granted {self_granted}"
                    ),
                ));
            }
        }
        self.truth_walk = walk;
        bad.sort_unstable_by_key(|(kw, _)| *kw);
        for (_, b) in bad {
            self.violation(t_ms, b);
        }
    }

    /// Dead epochs' lines matter only while their window is open.
    pub(super) fn expire_dead_spend(&mut self, t_ms: u64) {
        let wall = WALL0_MS + t_ms;
        let truth = &mut self.truth;
        self.dead_spend.retain(|(kw, spend, self_granted)| {
            if window_end_ms(kw.key, kw.window) + 1_000 > wall {
                return true;
            }
            let t = truth.get_mut(kw).expect("every dead line is kept");
            t.dead_used -= spend;
            t.dead_self_granted -= self_granted;
            t.dead_lines -= 1;
            if t.live_lines == 0 && t.dead_lines == 0 {
                truth.remove(kw);
            }
            false
        });
    }

    /// A restarted node's old epoch leaves the live truth; its spend stays, as dead
    /// spend, while its windows are open (C9).
    pub(super) fn retire_lines(&mut self, old: &NodeLimiter, t_ms: u64) {
        let mut touched = Vec::new();
        let (dead, truth) = (&mut self.dead_spend, &mut self.truth);
        old.for_each_truth_line(|line| {
            let kw = line.key_window;
            // Its live part is what it last counted: only decisions came since.
            truth_move(
                truth,
                kw,
                line.allowance,
                Some((line.cumulative_spend + line.held_credit, line.self_granted)),
                None,
            );
            dead.push((kw, line.cumulative_spend, line.self_granted));
            let t = truth.entry(kw).or_insert(Truth {
                allowance: line.allowance,
                ..Truth::default()
            });
            t.dead_used += line.cumulative_spend;
            t.dead_self_granted += line.self_granted;
            t.dead_lines += 1;
            touched.push(kw);
        });
        touched.sort_unstable();
        touched.dedup();
        let found: Vec<String> = touched
            .iter()
            .filter_map(|kw| truth_breach(&self.truth, kw))
            .collect();
        for f in found {
            self.violation(t_ms, f);
        }
    }
}

/// Moves one node line's part of a key-window's truth from `before` to `now` (used,
/// self-granted); an entry no line holds any more is dropped. Returns whether the
/// key-window's truth is now breached (one lookup for the move and the check).
fn truth_move(
    truth: &mut DetMap<KeyWindow, Truth>,
    kw: KeyWindow,
    allowance: u64,
    before: Option<(u64, u64)>,
    now: Option<(u64, u64)>,
) -> bool {
    if before == now {
        return false;
    }
    let t = truth.entry(kw).or_default();
    if let Some((used, self_granted)) = before {
        assert!(
            t.live_lines > 0,
            "{kw:?}: a line leaves the truth it never joined"
        );
        t.live_used -= used;
        t.live_self_granted -= self_granted;
        t.live_lines -= 1;
    }
    if let Some((used, self_granted)) = now {
        if t.live_lines == 0 && t.dead_lines == 0 {
            t.allowance = allowance;
        }
        t.live_used += used;
        t.live_self_granted += self_granted;
        t.live_lines += 1;
    }
    if t.live_lines == 0 && t.dead_lines == 0 {
        truth.remove(&kw);
        return false;
    }
    t.sums()
        .is_some_and(|(used, self_granted)| used > t.allowance.saturating_add(self_granted))
}

/// A breach of fleet truth at `kw`, as a violation's text.
fn truth_breach(truth: &DetMap<KeyWindow, Truth>, kw: &KeyWindow) -> Option<String> {
    let t = truth.get(kw)?;
    let (used, self_granted) = t.sums()?;
    (used > t.allowance.saturating_add(self_granted)).then(|| {
        format!(
            "fleet truth {kw:?}: used {used} > allowance {} + self-granted {self_granted}",
            t.allowance
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Scenario, SimConfig, SimMode};

    /// A violation the checks find names the run's seed, the simulated time and the
    /// command that replays it. The breach is planted in the kept fleet truth (a line no
    /// node holds, over its allowance), and the periodic cross-check against every
    /// node's books is what finds it.
    #[test]
    fn a_violation_names_its_seed_and_the_command_that_replays_it() {
        let cfg = SimConfig {
            nodes: 3,
            keys: 5,
            seconds: 2,
            seed: 42,
            rate: 100,
            ..SimConfig::new(Scenario::Pinned, SimMode::Leasing)
        };
        let mut sim = Sim::new(cfg.clone()).expect("valid config");
        let kw = KeyWindow {
            key: sim.keys[0],
            window: bus_schemas::WindowId {
                length_ms: 1_000,
                number: 7,
            },
        };
        assert!(truth_move(&mut sim.truth, kw, 10, None, Some((11, 0))));
        sim.check_fleet_truth(1_250);
        assert_eq!(sim.violation_count, 1, "{:?}", sim.violations);
        let v = &sim.violations[0];
        let replay = cfg.replay_command();
        assert!(replay.contains("--seed 42") && replay.contains("--scenario pinned"));
        assert!(
            v.starts_with("t=1250 ms seed=42: fleet truth: 1 key-windows kept, 0 walked"),
            "{v}"
        );
        assert!(v.ends_with(&format!("replay: {replay}")), "{v}");
    }
}
