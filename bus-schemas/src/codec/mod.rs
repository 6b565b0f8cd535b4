//! Envelope encoding and validating decoding (B2). Decoding checks, in order: the byte
//! length against the kind's limit (before parsing anything), the protobuf framing, the
//! schema version (an unknown one rejects the envelope whole), then every field into the
//! domain types. A value that comes out is fully valid; nothing partial ever comes out.

use crate::canonical::{self, RawGrantEntry};
use crate::hashing::DetSet;

use prost::Message;

use crate::domain::limits::*;
use crate::domain::*;
use crate::wire;

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("{kind}: {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        kind: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{kind}: malformed protobuf: {source}")]
    Malformed {
        kind: &'static str,
        source: prost::DecodeError,
    },
    #[error(
        "{kind}: schema version {got} is not accepted (accepted {MIN_ACCEPTED_SCHEMA_VERSION}..={SCHEMA_VERSION})"
    )]
    UnknownSchemaVersion { kind: &'static str, got: u64 },
    #[error("{kind}: required field {field} is missing")]
    Missing {
        kind: &'static str,
        field: &'static str,
    },
    #[error("{kind}: field {field} is invalid: {reason}")]
    Invalid {
        kind: &'static str,
        field: &'static str,
        reason: &'static str,
    },
    #[error("{kind}: {got} {field} exceeds the limit of {max}")]
    TooMany {
        kind: &'static str,
        field: &'static str,
        got: usize,
        max: usize,
    },
}

impl DecodeError {
    /// A short label for the `rejected envelopes by reason` metric (F6).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::Malformed { .. } => "malformed",
            Self::UnknownSchemaVersion { .. } => "unknown_version",
            Self::Missing { .. } => "missing",
            Self::Invalid { .. } => "invalid",
            Self::TooMany { .. } => "too_many",
        }
    }
}

/// A bus envelope: the only way bytes become domain values and back.
pub trait Envelope: Sized {
    const KIND: &'static str;
    const MAX_BYTES: usize;
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError>;
}

fn parse<M: Message + Default>(
    kind: &'static str,
    max: usize,
    bytes: &[u8],
) -> Result<M, DecodeError> {
    if bytes.len() > max {
        return Err(DecodeError::TooLarge {
            kind,
            len: bytes.len(),
            max,
        });
    }
    let m = M::decode(bytes).map_err(|source| DecodeError::Malformed { kind, source })?;
    // prost keeps a too-large version's low 32 bits; the version as sent decides (B2).
    if let Some(got) = canonical::raw_schema_version_max(bytes)
        && got > u64::from(u32::MAX)
    {
        return Err(DecodeError::UnknownSchemaVersion { kind, got });
    }
    Ok(m)
}

fn version(kind: &'static str, got: u32) -> Result<(), DecodeError> {
    if (MIN_ACCEPTED_SCHEMA_VERSION..=SCHEMA_VERSION).contains(&got) {
        Ok(())
    } else {
        Err(DecodeError::UnknownSchemaVersion {
            kind,
            got: u64::from(got),
        })
    }
}

fn count(
    kind: &'static str,
    field: &'static str,
    got: usize,
    max: usize,
) -> Result<(), DecodeError> {
    if got > max {
        Err(DecodeError::TooMany {
            kind,
            field,
            got,
            max,
        })
    } else {
        Ok(())
    }
}

fn invalid(kind: &'static str, field: &'static str, reason: &'static str) -> DecodeError {
    DecodeError::Invalid {
        kind,
        field,
        reason,
    }
}

fn key_id(kind: &'static str, bytes: &[u8]) -> Result<KeyId, DecodeError> {
    KeyId::from_bytes(bytes)
        .ok_or_else(|| invalid(kind, "key_id", "must be 17 bytes with a non-zero version"))
}

fn window(kind: &'static str, w: Option<&wire::WindowId>) -> Result<WindowId, DecodeError> {
    window_of(kind, w.map(|w| (w.length_ms, w.number)))
}

