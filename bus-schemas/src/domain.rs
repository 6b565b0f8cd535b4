//! Validated domain types. Everything outside this crate speaks these types; only
//! `wire` knows the bytes. A value of one of these types has passed every check in
//! `TryFrom<wire::*>`, so the state machines never re-validate what they receive.

use std::fmt;

/// The envelope schema version this release writes.
pub const SCHEMA_VERSION: u32 = 1;
/// The oldest envelope schema version this release still reads (B2: one release older).
/// Version 0 is proto3's "field absent" and is never accepted.
pub const MIN_ACCEPTED_SCHEMA_VERSION: u32 = 1;

/// Hard limits on every envelope (TIGER_STYLE: a limit on everything).
pub mod limits {
    /// Key-window entries in one report batch (one node, one shard, one round).
    pub const REPORT_ENTRIES_MAX: usize = 16_384;
    /// Batches one full report of a shard may span (`FullReportChunk`): with
    /// `REPORT_ENTRIES_MAX` lines each, over a million lines, past any node's records
    /// cap; and the owner gathers the chunks of one in a 64-bit mask.
    pub const FULL_REPORT_CHUNKS_MAX: u32 = 64;
    /// Grant entries in one grant batch.
    pub const GRANT_ENTRIES_MAX: usize = 16_384;
    /// Windows in one plan; the decision surface has this many slots per key.
    pub const PLAN_WINDOWS_MAX: usize = 4;
    /// Plans in one policy snapshot.
    pub const POLICY_PLANS_MAX: usize = 4_096;
    /// Per-key assignments and overrides in one policy snapshot (4x the reference 10^5 keys).
    pub const POLICY_KEYS_MAX: usize = 400_000;
    /// Bytes of a correlation id (an `X-Request-Id` is at most this long).
    pub const CORRELATION_ID_BYTES_MAX: usize = 64;
    /// Bytes of a plan name.
    pub const PLAN_NAME_BYTES_MAX: usize = 64;
    /// Encoded bytes per envelope kind. A report entry encodes to < 80 bytes.
    pub const REPORT_BATCH_BYTES_MAX: usize = 2 * 1024 * 1024;
    pub const GRANT_BATCH_BYTES_MAX: usize = 2 * 1024 * 1024;
    pub const FAST_PATH_BYTES_MAX: usize = 1024;
    pub const LIMIT_EVENT_BYTES_MAX: usize = 1024;
    pub const POLICY_SNAPSHOT_BYTES_MAX: usize = 64 * 1024 * 1024;
    /// Longest window a plan may declare (1 day); keeps window arithmetic far from overflow.
    pub const WINDOW_LENGTH_MS_MAX: u32 = 86_400_000;
    /// Longest wait a 429 may name: to the end of the window after a 1-day one (a phase
    /// offset is under one length), so a `Retry-After` past it is a corrupt event.
    pub const RETRY_AFTER_MS_MAX: u64 = 2 * WINDOW_LENGTH_MS_MAX as u64;
    /// Largest allowance per window; credit words hold 40 bits.
    pub const WINDOW_LIMIT_MAX: u64 = (1 << 40) - 1;
    /// Latest window end a message may name, in ms since the epoch (2^53, some 285,000
    /// years): a window's start, end and phase offset stay far from overflow.
    pub const WINDOW_END_MS_MAX: u64 = 1 << 53;
    /// Largest demand a report line or fast path may advertise, in thousandths of a
    /// request a round (about 10^9 requests a round): sizing multiplies it by a lead of a
    /// few rounds and a headroom in thousandths, and stays within 64 bits.
    pub const DEMAND_MILLI_MAX: u64 = WINDOW_LIMIT_MAX;
}

/// The hashed identity of an API key (D2): `version` names the HMAC key that produced
/// `digest`, so rotation adds a version instead of orphaning history (ADR-7). The raw
/// key never reaches this type.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId {
    pub version: u8,
    pub digest: u128,
}

impl KeyId {
    pub const WIRE_BYTES: usize = 17;

