//! Standing options, the owner's side. Every fleet node may take its share of a
//! key-window's standing credit unasked (`credit_sizing::standing_total`), so the owner
//! counts the option of every node it has not heard settle it as committed
//! (`Ledger::unsettled_options`). A node settles its option in a report line that says
//! `standing_option`: its `self_granted` is then all it took.
//!
//! When a key-window's pool runs dry while options are still unsettled, the owner
//! recalls some: it sends a node it knows and has not heard from a grant of nothing for
//! the key-window. A node that gets a grant for a key-window gives its option up (or
//! hands back what it holds of it, as any credit), and its next report settles it. A key
//! spread thin loses two options (`LOW_WATER_RECALL`); one that concentrates on a few
//! nodes (`Ledger::concentrated`) loses all of them, in this window and the next. So a
//! key far below its limit costs the bus nothing per window, and a concentrated one gets
//! its allowance back within a few rounds.

use bus_schemas::{KeyWindow, NodeId, Now};
use credit_sizing::{standing_rotation, standing_share, standing_total};

use super::ledger::Ledger;
use super::{FoldOwner, OwnerConfig, OwnerMode};

/// Rounds between two recalls of one key-window while its options stay unsettled (a
/// recall or its answer may be lost).
const RECALL_EVERY_ROUNDS: u64 = 4;

/// Options a low-water recall asks back (`FoldOwner::size_grant`): a key spread thin
/// far below its limit misses at most a request or two a window, and an option asked
/// back is one its holder no longer finds there. Two: one of them may already be spent.
pub(super) const LOW_WATER_RECALL: u32 = 2;

/// Key-windows waiting for their recall at the end of a step, at most.
pub(super) const RECALL_QUEUE_MAX: usize = 4_096;

impl OwnerConfig {
    /// The fleet's standing total of a key-window at `allowance`; 0 in fixed mode.
    pub(super) fn options_total(&self, allowance: u64) -> u64 {
        if self.mode != OwnerMode::Leasing {
            return 0;
        }
        standing_total(
            allowance,
            self.reserve_permille,
            self.fleet_size,
            self.standing_permille,
        )
    }

    /// Which node takes the first uneven unit of `kw`'s options, as the nodes compute it.
    pub(super) fn option_rotation(&self, kw: &KeyWindow) -> u32 {
        standing_rotation(kw.key.hash64(), kw.window.number, self.fleet_size)
    }

    /// Node `node`'s option at `allowance` and `rotation`, as the node computes it.
    pub(super) fn option_of(&self, allowance: u64, rotation: u32, node: NodeId) -> u64 {
        standing_share(
            self.options_total(allowance),
            self.fleet_size,
            node.0,
            rotation,
        )
    }
}

impl Ledger {
    /// The nodes whose option is settled, each once.
    fn settled_nodes(&self) -> smallvec::SmallVec<[NodeId; 8]> {
        let mut nodes: smallvec::SmallVec<[NodeId; 8]> = self
            .lines
            .0
            .iter()
            .filter(|(_, l)| l.standing_option)
            .map(|((n, _), _)| *n)
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// The options of the nodes that have not settled theirs: credit that may be out
    /// although no line shows it.
    pub(super) fn unsettled_options(&self, config: &OwnerConfig) -> u64 {
        let total = config.options_total(self.option_allowance);
        if total == 0 {
            return 0;
        }
        let settled: u64 = self
            .settled_nodes()
            .iter()
            .map(|n| config.option_of(self.option_allowance, self.option_rotation, *n))
            .sum();
        total.saturating_sub(settled)
    }
}

impl FoldOwner {
    /// Queue `kw` for a recall at the end of this step, if it has options unsettled and
    /// none was sent lately: of every unsettled option with `all` or when the key
    /// concentrates, else of `LOW_WATER_RECALL` of them.
    pub(super) fn want_recall(&mut self, now: Now, kw: KeyWindow, all: bool) {
        let every_ms = RECALL_EVERY_ROUNDS * self.round_ms();
        let config = &self.config;
        let Some(ledger) = self.ledgers.get_mut(&kw) else {
            return;
        };
        if ledger
            .recalled_at_ms
            .is_some_and(|t| now.wall_ms < t + every_ms)
            || self.recall_queue.len() >= RECALL_QUEUE_MAX
            || ledger.unsettled_options(config) == 0
        {
            return;
        }
        ledger.recalled_at_ms = Some(now.wall_ms);
        let nodes = if all || ledger.concentrated {
            u32::MAX
        } else {
            LOW_WATER_RECALL
        };
        self.recall_queue.push((kw, nodes));
    }

    /// Whether the window before `kw` (same key and length) had its options recalled.
    pub(super) fn recalled_last_window(&self, kw: &KeyWindow) -> bool {
        let previous = KeyWindow {
            key: kw.key,
            window: bus_schemas::WindowId {
                length_ms: kw.window.length_ms,
                number: kw.window.number.wrapping_sub(1),
            },
        };
        self.ledgers.get(&previous).is_some_and(|l| l.concentrated)
    }

    /// The queued recalls: a grant of nothing to each known node whose option of the
    /// key-window is unsettled, one batch per node.
    pub(super) fn send_recalls(&mut self, now: Now) {
        if self.recall_queue.is_empty() {
            return;
        }
        let queue = std::mem::take(&mut self.recall_queue);
        let mut per_node = super::lanes::PerNode::default();
        for (kw, mut left) in queue {
            // From the rotation on, so a partial recall asks back a different option
            // each window rather than always node 0's.
            let start = self.ledgers.get(&kw).map_or(0, |l| l.option_rotation);
            let fleet = self.config.fleet_size;
            for i in 0..fleet {
                if left == 0 {
                    break;
                }
                let node = NodeId((start + i) % fleet);
                let Some(epoch) = self.node_epoch(node) else {
                    continue;
                };
                if self.withheld(node, now) {
                    continue;
                }
                let config = &self.config;
                let Some(ledger) = self.ledgers.get_mut(&kw) else {
                    break;
                };
                let settled = ledger
                    .lines
                    .0
                    .iter()
                    .any(|((n, _), l)| *n == node && l.standing_option);
                let option =
                    config.option_of(ledger.option_allowance, ledger.option_rotation, node);
                if settled || option == 0 {
                    continue;
                }
                if !ledger.has_room_for_recall(config) {
                    break;
                }
                let (line, _) = ledger.lines.get_or_insert((node, epoch));
                per_node.add(node, line.issue(kw, epoch, 0, false));
                self.stats.recalls += 1;
                left -= 1;
            }
        }
        self.send_batches(per_node);
    }
}