/// A window's (length_ms, number) as read off the wire.
fn window_of(kind: &'static str, w: Option<(u32, u64)>) -> Result<WindowId, DecodeError> {
    let (length_ms, number) = w.ok_or(DecodeError::Missing {
        kind,
        field: "window",
    })?;
    if length_ms == 0 || length_ms > WINDOW_LENGTH_MS_MAX {
        return Err(invalid(kind, "window.length_ms", "must be 1 ms to 1 day"));
    }
    // The window after it ends by then too (a phase offset is under one length).
    let ends_in_range = number
        .checked_add(2)
        .and_then(|n| n.checked_mul(u64::from(length_ms)))
        .is_some_and(|end_ms| end_ms <= WINDOW_END_MS_MAX);
    if !ends_in_range {
        return Err(invalid(kind, "window.number", "ends after 2^53 ms"));
    }
    Ok(WindowId { length_ms, number })
}

/// A key-window's fields as read off the wire, before validation: what the prost types
/// and the canonical reader (`canonical`) both give, so both feed one validation.
#[derive(Clone, Copy)]
pub(crate) struct RawKeyWindow<'a> {
    pub key_id: &'a [u8],
    pub window: Option<(u32, u64)>,
}

impl<'a> RawKeyWindow<'a> {
    fn of(kw: &'a wire::KeyWindow) -> Self {
        Self {
            key_id: &kw.key_id,
            window: kw.window.map(|w| (w.length_ms, w.number)),
        }
    }
}

fn key_window(kind: &'static str, kw: Option<RawKeyWindow<'_>>) -> Result<KeyWindow, DecodeError> {
    let kw = kw.ok_or(DecodeError::Missing {
        kind,
        field: "key_window",
    })?;
    Ok(KeyWindow {
        key: key_id(kind, kw.key_id)?,
        window: window_of(kind, kw.window)?,
    })
}

fn epoch(kind: &'static str, field: &'static str, v: u64) -> Result<u64, DecodeError> {
    if v == 0 {
        Err(invalid(kind, field, "epoch 0 means none"))
    } else {
        Ok(v)
    }
}

fn wire_window(w: WindowId) -> wire::WindowId {
    wire::WindowId {
        length_ms: w.length_ms,
        number: w.number,
    }
}

fn wire_key_window(kw: KeyWindow) -> wire::KeyWindow {
    wire::KeyWindow {
        key_id: kw.key.to_bytes().to_vec(),
        window: Some(wire_window(kw.window)),
    }
}

/// A report line's fields as read off the wire, before validation (see `RawKeyWindow`).
#[derive(Clone, Copy, Default)]
pub(crate) struct RawReportEntry<'a> {
    pub key_window: Option<RawKeyWindow<'a>>,
    pub allowance: u64,
    pub cumulative_spend: u64,
    pub demand: u64,
    pub held_credit: u64,
    pub applied_grant: u64,
    pub returned: u64,
    pub self_granted: u64,
    pub standing_option: bool,
}

impl<'a> RawReportEntry<'a> {
    fn of(e: &'a wire::ReportEntry) -> Self {
        Self {
            key_window: e.key_window.as_ref().map(RawKeyWindow::of),
            allowance: e.allowance,
            cumulative_spend: e.cumulative_spend,
            demand: e.demand,
            held_credit: e.held_credit,
            applied_grant: e.applied_grant,
            returned: e.returned,
            self_granted: e.self_granted,
            standing_option: e.standing_option,
        }
    }
}

fn report_entry(kind: &'static str, e: &RawReportEntry<'_>) -> Result<ReportEntry, DecodeError> {
    let out = ReportEntry {
        key_window: key_window(kind, e.key_window)?,
        allowance: e.allowance,
        cumulative_spend: e.cumulative_spend,
        demand: e.demand,
        held_credit: e.held_credit,
        applied_grant: e.applied_grant,
        returned: e.returned,
        self_granted: e.self_granted,
        standing_option: e.standing_option,
    };
    if out.allowance > WINDOW_LIMIT_MAX
        || out.applied_grant > WINDOW_LIMIT_MAX * 2
        || out.self_granted > WINDOW_LIMIT_MAX
        || out.demand > DEMAND_MILLI_MAX
    {
        return Err(invalid(
            kind,
            "entry",
            "count above the 40-bit credit range",
        ));
    }
    // A node can only spend, hold or return credit it received.
    let received = out.applied_grant + out.self_granted;
    if out
        .cumulative_spend
        .saturating_add(out.held_credit)
        .saturating_add(out.returned)
        > received
    {
        return Err(invalid(
            kind,
            "entry",
            "spend + held + returned exceeds credit received",
        ));
    }
    Ok(out)
}

