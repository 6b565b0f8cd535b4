//! P1 at the owner: the limit the policy in force gives each key's windows, so a ledger's
//! allowance is never larger than the policy says, whatever a node reports (a node on an
//! old or corrupted policy can only lower it, never raise it).
//!
//! Applied when a key-window's ledger is created only. Lowering a live ledger below
//! what it has already issued would break its invariant and halt the owner; the switch
//! takes effect from each key's next window, as on the nodes (`NodeLimiter::handle_policy`).

use bus_schemas::hashing::DetMap;
use bus_schemas::{KeyId, KeyWindow, PolicySnapshot, WindowSpec};

#[derive(Debug, Clone, Default)]
pub struct OwnerPolicy {
    pub version: u64,
    windows: DetMap<KeyId, Vec<WindowSpec>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerPolicyError {
    #[error("key assignment names plan {0}, which the snapshot does not define")]
    UnknownPlan(u32),
}

impl OwnerPolicy {
    /// Whole or not at all: one bad assignment refuses the snapshot (P1).
    pub fn from_snapshot(snapshot: &PolicySnapshot) -> Result<Self, OwnerPolicyError> {
        let plans: DetMap<u32, &[WindowSpec]> = snapshot
            .plans
            .iter()
            .map(|p| (p.id, p.windows.as_slice()))
            .collect();
        let mut windows = DetMap::default();
        for a in &snapshot.keys {
            let w = if a.override_windows.is_empty() {
                plans
                    .get(&a.plan_id)
                    .ok_or(OwnerPolicyError::UnknownPlan(a.plan_id))?
                    .to_vec()
            } else {
                a.override_windows.clone()
            };
            windows.insert(a.key, w);
        }
        Ok(Self {
            version: snapshot.version,
            windows,
        })
    }

    /// The limit for `kw`'s window kind, if the policy knows the key and that kind.
    pub fn limit(&self, kw: &KeyWindow) -> Option<u64> {
        self.windows
            .get(&kw.key)?
            .iter()
            .find(|w| w.length_ms == kw.window.length_ms)
            .map(|w| w.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schemas::{KeyAssignment, Plan, WindowId};

    fn key(digest: u128) -> KeyId {
        KeyId { version: 1, digest }
    }

    fn kw(d: u128, length_ms: u32) -> KeyWindow {
        KeyWindow {
            key: key(d),
            window: WindowId {
                length_ms,
                number: 7,
            },
        }
    }

    #[test]
    fn plans_overrides_and_unknown_plans() {
        let w = |length_ms, limit| WindowSpec { length_ms, limit };
        let mut snapshot = PolicySnapshot {
            version: 2,
            plans: vec![Plan {
                id: 1,
                name: "standard".into(),
                windows: vec![w(1_000, 10), w(60_000, 300)],
            }],
            keys: vec![
                KeyAssignment {
                    key: key(1),
                    plan_id: 1,
                    override_windows: Vec::new(),
                    carry_from: None,
                },
                KeyAssignment {
                    key: key(2),
                    plan_id: 1,
                    override_windows: vec![w(1_000, 50)],
                    carry_from: None,
                },
            ],
        };
        let p = OwnerPolicy::from_snapshot(&snapshot).unwrap();
        assert_eq!(p.limit(&kw(1, 1_000)), Some(10));
        assert_eq!(p.limit(&kw(1, 60_000)), Some(300));
        assert_eq!(p.limit(&kw(2, 1_000)), Some(50));
        // An override replaces the plan's windows: no 60 s window for key 2.
        assert_eq!(p.limit(&kw(2, 60_000)), None);
        assert_eq!(p.limit(&kw(3, 1_000)), None);
        snapshot.keys[0].plan_id = 9;
        assert_eq!(
            OwnerPolicy::from_snapshot(&snapshot).unwrap_err(),
            OwnerPolicyError::UnknownPlan(9)
        );
    }
}
