//! The canonical writer and reader (`canonical`) against prost: the same bytes out,
//! and the same result (value or error) for any input, valid or not.

use super::*;
use proptest::prelude::*;

fn prost_report(b: &ReportBatch) -> Vec<u8> {
    wire::ReportBatch {
        schema_version: SCHEMA_VERSION,
        node: b.node.0,
        node_epoch: b.node_epoch.0,
        seq: b.seq,
        shard: b.shard.0,
        sent_at_ms: b.sent_at_ms,
        owner_epoch_seen: b.owner_epoch_seen.0,
        entries: b.entries.iter().map(wire_report_entry).collect(),
        full_report_chunks: b.full_report.map_or(0, |c| c.count),
        full_report_index: b.full_report.map_or(0, |c| c.index),
    }
    .encode_to_vec()
}

fn prost_grant(b: &GrantBatch) -> Vec<u8> {
    wire::GrantBatch {
        schema_version: SCHEMA_VERSION,
        owner_epoch: b.owner_epoch.0,
        shard: b.shard.0,
        node: b.node.0,
        entries: b.entries.iter().map(wire_grant_entry).collect(),
        full_report_taken: b.full_report_taken.map_or(0, |e| e.0),
    }
    .encode_to_vec()
}

/// Small values most of the time (0 is a left-out field), any value sometimes.
fn num() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..3, 0u64..300, any::<u64>()]
}

fn key_window() -> impl Strategy<Value = KeyWindow> {
    (
        1u8..=255,
        any::<u128>(),
        prop_oneof![Just(0u32), any::<u32>()],
        num(),
    )
        .prop_map(|(version, digest, length_ms, number)| KeyWindow {
            key: KeyId { version, digest },
            window: WindowId { length_ms, number },
        })
}

fn report() -> impl Strategy<Value = ReportBatch> {
    let entry = (key_window(), proptest::array::uniform7(num())).prop_map(|(kw, v)| ReportEntry {
        key_window: kw,
        allowance: v[0],
        cumulative_spend: v[1],
        demand: v[2],
        held_credit: v[3],
        applied_grant: v[4],
        returned: v[5],
        self_granted: v[6],
        // Both values, from a bit of a count the strategy already draws.
        standing_option: v[6] % 2 == 1,
    });
    // Out-of-range chunk pairs too: they encode, and both readers must refuse them.
    let full = prop_oneof![
        Just(None),
        (0u32..3, 1u32..4).prop_map(|(index, count)| Some(FullReportChunk { index, count })),
        (any::<u32>(), any::<u32>())
            .prop_map(|(index, count)| Some(FullReportChunk { index, count })),
    ];
    (
        proptest::array::uniform6(num()),
        proptest::collection::vec(entry, 0..6),
        full,
    )
        .prop_map(|(h, entries, full_report)| ReportBatch {
            node: NodeId(h[0] as u32),
            node_epoch: NodeEpoch(h[1]),
            seq: h[2],
            shard: ShardId(h[3] as u32),
            sent_at_ms: h[4],
            owner_epoch_seen: OwnerEpoch(h[5]),
            entries,
            full_report,
        })
}

fn grant() -> impl Strategy<Value = GrantBatch> {
    let entry = (key_window(), num(), num(), num(), any::<bool>()).prop_map(
        |(kw, epoch, seq, total, exhausted)| GrantEntry {
            key_window: kw,
            node_epoch: NodeEpoch(epoch),
            grant_seq: seq,
            credit_total: total,
            exhausted,
        },
    );
    (
        num(),
        num(),
        num(),
        proptest::collection::vec(entry, 0..6),
        prop_oneof![Just(None), num().prop_map(|e| Some(NodeEpoch(e)))],
    )
        .prop_map(
            |(epoch, shard, node, entries, full_report_taken)| GrantBatch {
                owner_epoch: OwnerEpoch(epoch),
                shard: ShardId(shard as u32),
                node: NodeId(node as u32),
                entries,
                full_report_taken,
            },
        )
}

/// Damage to canonical bytes: a byte changed, bytes cut, a byte inserted.
fn damage(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, kind, b) in edits {
        let at = at % (bytes.len() + 1);
        match kind % 4 {
            0 if at < bytes.len() => bytes[at] = b,
            1 => bytes.truncate(at),
            2 => bytes.insert(at, b),
            _ if at < bytes.len() => bytes[at] ^= 1 << (b % 8),
            _ => {}
        }
    }
    bytes
}