fn wire_report_entry(e: &ReportEntry) -> wire::ReportEntry {
    wire::ReportEntry {
        key_window: Some(wire_key_window(e.key_window)),
        allowance: e.allowance,
        cumulative_spend: e.cumulative_spend,
        demand: e.demand,
        held_credit: e.held_credit,
        applied_grant: e.applied_grant,
        returned: e.returned,
        self_granted: e.self_granted,
        standing_option: e.standing_option,
    }
}

fn wire_grant(e: &wire::GrantEntry) -> RawGrantEntry<'_> {
    RawGrantEntry {
        key_window: e.key_window.as_ref().map(RawKeyWindow::of),
        node_epoch: e.node_epoch,
        grant_seq: e.grant_seq,
        credit_total: e.credit_total,
        exhausted: e.exhausted,
    }
}

fn grant_entry(kind: &'static str, e: &RawGrantEntry<'_>) -> Result<GrantEntry, DecodeError> {
    if e.credit_total > WINDOW_LIMIT_MAX * 2 {
        return Err(invalid(kind, "credit_total", "above the credit range"));
    }
    Ok(GrantEntry {
        key_window: key_window(kind, e.key_window)?,
        node_epoch: NodeEpoch(epoch(kind, "node_epoch", e.node_epoch)?),
        grant_seq: e.grant_seq,
        credit_total: e.credit_total,
        exhausted: e.exhausted,
    })
}

fn wire_grant_entry(e: &GrantEntry) -> wire::GrantEntry {
    wire::GrantEntry {
        key_window: Some(wire_key_window(e.key_window)),
        node_epoch: e.node_epoch.0,
        grant_seq: e.grant_seq,
        credit_total: e.credit_total,
        exhausted: e.exhausted,
    }
}

impl Envelope for ReportBatch {
    const KIND: &'static str = "report_batch";
    const MAX_BYTES: usize = REPORT_BATCH_BYTES_MAX;

    fn encode(&self) -> Vec<u8> {
        // The bytes prost writes for the `wire` message (`canonical`).
        let header = [
            (1, u64::from(SCHEMA_VERSION)),
            (2, u64::from(self.node.0)),
            (3, self.node_epoch.0),
            (4, self.seq),
            (5, u64::from(self.shard.0)),
            (6, self.sent_at_ms),
            (7, self.owner_epoch_seen.0),
        ];
        let full = self.full_report.map_or((0, 0), |c| (c.count, c.index));
        let trailer = [(9, u64::from(full.0)), (10, u64::from(full.1))];
        let len = canonical::header_len(&header)
            + self
                .entries
                .iter()
                .map(|e| canonical::report_entry_len(8, e))
                .sum::<usize>()
            + canonical::header_len(&trailer);
        let mut out = Vec::with_capacity(len);
        canonical::put_header(&mut out, &header);
        for e in &self.entries {
            canonical::put_report_entry(&mut out, 8, e);
        }
        canonical::put_header(&mut out, &trailer);
        debug_assert_eq!(out.len(), len);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() <= Self::MAX_BYTES
            && let Some(raw) = canonical::report_batch(bytes)
        {
            let [
                _,
                version_got,
                node,
                node_epoch,
                seq,
                shard,
                sent_at_ms,
                owner_epoch_seen,
                _,
                full_chunks,
                full_index,
            ] = raw.scalars;
            return report_batch_of(
                [version_got, node, shard, full_chunks, full_index].map(|v| v as u32),
                [node_epoch, seq, sent_at_ms, owner_epoch_seen],
                &raw.entries,
            );
        }
        report_batch_via_prost(bytes)
    }
}