    pub fn to_bytes(self) -> [u8; Self::WIRE_BYTES] {
        let mut out = [0u8; Self::WIRE_BYTES];
        out[0] = self.version;
        out[1..].copy_from_slice(&self.digest.to_be_bytes());
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != Self::WIRE_BYTES || bytes[0] == 0 {
            return None;
        }
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&bytes[1..]);
        Some(Self {
            version: bytes[0],
            digest: u128::from_be_bytes(digest),
        })
    }

    /// `v<version>:<32 hex>`: how a key id is written in logs, policy files, bodies and
    /// the archive. Safe to show: it is the hashed id, never the raw key.
    pub fn text(self) -> String {
        format!("v{}:{:032x}", self.version, self.digest)
    }

    /// The id [`KeyId::text`] wrote, or `None`.
    pub fn from_text(text: &str) -> Option<Self> {
        let (version, hex) = text.strip_prefix('v')?.split_once(':')?;
        let version: u8 = version.parse().ok()?;
        if version == 0 || hex.len() != 32 {
            return None;
        }
        Some(Self {
            version,
            digest: u128::from_str_radix(hex, 16).ok()?,
        })
    }

    /// 64 well-mixed bits: the digest is already an HMAC output.
    pub fn hash64(self) -> u64 {
        (self.digest as u64) ^ ((self.digest >> 64) as u64)
    }

    /// Per-key window phase offset, identical on every node (D3, A45).
    pub fn phase_offset_ms(self, length_ms: u32) -> u64 {
        self.hash64() % u64::from(length_ms)
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Safe to log: it is the hashed id, never the raw key.
impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "k{}:{:032x}", self.version, self.digest)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// A node's incarnation: a restarted node takes a new, larger epoch with zero credit (C9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeEpoch(pub u64);

/// The fencing token of a shard's fold owner (C2). Larger is newer; 0 means "none seen".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct OwnerEpoch(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub u32);

/// One fixed window instance: its length names its kind, `number` counts windows since
/// the Unix epoch after the key's phase offset (D3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowId {
    pub length_ms: u32,
    pub number: u64,
}

/// The unit of accounting: one key in one window instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyWindow {
    pub key: KeyId,
    pub window: WindowId,
}

impl KeyWindow {
    /// C2: hash(key_id, window_id) mod shards. Every node and owner computes the same.
    pub fn shard(&self, shards: u32) -> ShardId {
        assert!(shards > 0, "shard count must be positive");
        let mut h = self.key.hash64() ^ 0x9e37_79b9_7f4a_7c15;
        h ^= u64::from(self.window.length_ms).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= self.window.number.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        ShardId((h % u64::from(shards)) as u32)
    }
}

/// One key-window line of a report (C1). All counts are cumulative within the node
/// epoch and the window (ADR-2), so duplicates and reorders are harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportEntry {
    pub key_window: KeyWindow,
    /// The window allowance this node's policy gives the key.
    pub allowance: u64,
    /// Requests admitted in this key-window by this node epoch.
    pub cumulative_spend: u64,
    /// The demand signal (C4): this node's smoothed rate of requests seen for the key
    /// (admitted or denied), in thousandths of a request per round (1000 = one per round).
    /// Smoothed across window boundaries so that the owner of the next window, which has
    /// no history of its own, can size a grant before the first request arrives.
    pub demand: u64,
    /// Unspent credit the node holds now.
    pub held_credit: u64,
    /// Largest owner grant total applied (C6).
    pub applied_grant: u64,
    /// Credit handed back to the pool (rebalancing away from idle nodes, C4).
    pub returned: u64,
    /// Credit the node gave itself without the owner (F4 self-grant or A-fixed share).
    /// Non-zero is the `self_grant` flag of C1.
    pub self_granted: u64,
    /// This node epoch holds the node's standing option for the key-window (it ran
    /// when the window began): `self_granted` then includes everything the node took
    /// unasked there, which is at most its standing share (`credit_sizing::
    /// standing_share`) plus any F4 self-grant. A node epoch that began mid-window
    /// takes no standing credit, and its line leaves the option to the earlier epoch.
    pub standing_option: bool,
}

impl ReportEntry {
    /// The flag of C1 and F4.
    pub fn self_grant(&self) -> bool {
        self.self_granted > 0
    }
}

/// One message per node per shard per round (C1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportBatch {
    pub node: NodeId,
    pub node_epoch: NodeEpoch,
    /// Monotonic per node epoch: max-sequence-wins (C3).
    pub seq: u64,
    pub shard: ShardId,
    /// Sender's wall clock at send time, for fold-age metrics only.
    pub sent_at_ms: u64,
    /// Highest owner epoch this node accepts for the shard. It acknowledges that epoch
    /// (the takeover fence, C8) only in a full report.
    pub owner_epoch_seen: OwnerEpoch,
    pub entries: Vec<ReportEntry>,
    /// Set when this batch is part of a full report of the shard.
    pub full_report: Option<FullReportChunk>,
}

/// One of the `count` batches, all with the same `seq`, that together report every line
/// a node epoch holds for a shard. A new owner takes a node's acknowledgement of its epoch
/// only from a full report it has every chunk of: a partial report leaves out lines that
/// had not changed, whose credit the owner would otherwise count as still in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FullReportChunk {
    /// `0..count`.
    pub index: u32,
    /// `1..=FULL_REPORT_CHUNKS_MAX`.
    pub count: u32,
}

