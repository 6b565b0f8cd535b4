//! `foldgate-node`'s settings: every knob with its unit in its name, checked and turned
//! into the limiter's, the surface's and the embedded policy's configuration.

use std::path::PathBuf;

use bus_schemas::{KeyAssignment, NodeId, Plan, PolicySnapshot, WindowSpec};
use serde::{Deserialize, Serialize};

use crate::http::auth::{KeyHasher, parse_key_id};
use crate::http::proxy::UpstreamSettings;
use crate::http::server::ServerSettings;
use crate::limiter::{Mode, NodeConfig};
use crate::policy::{PolicyError, PolicyIndex};
use crate::surface::SurfaceConfig;

/// Every knob of `foldgate-node`, with its unit in its name. `foldgate-node.example.toml`
/// documents each one, and a test keeps the two in step.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSettings {
    pub limiter_enabled: bool,
    pub node_id: u32,
    pub fleet_size: u32,
    pub shards: u32,
    pub round_ms: u32,
    pub mode: String,
    pub bucket_cap: usize,
    pub degraded_after_ms: u64,
    /// Standing options (leasing): per mille of each window's leasable allowance the
    /// fleet's nodes take unasked; 0 turns them off. Every node and fold worker of a
    /// fleet must use the same value (`foldgate-fold --standing-permille`).
    pub standing_permille: u64,
    pub backstop_multiple: u64,
    pub hash_key_version: u8,
    pub hash_key_file: Option<PathBuf>,
    pub hash_key_hex: Option<String>,
    /// ADR-7: hash keys of other versions, still live (a rotation under way).
    pub other_hash_keys: Vec<OtherHashKey>,
    pub nats_url: String,
    pub nats_ca_file: Option<PathBuf>,
    pub nats_cert_file: Option<PathBuf>,
    pub nats_key_file: Option<PathBuf>,
    pub log_format: String,
    pub log_level: String,
    pub server: ServerSettings,
    pub upstream: UpstreamSettings,
    pub policy: PolicySettings,
    /// Limit events (E1, E2): Kafka, the local archive, or none.
    pub events: crate::events::EventsSettings,
}

fn read_hash_key(path: &std::path::Path) -> Result<String, SettingsError> {
    std::fs::read_to_string(path).map_err(|e| SettingsError::HashKeyFile(path.to_path_buf(), e))
}

/// A hash key of another version (ADR-7), read from its own file.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OtherHashKey {
    pub version: u8,
    pub file: PathBuf,
}

impl Default for NodeSettings {
    fn default() -> Self {
        let reference = NodeConfig::reference(NodeId(0));
        let surface = SurfaceConfig::default();
        Self {
            limiter_enabled: true,
            node_id: 0,
            fleet_size: 1,
            shards: 1,
            round_ms: reference.round_ms,
            mode: "leasing".into(),
            bucket_cap: surface.bucket_cap,
            degraded_after_ms: reference.degraded_after_ms,
            standing_permille: reference.standing_permille,
            backstop_multiple: surface.backstop_multiple,
            hash_key_version: 1,
            hash_key_file: None,
            hash_key_hex: None,
            other_hash_keys: Vec::new(),
            nats_url: String::new(),
            nats_ca_file: None,
            nats_cert_file: None,
            nats_key_file: None,
            log_format: "json".into(),
            log_level: "info".into(),
            server: ServerSettings::default(),
            upstream: UpstreamSettings::default(),
            policy: PolicySettings::default(),
            events: crate::events::EventsSettings::default(),
        }
    }
}

