//! Wire format tests: golden v1 fixtures (fail on drift), round trips, unknown fields,
//! unknown versions rejected whole, and every rejection reason.
//!
//! v1 is the first release, so the "previous release" fixtures are these v1 files, frozen.
//! When v2 ships they stay, and must still decode (B2: one release older is accepted).
//! Regenerate only on purpose: `FOLDGATE_REGEN_FIXTURES=1 cargo test -p bus-schemas --test codec`.

use std::path::PathBuf;

use bus_schemas::*;
use proptest::prelude::*;

fn kw(n: u64) -> KeyWindow {
    KeyWindow {
        key: KeyId {
            version: 1,
            digest: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210 ^ u128::from(n),
        },
        window: WindowId {
            length_ms: 1_000,
            number: 1_764_720_000 + n,
        },
    }
}

fn entry(n: u64) -> ReportEntry {
    ReportEntry {
        key_window: kw(n),
        allowance: 100,
        cumulative_spend: 10 + n,
        demand: 2_500,
        held_credit: 5,
        applied_grant: 30 + n,
        returned: 1,
        self_granted: 0,
        standing_option: false,
    }
}

fn report() -> ReportBatch {
    ReportBatch {
        node: NodeId(3),
        node_epoch: NodeEpoch(7),
        seq: 42,
        shard: ShardId(5),
        sent_at_ms: 1_764_720_000_123,
        owner_epoch_seen: OwnerEpoch(2),
        entries: vec![entry(0), entry(1)],
        full_report: None,
    }
}

fn grant_entry() -> GrantEntry {
    GrantEntry {
        key_window: kw(0),
        node_epoch: NodeEpoch(7),
        grant_seq: 9,
        credit_total: 40,
        exhausted: true,
    }
}

fn grant() -> GrantBatch {
    GrantBatch {
        owner_epoch: OwnerEpoch(2),
        shard: ShardId(5),
        node: NodeId(3),
        entries: vec![grant_entry()],
        full_report_taken: None,
    }
}

fn fast_request() -> FastPathRequest {
    FastPathRequest {
        node: NodeId(3),
        node_epoch: NodeEpoch(7),
        shard: ShardId(5),
        request_id: 77,
        owner_epoch_seen: OwnerEpoch(2),
        entry: entry(0),
    }
}

fn fast_reply() -> FastPathReply {
    FastPathReply {
        owner_epoch: OwnerEpoch(2),
        shard: ShardId(5),
        request_id: 77,
        outcome: FastPathOutcome::Granted(grant_entry()),
    }
}

fn event() -> LimitEvent {
    LimitEvent {
        id: EventId {
            node: NodeId(3),
            node_epoch: NodeEpoch(1_764_719_000_000),
            seq: 42,
        },
        key: kw(0).key,
        plan_id: 7,
        window: kw(0).window,
        at_ms: 1_764_720_000_500,
        correlation_id: "req-0001".into(),
        reason: LimitReason::Exhausted,
        degraded: false,
        retry_after_ms: 500,
    }
}

fn policy() -> PolicySnapshot {
    PolicySnapshot {
        version: 11,
        plans: vec![Plan {
            id: 1,
            name: "standard".into(),
            windows: vec![
                WindowSpec {
                    length_ms: 1_000,
                    limit: 50,
                },
                WindowSpec {
                    length_ms: 60_000,
                    limit: 2_400,
                },
            ],
        }],
        keys: vec![KeyAssignment {
            key: kw(0).key,
            plan_id: 1,
            override_windows: vec![WindowSpec {
                length_ms: 1_000,
                limit: 80,
            }],
            carry_from: None,
        }],
    }
}