/// Every input the canonical reader declines: prost's reading, which tolerates unknown
/// fields, repeats and any field order.
fn report_batch_via_prost(bytes: &[u8]) -> Result<ReportBatch, DecodeError> {
    let m: wire::ReportBatch = parse(ReportBatch::KIND, ReportBatch::MAX_BYTES, bytes)?;
    let entries: Vec<RawReportEntry<'_>> = m.entries.iter().map(RawReportEntry::of).collect();
    report_batch_of(
        [
            m.schema_version,
            m.node,
            m.shard,
            m.full_report_chunks,
            m.full_report_index,
        ],
        [m.node_epoch, m.seq, m.sent_at_ms, m.owner_epoch_seen],
        &entries,
    )
}

/// Validation of a report batch read by either path, in the order the checks are
/// documented: schema version, entries, node epoch.
fn report_batch_of(
    [schema_version, node, shard, full_chunks, full_index]: [u32; 5],
    [node_epoch, seq, sent_at_ms, owner_epoch_seen]: [u64; 4],
    raw_entries: &[RawReportEntry<'_>],
) -> Result<ReportBatch, DecodeError> {
    let k = ReportBatch::KIND;
    version(k, schema_version)?;
    let full_report = match (full_chunks, full_index) {
        (0, 0) => None,
        (0, _) => {
            return Err(invalid(k, "full_report_index", "set on a partial report"));
        }
        (count, index) if count <= FULL_REPORT_CHUNKS_MAX && index < count => {
            Some(FullReportChunk { index, count })
        }
        _ => {
            return Err(invalid(
                k,
                "full_report_chunks",
                "more than the most chunks, or an index past them",
            ));
        }
    };
    let entries = unique_entries(
        k,
        raw_entries,
        REPORT_ENTRIES_MAX,
        report_entry,
        |e| (e.key_window, NodeEpoch(0)),
        "a key-window appears twice",
    )?;
    Ok(ReportBatch {
        node: NodeId(node),
        node_epoch: NodeEpoch(epoch(k, "node_epoch", node_epoch)?),
        seq,
        shard: ShardId(shard),
        sent_at_ms,
        owner_epoch_seen: OwnerEpoch(owner_epoch_seen),
        entries,
        full_report,
    })
}

/// A batch's entries: at most `max`, each validated, no two with the same identity
/// (a duplicate would make "apply each entry once" ambiguous, so the batch is refused).
fn unique_entries<W, T>(
    k: &'static str,
    wire_entries: &[W],
    max: usize,
    validate: impl Fn(&'static str, &W) -> Result<T, DecodeError>,
    identity: impl Fn(&T) -> (KeyWindow, NodeEpoch),
    duplicate: &'static str,
) -> Result<Vec<T>, DecodeError> {
    count(k, "entries", wire_entries.len(), max)?;
    let entries = wire_entries
        .iter()
        .map(|e| validate(k, e))
        .collect::<Result<Vec<_>, _>>()?;
    // Senders write entries in order; strictly increasing identities are distinct without
    // building a set.
    if entries
        .windows(2)
        .all(|p| identity(&p[0]) < identity(&p[1]))
    {
        return Ok(entries);
    }
    let mut seen = DetSet::with_capacity_and_hasher(entries.len(), Default::default());
    if !entries.iter().all(|e| seen.insert(identity(e))) {
        return Err(invalid(k, "entries", duplicate));
    }
    Ok(entries)
}

impl Envelope for GrantBatch {
    const KIND: &'static str = "grant_batch";
    const MAX_BYTES: usize = GRANT_BATCH_BYTES_MAX;

    fn encode(&self) -> Vec<u8> {
        // The bytes prost writes for the `wire` message (`canonical`).
        let header = [
            (1, u64::from(SCHEMA_VERSION)),
            (2, self.owner_epoch.0),
            (3, u64::from(self.shard.0)),
            (4, u64::from(self.node.0)),
        ];
        let trailer = [(6, self.full_report_taken.map_or(0, |e| e.0))];
        let len = canonical::header_len(&header)
            + self
                .entries
                .iter()
                .map(|e| canonical::grant_entry_len(5, e))
                .sum::<usize>()
            + canonical::header_len(&trailer);
        let mut out = Vec::with_capacity(len);
        canonical::put_header(&mut out, &header);
        for e in &self.entries {
            canonical::put_grant_entry(&mut out, 5, e);
        }
        canonical::put_header(&mut out, &trailer);
        debug_assert_eq!(out.len(), len);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() <= Self::MAX_BYTES
            && let Some(raw) = canonical::grant_batch(bytes)
        {
            let [_, version_got, owner_epoch, shard, node, _, taken] = raw.scalars;
            return grant_batch_of(
                [version_got, shard, node].map(|v| v as u32),
                owner_epoch,
                taken,
                &raw.entries,
            );
        }
        grant_batch_via_prost(bytes)
    }
}

fn grant_batch_via_prost(bytes: &[u8]) -> Result<GrantBatch, DecodeError> {
    let m: wire::GrantBatch = parse(GrantBatch::KIND, GrantBatch::MAX_BYTES, bytes)?;
    let entries: Vec<RawGrantEntry<'_>> = m.entries.iter().map(wire_grant).collect();
    grant_batch_of(
        [m.schema_version, m.shard, m.node],
        m.owner_epoch,
        m.full_report_taken,
        &entries,
    )
}

fn grant_batch_of(
    [schema_version, shard, node]: [u32; 3],
    owner_epoch: u64,
    full_report_taken: u64,
    raw_entries: &[RawGrantEntry<'_>],
) -> Result<GrantBatch, DecodeError> {
    let k = GrantBatch::KIND;
    version(k, schema_version)?;
    let entries = unique_entries(
        k,
        raw_entries,
        GRANT_ENTRIES_MAX,
        grant_entry,
        |e| (e.key_window, e.node_epoch),
        "a key-window and node epoch appear twice",
    )?;
    Ok(GrantBatch {
        owner_epoch: OwnerEpoch(epoch(k, "owner_epoch", owner_epoch)?),
        shard: ShardId(shard),
        node: NodeId(node),
        entries,
        full_report_taken: (full_report_taken != 0).then_some(NodeEpoch(full_report_taken)),
    })
}

impl Envelope for FastPathRequest {
    const KIND: &'static str = "fast_path_request";
    const MAX_BYTES: usize = FAST_PATH_BYTES_MAX;

    fn encode(&self) -> Vec<u8> {
        wire::FastPathRequest {
            schema_version: SCHEMA_VERSION,
            node: self.node.0,
            node_epoch: self.node_epoch.0,
            shard: self.shard.0,
            request_id: self.request_id,
            owner_epoch_seen: self.owner_epoch_seen.0,
            entry: Some(wire_report_entry(&self.entry)),
        }
        .encode_to_vec()
    }

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let k = Self::KIND;
        let m: wire::FastPathRequest = parse(k, Self::MAX_BYTES, bytes)?;
        version(k, m.schema_version)?;
        let entry = m.entry.as_ref().ok_or(DecodeError::Missing {
            kind: k,
            field: "entry",
        })?;
        Ok(Self {
            node: NodeId(m.node),
            node_epoch: NodeEpoch(epoch(k, "node_epoch", m.node_epoch)?),
            shard: ShardId(m.shard),
            request_id: m.request_id,
            owner_epoch_seen: OwnerEpoch(m.owner_epoch_seen),
            entry: report_entry(k, &RawReportEntry::of(entry))?,
        })
    }
}

impl Envelope for FastPathReply {
    const KIND: &'static str = "fast_path_reply";
    const MAX_BYTES: usize = FAST_PATH_BYTES_MAX;

    fn encode(&self) -> Vec<u8> {
        use wire::fast_path_reply::Outcome;
        let outcome = match self.outcome {
            FastPathOutcome::Granted(g) => Outcome::Granted(wire_grant_entry(&g)),
            FastPathOutcome::Refused { exhausted } => Outcome::Refused(wire::Refused { exhausted }),
            FastPathOutcome::Withheld => Outcome::Withheld(wire::Withheld {}),
        };
        wire::FastPathReply {
            schema_version: SCHEMA_VERSION,
            owner_epoch: self.owner_epoch.0,
            shard: self.shard.0,
            request_id: self.request_id,
            outcome: Some(outcome),
        }
        .encode_to_vec()
    }

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        use wire::fast_path_reply::Outcome;
        let k = Self::KIND;
        let m: wire::FastPathReply = parse(k, Self::MAX_BYTES, bytes)?;
        version(k, m.schema_version)?;
        let outcome = match m.outcome.as_ref().ok_or(DecodeError::Missing {
            kind: k,
            field: "outcome",
        })? {
            Outcome::Granted(g) => FastPathOutcome::Granted(grant_entry(k, &wire_grant(g))?),
            Outcome::Refused(r) => FastPathOutcome::Refused {
                exhausted: r.exhausted,
            },
            Outcome::Withheld(_) => FastPathOutcome::Withheld,
        };
        Ok(Self {
            owner_epoch: OwnerEpoch(epoch(k, "owner_epoch", m.owner_epoch)?),
            shard: ShardId(m.shard),
            request_id: m.request_id,
            outcome,
        })
    }
}

impl Envelope for LimitEvent {
    const KIND: &'static str = "limit_event";
    const MAX_BYTES: usize = LIMIT_EVENT_BYTES_MAX;

    fn encode(&self) -> Vec<u8> {
        let reason = match self.reason {
            LimitReason::Exhausted => wire::LimitReason::Exhausted,
            LimitReason::FastPathDeadline => wire::LimitReason::FastPathDeadline,
            LimitReason::Backstop => wire::LimitReason::Backstop,
        };
        wire::LimitEvent {
            schema_version: SCHEMA_VERSION,
            key_id: self.key.to_bytes().to_vec(),
            window: Some(wire_window(self.window)),
            node: self.id.node.0,
            at_ms: self.at_ms,
            correlation_id: self.correlation_id.clone(),
            reason: reason as i32,
            degraded: self.degraded,
            node_epoch: self.id.node_epoch.0,
            seq: self.id.seq,
            plan_id: self.plan_id,
            retry_after_ms: self.retry_after_ms,
        }
        .encode_to_vec()
    }

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let k = Self::KIND;
        let m: wire::LimitEvent = parse(k, Self::MAX_BYTES, bytes)?;
        version(k, m.schema_version)?;
        if m.correlation_id.len() > CORRELATION_ID_BYTES_MAX {
            return Err(invalid(k, "correlation_id", "longer than 64 bytes"));
        }
        let reason = match wire::LimitReason::try_from(m.reason) {
            Ok(wire::LimitReason::Exhausted) => LimitReason::Exhausted,
            Ok(wire::LimitReason::FastPathDeadline) => LimitReason::FastPathDeadline,
            Ok(wire::LimitReason::Backstop) => LimitReason::Backstop,
            _ => return Err(invalid(k, "reason", "unspecified or unknown")),
        };
        if m.seq == 0 {
            return Err(invalid(k, "seq", "events count from 1"));
        }
        if m.retry_after_ms > RETRY_AFTER_MS_MAX {
            return Err(invalid(
                k,
                "retry_after_ms",
                "longer than the longest window",
            ));
        }
        Ok(Self {
            id: EventId {
                node: NodeId(m.node),
                node_epoch: NodeEpoch(epoch(k, "node_epoch", m.node_epoch)?),
                seq: m.seq,
            },
            key: key_id(k, &m.key_id)?,
            plan_id: m.plan_id,
            window: window(k, m.window.as_ref())?,
            at_ms: m.at_ms,
            correlation_id: m.correlation_id,
            reason,
            degraded: m.degraded,
            retry_after_ms: m.retry_after_ms,
        })
    }
}