/// The policy of an embedded (no NATS) node: plans and keys by hashed id, never raw keys.
/// On NATS the policy comes from the key-value bucket instead (P1), and this is ignored.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicySettings {
    pub version: u64,
    pub plans: Vec<PlanSettings>,
    pub keys: Vec<KeySettings>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSettings {
    pub id: u32,
    #[serde(default)]
    pub name: String,
    pub windows: Vec<WindowSettings>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSettings {
    pub length_ms: u32,
    pub limit: u64,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeySettings {
    /// `v1:` and 32 hex digits, as `foldgate key-id` prints it.
    pub key_id: String,
    pub plan: u32,
    /// Replaces the plan's windows for this key when present.
    #[serde(default)]
    pub windows: Vec<WindowSettings>,
    /// A hash-key rotation: this client's id under the previous hash key, charged too
    /// until it is removed (`bus_schemas::KeyAssignment::carry_from`).
    #[serde(default)]
    pub carry_from: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("`mode` must be \"leasing\" or \"fixed\", got {0:?}")]
    Mode(String),
    #[error("no hash key: set `hash_key_file` (a file holding 64+ hex digits) or `hash_key_hex`")]
    NoHashKey,
    #[error("`hash_key_file` {0}: {1}")]
    HashKeyFile(PathBuf, std::io::Error),
    #[error("hash key: {0}")]
    HashKey(#[from] crate::http::auth::HashKeyError),
    #[error("hash key version {0} is given twice (`hash_key_version`, `other_hash_keys`)")]
    HashKeyVersionTwice(u8),
    #[error("`policy.keys[{0}].key_id` is not a key id (v<version>:<32 hex>)")]
    KeyId(usize),
    #[error("policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("upstream: {0}")]
    Upstream(#[from] crate::http::proxy::UpstreamError),
    #[error(
        "`fleet_size`, `shards` and `bucket_cap` must be at least 1, `round_ms` 1 to 1000, and `node_id` below `fleet_size`"
    )]
    Fleet,
    #[error("policy: {0} (the checks a policy snapshot from the bus gets)")]
    PolicyWire(#[from] bus_schemas::DecodeError),
    #[error(
        "`policy.version` must be at least 1 when the policy names plans or keys (0 is \"no policy yet\")"
    )]
    PolicyVersion,
}

/// The longest round a node may be configured with: C1's round is 25 ms, and the fast
/// path's once-a-round budget (D5) and every bound counted in rounds assume a short one.
const MAX_ROUND_MS: u32 = 1_000;

impl NodeSettings {
    pub fn hasher(&self) -> Result<KeyHasher, SettingsError> {
        let hex = match (&self.hash_key_hex, &self.hash_key_file) {
            (Some(h), _) => h.clone(),
            (None, Some(p)) => read_hash_key(p)?,
            (None, None) => return Err(SettingsError::NoHashKey),
        };
        Ok(KeyHasher::from_hex(self.hash_key_version, &hex)?)
    }

    /// Every live hash key, this node's own version first, then `other_hash_keys` in order
    /// (ADR-7, `NodeGateway::resolve`).
    pub fn hashers(&self) -> Result<Vec<KeyHasher>, SettingsError> {
        let mut all = vec![self.hasher()?];
        let mut versions = vec![self.hash_key_version];
        for other in &self.other_hash_keys {
            if versions.contains(&other.version) {
                return Err(SettingsError::HashKeyVersionTwice(other.version));
            }
            versions.push(other.version);
            all.push(KeyHasher::from_hex(
                other.version,
                &read_hash_key(&other.file)?,
            )?);
        }
        Ok(all)
    }

    pub fn node_config(&self) -> Result<NodeConfig, SettingsError> {
        let mode = match self.mode.as_str() {
            "leasing" => Mode::Leasing,
            "fixed" => Mode::Fixed,
            other => return Err(SettingsError::Mode(other.into())),
        };
        if self.fleet_size == 0
            || self.shards == 0
            || self.bucket_cap == 0
            || !(1..=MAX_ROUND_MS).contains(&self.round_ms)
            || self.node_id >= self.fleet_size
        {
            return Err(SettingsError::Fleet);
        }
        Ok(NodeConfig {
            fleet_size: self.fleet_size,
            shards: self.shards,
            round_ms: self.round_ms,
            mode,
            degraded_after_ms: self.degraded_after_ms,
            standing_permille: self.standing_permille.min(1_000),
            ..NodeConfig::reference(NodeId(self.node_id))
        })
    }