fn fixture<E: Envelope + PartialEq + std::fmt::Debug>(name: &str, value: &E) {
    // Read at run time: a test binary reused from a shared target cache may have been
    // compiled in another checkout of the same tree, and `env!` would point there.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let path = manifest_dir
        .join("tests/fixtures/v1")
        .join(format!("{name}.bin"));
    if std::env::var_os("FOLDGATE_REGEN_FIXTURES").is_some() {
        // Checked against itself a fixture proves nothing: a regenerating run never passes.
        std::fs::write(&path, value.encode()).unwrap();
        panic!(
            "{name}: fixture regenerated at {}; review the diff, then run again without \
             FOLDGATE_REGEN_FIXTURES",
            path.display()
        );
    }
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &E::decode(&bytes).unwrap(),
        value,
        "{name}: fixture decodes to the documented value"
    );
    assert_eq!(
        value.encode(),
        bytes,
        "{name}: encoding drifted from the v1 fixture"
    );
    // A newer minor release may add fields: field 1000, varint 1, must be skipped.
    let mut extended = bytes.clone();
    extended.extend_from_slice(&[0xc0, 0x3e, 0x01]);
    assert_eq!(
        &E::decode(&extended).unwrap(),
        value,
        "{name}: unknown field not tolerated"
    );
    // Schema version is field 1 (varint, tag byte 0x08) and encoded first.
    assert_eq!(
        bytes[..2],
        [0x08, 0x01],
        "{name}: envelope starts with schema_version 1"
    );
    for bad in [0u8, 2, 9] {
        let mut other = bytes.clone();
        other[1] = bad;
        let err = E::decode(&other).unwrap_err();
        assert_eq!(err.reason(), "unknown_version", "{name} v{bad}: {err}");
    }
    // 2^32 + 1 as sent: its low 32 bits read 1, which must not pass for version 1.
    let mut wide = vec![0x08, 0x81, 0x80, 0x80, 0x80, 0x10];
    wide.extend_from_slice(&bytes[2..]);
    let err = E::decode(&wide).unwrap_err();
    assert_eq!(err.reason(), "unknown_version", "{name} v2^32+1: {err}");
    assert!(err.to_string().contains("4294967297"), "{name}: {err}");
}

#[test]
fn golden_v1_fixtures() {
    fixture("report_batch", &report());
    fixture("grant_batch", &grant());
    fixture("fast_path_request", &fast_request());
    fixture("fast_path_reply", &fast_reply());
    fixture("limit_event", &event());
    fixture("policy_snapshot", &policy());
}

#[test]
fn size_is_checked_before_parsing() {
    let garbage = vec![0xffu8; FastPathRequest::MAX_BYTES + 1];
    assert_eq!(
        FastPathRequest::decode(&garbage).unwrap_err().reason(),
        "too_large"
    );
    assert_eq!(
        FastPathRequest::decode(&garbage[..100])
            .unwrap_err()
            .reason(),
        "malformed"
    );
}

#[test]
fn every_rejection_reason() {
    let reason = |r: Result<ReportBatch, DecodeError>| r.unwrap_err().reason();
    let mut dup = report();
    dup.entries.push(entry(0));
    assert_eq!(reason(ReportBatch::decode(&dup.encode())), "invalid");
    let mut over = report();
    over.entries[0].cumulative_spend = 1_000;
    assert_eq!(
        reason(ReportBatch::decode(&over.encode())),
        "invalid",
        "spend above credit received"
    );
    // Figures that would overflow the owner's and node's window and sizing arithmetic.
    let mut far = report();
    far.entries[0].key_window.window.number = u64::MAX / 1_000;
    assert_eq!(reason(ReportBatch::decode(&far.encode())), "invalid");
    let mut greedy = report();
    greedy.entries[0].demand = limits::DEMAND_MILLI_MAX + 1;
    assert_eq!(reason(ReportBatch::decode(&greedy.encode())), "invalid");
    let mut grant_far = grant();
    grant_far.entries[0].key_window.window.number = u64::MAX;
    assert_eq!(
        GrantBatch::decode(&grant_far.encode())
            .unwrap_err()
            .reason(),
        "invalid"
    );
    let mut epoch0 = report();
    epoch0.node_epoch = NodeEpoch(0);
    assert_eq!(reason(ReportBatch::decode(&epoch0.encode())), "invalid");
    let mut many = report();
    many.entries = (0..limits::REPORT_ENTRIES_MAX as u64 + 1)
        .map(entry)
        .collect();
    assert_eq!(reason(ReportBatch::decode(&many.encode())), "too_many");
    let mut bad_key = wire_report();
    bad_key.entries[0].key_window.as_mut().unwrap().key_id = vec![1, 2, 3];
    assert_eq!(
        reason(ReportBatch::decode(&prost::Message::encode_to_vec(
            &bad_key
        ))),
        "invalid"
    );
    let mut no_window = wire_report();
    no_window.entries[0].key_window.as_mut().unwrap().window = None;
    assert_eq!(
        reason(ReportBatch::decode(&prost::Message::encode_to_vec(
            &no_window
        ))),
        "missing"
    );
    let mut zero_len = wire_report();
    zero_len.entries[0]
        .key_window
        .as_mut()
        .unwrap()
        .window
        .as_mut()
        .unwrap()
        .length_ms = 0;
    assert_eq!(
        reason(ReportBatch::decode(&prost::Message::encode_to_vec(
            &zero_len
        ))),
        "invalid"
    );
    let mut unspecified = event();
    unspecified.correlation_id = "x".repeat(65);
    assert_eq!(
        LimitEvent::decode(&unspecified.encode())
            .unwrap_err()
            .reason(),
        "invalid"
    );
    let mut seq0 = event();
    seq0.id.seq = 0;
    let mut epoch0 = event();
    epoch0.id.node_epoch = NodeEpoch(0);
    let mut endless_wait = event();
    endless_wait.retry_after_ms = limits::RETRY_AFTER_MS_MAX + 1;
    let mut short_key = wire_event();
    short_key.key_id.truncate(16);
    let mut no_reason = wire_event();
    no_reason.reason = 0;
    let mut future_reason = wire_event();
    future_reason.reason = 99;
    for (what, bytes) in [
        ("seq 0", seq0.encode()),
        ("epoch 0", epoch0.encode()),
        ("wait past two days", endless_wait.encode()),
        ("16-byte key id", prost::Message::encode_to_vec(&short_key)),
        (
            "unspecified reason",
            prost::Message::encode_to_vec(&no_reason),
        ),
        (
            "unknown reason",
            prost::Message::encode_to_vec(&future_reason),
        ),
    ] {
        assert_eq!(
            LimitEvent::decode(&bytes).unwrap_err().reason(),
            "invalid",
            "{what}"
        );
    }
    let mut bad_policy = policy();
    bad_policy.keys[0].plan_id = 9;
    assert_eq!(
        PolicySnapshot::decode(&bad_policy.encode())
            .unwrap_err()
            .reason(),
        "invalid"
    );
    // A rotation's carry names another id; naming the key itself is refused.
    let mut carried = policy();
    carried.keys[0].carry_from = Some(kw(1).key);
    assert_eq!(PolicySnapshot::decode(&carried.encode()).unwrap(), carried);
    carried.keys[0].carry_from = Some(carried.keys[0].key);
    assert_eq!(
        PolicySnapshot::decode(&carried.encode())
            .unwrap_err()
            .reason(),
        "invalid"
    );
}