fn window_specs(
    kind: &'static str,
    specs: &[wire::WindowSpec],
    allow_empty: bool,
) -> Result<Vec<WindowSpec>, DecodeError> {
    if specs.is_empty() && allow_empty {
        return Ok(Vec::new());
    }
    if specs.is_empty() || specs.len() > PLAN_WINDOWS_MAX {
        return Err(invalid(kind, "windows", "a plan needs 1 to 4 windows"));
    }
    let mut out: Vec<WindowSpec> = Vec::with_capacity(specs.len());
    for s in specs {
        if s.length_ms == 0 || s.length_ms > WINDOW_LENGTH_MS_MAX || s.limit > WINDOW_LIMIT_MAX {
            return Err(invalid(
                kind,
                "windows",
                "length 1 ms to 1 day, limit within 40 bits",
            ));
        }
        if out.iter().any(|o| o.length_ms == s.length_ms) {
            return Err(invalid(kind, "windows", "two windows of the same length"));
        }
        out.push(WindowSpec {
            length_ms: s.length_ms,
            limit: s.limit,
        });
    }
    Ok(out)
}

fn wire_specs(specs: &[WindowSpec]) -> Vec<wire::WindowSpec> {
    specs
        .iter()
        .map(|s| wire::WindowSpec {
            length_ms: s.length_ms,
            limit: s.limit,
        })
        .collect()
}