/// Credit for one node epoch in one key-window. `credit_total` is cumulative over the
/// window, so applying a grant is `applied = max(applied, credit_total)`: idempotent, and
/// a grant only ever increases credit (C6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantEntry {
    pub key_window: KeyWindow,
    pub node_epoch: NodeEpoch,
    /// Monotonic per (key-window, node epoch) within an owner epoch.
    pub grant_seq: u64,
    pub credit_total: u64,
    /// The owner has no unallocated allowance left for this key-window (D6 uses it).
    pub exhausted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantBatch {
    pub owner_epoch: OwnerEpoch,
    pub shard: ShardId,
    pub node: NodeId,
    pub entries: Vec<GrantEntry>,
    /// The node epoch whose full report this owner epoch has taken as its acknowledgement
    /// (C8): that node epoch may stop re-sending full reports to it.
    pub full_report_taken: Option<NodeEpoch>,
}

/// D5: a node short of credit asks the key-window's owner, once per round, 1 ms deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPathRequest {
    pub node: NodeId,
    pub node_epoch: NodeEpoch,
    pub shard: ShardId,
    pub request_id: u64,
    pub owner_epoch_seen: OwnerEpoch,
    /// The node's report line for the key-window at request time.
    pub entry: ReportEntry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastPathOutcome {
    Granted(GrantEntry),
    /// The key-window is exhausted, or the reserve was already released this window (C5).
    Refused {
        exhausted: bool,
    },
    /// The owner is rebuilding its ledger or withholding this node (C8, F4).
    Withheld,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPathReply {
    pub owner_epoch: OwnerEpoch,
    pub shard: ShardId,
    pub request_id: u64,
    pub outcome: FastPathOutcome,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitReason {
    /// Every window that could deny had no credit (a real 429).
    Exhausted,
    /// The fast path missed its 1 ms deadline (a real 429, D5).
    FastPathDeadline,
    /// A fail-open request hit the per-key backstop floor (D8).
    Backstop,
}

/// A limit event's identity, unique across restarts without a durable counter: a
/// restarted node is a new, larger epoch (C9) and counts its events from 1 again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId {
    pub node: NodeId,
    pub node_epoch: NodeEpoch,
    /// `1..`: the node epoch's n-th event.
    pub seq: u64,
}

/// Printed as `n<node>-e<epoch>-s<seq>`, the form the archive stores and sorts.
impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}-e{}-s{}", self.node.0, self.node_epoch.0, self.seq)
    }
}

/// E1: one per 429. Never the raw key: `key` is the hashed id with its hash version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitEvent {
    pub id: EventId,
    pub key: KeyId,
    /// The key's plan (P1); 0 when the node cannot name it.
    pub plan_id: u32,
    /// The window the 429's body named (D6): its length and number.
    pub window: WindowId,
    /// The deciding node's wall clock, in ms since the Unix epoch.
    pub at_ms: u64,
    /// Bytes of `X-Request-Id`, at most `CORRELATION_ID_BYTES_MAX`.
    pub correlation_id: String,
    pub reason: LimitReason,
    /// Enforcement was degraded (F5) when the node decided.
    pub degraded: bool,
    /// The wait the client was given (D6, ADR-6): `Retry-After` in whole seconds, or
    /// `X-RateLimit-Reset-Ms` below a second, both from this.
    pub retry_after_ms: u64,
}

impl LimitEvent {
    /// The node that decided.
    pub fn node(&self) -> NodeId {
        self.id.node
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub length_ms: u32,
    pub limit: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub id: u32,
    pub name: String,
    pub windows: Vec<WindowSpec>,
}

/// Which plan a key is on, and optionally its own windows instead of the plan's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyAssignment {
    pub key: KeyId,
    pub plan_id: u32,
    /// Empty: the plan's windows apply. Non-empty: these replace them.
    pub override_windows: Vec<WindowSpec>,
    /// A hash-key rotation (ADR-7, P3): the same client's id under the previous hash
    /// key. While it is set, a request for `key` is charged under both ids and admitted
    /// only if both admit, so what the old id already spent in its open windows still
    /// counts, and the switch cannot give a key its allowance twice. The operator drops
    /// it once the longest window has passed since the switch.
    pub carry_from: Option<KeyId>,
}

/// P1: the whole policy, switched atomically by `version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySnapshot {
    pub version: u64,
    pub plans: Vec<Plan>,
    pub keys: Vec<KeyAssignment>,
}

/// The two clocks a state machine is handed (it never reads one itself). Wall time names
/// windows (D3, ADR-5); monotonic time measures rounds, deadlines and fold age.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Now {
    pub wall_ms: u64,
    pub mono_ms: u64,
}