fn wire_event() -> wire::LimitEvent {
    <wire::LimitEvent as prost::Message>::decode(event().encode().as_slice()).unwrap()
}

fn wire_report() -> wire::ReportBatch {
    <wire::ReportBatch as prost::Message>::decode(report().encode().as_slice()).unwrap()
}

proptest! {
    /// E1: every field of an event survives the wire, and its id names it uniquely.
    #[test]
    fn limit_events_round_trip(
        node in any::<u32>(),
        node_epoch in 1u64..,
        seq in 1u64..,
        digest in any::<u128>(),
        version in 1u8..,
        plan_id in any::<u32>(),
        length_ms in 1u32..=limits::WINDOW_LENGTH_MS_MAX,
        at_ms in any::<u64>(),
        cid in "[ -~]{0,64}",
        reason in prop_oneof![
            Just(LimitReason::Exhausted),
            Just(LimitReason::FastPathDeadline),
            Just(LimitReason::Backstop),
        ],
        degraded in any::<bool>(),
        retry_after_ms in 0..=limits::RETRY_AFTER_MS_MAX,
    ) {
        let e = LimitEvent {
            id: EventId { node: NodeId(node), node_epoch: NodeEpoch(node_epoch), seq },
            key: KeyId { version, digest },
            plan_id,
            window: WindowId { length_ms, number: at_ms % (1 << 40) / u64::from(length_ms) },
            at_ms,
            correlation_id: cid,
            reason,
            degraded,
            retry_after_ms,
        };
        let bytes = e.encode();
        prop_assert!(bytes.len() <= LimitEvent::MAX_BYTES);
        prop_assert_eq!(LimitEvent::decode(&bytes).unwrap(), e);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = ReportBatch::decode(&bytes);
        let _ = GrantBatch::decode(&bytes);
        let _ = FastPathRequest::decode(&bytes);
        let _ = FastPathReply::decode(&bytes);
        let _ = LimitEvent::decode(&bytes);
        let _ = PolicySnapshot::decode(&bytes);
    }

    #[test]
    fn valid_batches_round_trip(
        seq in any::<u64>(),
        n in 0usize..50,
        spend in 0u64..1_000,
        held in 0u64..1_000,
        self_granted in 0u64..1_000,
        credit_total in 0u64..(1 << 40),
        exhausted in any::<bool>(),
    ) {
        let mut r = report();
        r.seq = seq;
        r.entries = (0..n as u64).map(|i| ReportEntry {
            cumulative_spend: spend,
            held_credit: held,
            returned: 0,
            applied_grant: spend + held,
            self_granted,
            ..entry(i)
        }).collect();
        prop_assert_eq!(ReportBatch::decode(&r.encode()).unwrap(), r);
        let mut g = grant();
        g.entries[0].credit_total = credit_total;
        g.entries[0].exhausted = exhausted;
        prop_assert_eq!(GrantBatch::decode(&g.encode()).unwrap(), g);
    }
}