fn same<T: std::fmt::Debug>(a: Result<T, DecodeError>, b: Result<T, DecodeError>) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn report_bytes_match_prost(r in report()) {
        prop_assert_eq!(r.encode(), prost_report(&r));
    }

    #[test]
    fn grant_bytes_match_prost(g in grant()) {
        prop_assert_eq!(g.encode(), prost_grant(&g));
    }

    #[test]
    fn report_decoding_matches_prost(
        r in report(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..3),
    ) {
        let bytes = damage(r.encode(), &edits);
        prop_assert!(same(ReportBatch::decode(&bytes), report_batch_via_prost(&bytes)));
    }

    #[test]
    fn grant_decoding_matches_prost(
        g in grant(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..3),
    ) {
        let bytes = damage(g.encode(), &edits);
        prop_assert!(same(GrantBatch::decode(&bytes), grant_batch_via_prost(&bytes)));
    }

    #[test]
    fn arbitrary_bytes_decode_as_prost_does(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        prop_assert!(same(ReportBatch::decode(&bytes), report_batch_via_prost(&bytes)));
        prop_assert!(same(GrantBatch::decode(&bytes), grant_batch_via_prost(&bytes)));
    }
}

#[test]
fn prost_layouts_the_canonical_reader_declines_still_decode() {
    // Fields out of order, a field twice and an unknown field: prost reads them all.
    let mut m = wire::ReportBatch {
        schema_version: SCHEMA_VERSION,
        node: 3,
        node_epoch: 7,
        seq: 9,
        ..Default::default()
    }
    .encode_to_vec();
    m.extend_from_slice(&[0x10, 0x05]); // node = 5 again, after field 4
    m.extend_from_slice(&[0xa0, 0x06, 0x01]); // field 100, unknown
    assert!(canonical::report_batch(&m).is_none());
    let b = ReportBatch::decode(&m).expect("prost reads it");
    assert_eq!((b.node, b.seq), (NodeId(5), 9));
}

#[test]
fn a_bool_is_any_non_zero_varint_on_both_paths() {
    let g = GrantBatch {
        owner_epoch: OwnerEpoch(1),
        shard: ShardId(0),
        node: NodeId(0),
        entries: vec![GrantEntry {
            key_window: KeyWindow {
                key: KeyId {
                    version: 1,
                    digest: 5,
                },
                window: WindowId {
                    length_ms: 1_000,
                    number: 3,
                },
            },
            node_epoch: NodeEpoch(1),
            grant_seq: 1,
            credit_total: 4,
            exhausted: true,
        }],
        full_report_taken: None,
    };
    let mut bytes = g.encode();
    assert_eq!(bytes[bytes.len() - 2..], [0x28, 0x01]);
    *bytes.last_mut().expect("non-empty") = 0x02;
    assert!(canonical::grant_batch(&bytes).is_some());
    let decoded = GrantBatch::decode(&bytes).expect("valid");
    assert!(decoded.entries[0].exhausted);
    assert!(same(Ok(decoded), grant_batch_via_prost(&bytes)));
}

#[test]
fn a_full_report_chunk_is_refused_out_of_range_on_both_paths() {
    let r = ReportBatch {
        node: NodeId(1),
        node_epoch: NodeEpoch(1),
        seq: 4,
        shard: ShardId(0),
        sent_at_ms: 1,
        owner_epoch_seen: OwnerEpoch(2),
        entries: Vec::new(),
        full_report: Some(FullReportChunk { index: 2, count: 3 }),
    };
    let ok = ReportBatch::decode(&r.encode()).expect("in range");
    assert_eq!(ok.full_report, r.full_report);
    for (index, count, field) in [
        (3, 3, "full_report_chunks"),
        (0, FULL_REPORT_CHUNKS_MAX + 1, "full_report_chunks"),
        (1, 0, "full_report_index"),
    ] {
        let bad = ReportBatch {
            full_report: Some(FullReportChunk { index, count }),
            ..r.clone()
        };
        let bytes = bad.encode();
        let got = ReportBatch::decode(&bytes);
        assert!(
            matches!(got, Err(DecodeError::Invalid { field: f, .. }) if f == field),
            "{index}/{count}: {got:?}"
        );
        assert!(same(got, report_batch_via_prost(&bytes)));
    }
}