    pub fn surface_config(&self) -> SurfaceConfig {
        let defaults = SurfaceConfig::default();
        SurfaceConfig {
            bucket_cap: self.bucket_cap,
            round_ms: self.round_ms,
            backstop_multiple: self.backstop_multiple,
            // A reconciler is stalled when it misses rounds, not when a long round is
            // simply not over yet: at a second's round the default bound failed the
            // node open for part of every round.
            reconciler_stall_ms: defaults
                .reconciler_stall_ms
                .max(4 * u64::from(self.round_ms)),
            ..defaults
        }
    }
}

impl PolicySettings {
    /// Each listed key's plan id, for the limit events of an embedded node (on NATS the
    /// policy comes from the bucket, and events name plan 0).
    pub fn plan_ids(&self) -> std::collections::HashMap<bus_schemas::KeyId, u32> {
        self.keys
            .iter()
            .filter_map(|k| parse_key_id(&k.key_id).map(|id| (id, k.plan)))
            .collect()
    }

    pub fn index(&self, round_ms: u32) -> Result<PolicyIndex, SettingsError> {
        let windows = |ws: &[WindowSettings]| -> Vec<WindowSpec> {
            ws.iter()
                .map(|w| WindowSpec {
                    length_ms: w.length_ms,
                    limit: w.limit,
                })
                .collect()
        };
        let keys = self
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let carry_from = match &k.carry_from {
                    Some(text) => Some(parse_key_id(text).ok_or(SettingsError::KeyId(i))?),
                    None => None,
                };
                Ok(KeyAssignment {
                    key: parse_key_id(&k.key_id).ok_or(SettingsError::KeyId(i))?,
                    plan_id: k.plan,
                    override_windows: windows(&k.windows),
                    carry_from,
                })
            })
            .collect::<Result<Vec<_>, SettingsError>>()?;
        if self.version == 0 && !(self.plans.is_empty() && self.keys.is_empty()) {
            // The runtime refuses a policy no newer than the one in force (none: 0), so
            // this one would be dropped without a word and every key get a 401.
            return Err(SettingsError::PolicyVersion);
        }
        let snapshot = PolicySnapshot {
            version: self.version,
            plans: self
                .plans
                .iter()
                .map(|p| Plan {
                    id: p.id,
                    name: p.name.clone(),
                    windows: windows(&p.windows),
                })
                .collect(),
            keys,
        };
        // Through the wire codec: a file's policy gets every check one from the bus does
        // (limits within the 40-bit credit word, windows of at most a day), which the
        // state machines' arithmetic relies on.
        let snapshot = <PolicySnapshot as bus_schemas::Envelope>::decode(
            &bus_schemas::Envelope::encode(&snapshot),
        )?;
        Ok(PolicyIndex::from_snapshot(&snapshot, round_ms)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ADR-7: each live version once; two keys claiming one version would hash a key two
    /// ways under one name.
    #[test]
    fn two_hash_keys_of_one_version_are_refused() {
        let file = std::env::temp_dir().join(format!("foldgate-hk-{}.hex", std::process::id()));
        std::fs::write(&file, "2e".repeat(32)).unwrap();
        let settings = |version| NodeSettings {
            hash_key_hex: Some("1f".repeat(32)),
            other_hash_keys: vec![OtherHashKey {
                version,
                file: file.clone(),
            }],
            ..NodeSettings::default()
        };
        assert_eq!(settings(2).hashers().unwrap().len(), 2);
        assert!(matches!(
            settings(1).hashers(),
            Err(SettingsError::HashKeyVersionTwice(1))
        ));
        std::fs::remove_file(&file).ok();
    }

    /// Every knob is in the example file, which parses to the defaults.
    fn documented<T: Serialize + serde::de::DeserializeOwned>(example: &str, default: &T) {
        let parsed: T = toml::from_str(example).expect("example parses");
        assert_eq!(
            toml::to_string(&parsed).unwrap(),
            toml::to_string(default).unwrap(),
            "the example's values are the defaults"
        );
        let table = toml::Table::try_from(default).unwrap();
        let nested = table
            .values()
            .filter_map(|v| v.as_table())
            .flat_map(|t| t.keys());
        for key in table.keys().chain(nested) {
            assert!(
                example.contains(&format!("\n{key} ="))
                    || example.contains(&format!("# {key} ="))
                    || example.contains(&format!("[{key}]")),
                "`{key}` is not documented in the example"
            );
        }
        for key in [
            "hash_key_file",
            "hash_key_hex",
            "nats_ca_file",
            "nats_cert_file",
            "nats_key_file",
        ] {
            if example.contains("nats_url") {
                assert!(example.contains(&format!("# {key} =")), "`{key}`");
            }
        }
    }

    #[test]
    fn every_knob_is_documented_in_the_examples() {
        documented(
            include_str!("../../../foldgate-node.example.toml"),
            &NodeSettings::default(),
        );
        documented(
            include_str!("../../../foldgate-edge.example.toml"),
            &crate::http::edge::EdgeSettings::default(),
        );
    }

    #[test]
    fn policy_settings_become_an_index() {
        let s: NodeSettings = toml::from_str(
            r#"
            [policy]
            version = 3
            [[policy.plans]]
            id = 1
            windows = [{ length_ms = 1000, limit = 10 }, { length_ms = 60000, limit = 300 }]
            [[policy.keys]]
            key_id = "v1:000000000000000000000000000000ff"
            plan = 1
            [[policy.keys]]
            key_id = "v1:000000000000000000000000000000fe"
            plan = 1
            windows = [{ length_ms = 1000, limit = 50 }]
            "#,
        )
        .unwrap();
        let idx = s.policy.index(25).unwrap();
        assert_eq!(idx.version, 3);
        let k = parse_key_id("v1:000000000000000000000000000000fe").unwrap();
        assert_eq!(idx.get(&k).unwrap().windows().len(), 1);
        let mut bad = s.clone();
        bad.policy.keys[0].key_id = "fgk_raw_key".into();
        assert!(matches!(bad.policy.index(25), Err(SettingsError::KeyId(0))));
        bad = s.clone();
        bad.policy.keys[0].plan = 9;
        assert!(matches!(
            bad.policy.index(25),
            Err(SettingsError::Policy(_) | SettingsError::PolicyWire(_))
        ));
        // A file's policy gets the bus's checks: a limit past the 40-bit credit word.
        bad = s.clone();
        bad.policy.plans[0].windows[0].limit = 1 << 41;
        assert!(matches!(
            bad.policy.index(25),
            Err(SettingsError::PolicyWire(_))
        ));
        // Version 0 is "no policy yet": such a policy was dropped without a word.
        bad = s.clone();
        bad.policy.version = 0;
        assert!(matches!(
            bad.policy.index(25),
            Err(SettingsError::PolicyVersion)
        ));
        for broken in [
            NodeSettings {
                bucket_cap: 0,
                ..s.clone()
            },
            NodeSettings {
                round_ms: 2_000,
                ..s.clone()
            },
        ] {
            assert!(matches!(broken.node_config(), Err(SettingsError::Fleet)));
        }
        let slow = NodeSettings {
            round_ms: 1_000,
            ..s.clone()
        };
        assert!(slow.surface_config().reconciler_stall_ms >= 4_000);
        bad = s;
        bad.mode = "fast".into();
        assert!(matches!(bad.node_config(), Err(SettingsError::Mode(_))));
    }
}