impl Envelope for PolicySnapshot {
    const KIND: &'static str = "policy_snapshot";
    const MAX_BYTES: usize = POLICY_SNAPSHOT_BYTES_MAX;

    fn encode(&self) -> Vec<u8> {
        wire::PolicySnapshot {
            schema_version: SCHEMA_VERSION,
            version: self.version,
            plans: self
                .plans
                .iter()
                .map(|p| wire::Plan {
                    id: p.id,
                    name: p.name.clone(),
                    windows: wire_specs(&p.windows),
                })
                .collect(),
            keys: self
                .keys
                .iter()
                .map(|a| wire::KeyAssignment {
                    key_id: a.key.to_bytes().to_vec(),
                    plan_id: a.plan_id,
                    override_windows: wire_specs(&a.override_windows),
                    carry_from_key_id: a
                        .carry_from
                        .map(|c| c.to_bytes().to_vec())
                        .unwrap_or_default(),
                })
                .collect(),
        }
        .encode_to_vec()
    }

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let k = Self::KIND;
        let m: wire::PolicySnapshot = parse(k, Self::MAX_BYTES, bytes)?;
        version(k, m.schema_version)?;
        count(k, "plans", m.plans.len(), POLICY_PLANS_MAX)?;
        count(k, "keys", m.keys.len(), POLICY_KEYS_MAX)?;
        let mut plans = Vec::with_capacity(m.plans.len());
        let mut ids = DetSet::default();
        for p in &m.plans {
            if p.name.len() > PLAN_NAME_BYTES_MAX {
                return Err(invalid(k, "plans.name", "longer than 64 bytes"));
            }
            if !ids.insert(p.id) {
                return Err(invalid(k, "plans.id", "duplicate plan id"));
            }
            plans.push(Plan {
                id: p.id,
                name: p.name.clone(),
                windows: window_specs(k, &p.windows, false)?,
            });
        }
        let mut keys = Vec::with_capacity(m.keys.len());
        let mut seen = DetSet::default();
        for a in &m.keys {
            let key = key_id(k, &a.key_id)?;
            if !seen.insert(key) {
                return Err(invalid(k, "keys", "a key is assigned twice"));
            }
            if !ids.contains(&a.plan_id) {
                return Err(invalid(k, "keys.plan_id", "names no plan in the snapshot"));
            }
            let carry_from = if a.carry_from_key_id.is_empty() {
                None
            } else {
                Some(key_id(k, &a.carry_from_key_id)?)
            };
            if carry_from == Some(key) {
                return Err(invalid(k, "keys.carry_from_key_id", "names the key itself"));
            }
            keys.push(KeyAssignment {
                key,
                plan_id: a.plan_id,
                override_windows: window_specs(k, &a.override_windows, true)?,
                carry_from,
            });
        }
        Ok(Self {
            version: m.version,
            plans,
            keys,
        })
    }
}

#[cfg(test)]
mod tests;
