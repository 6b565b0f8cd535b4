//! Limit events as Arrow columns, and back: the archive's one schema (README.md lists
//! each column, its type and meaning). Key ids are stored as `foldgate key-id` prints them
//! (`v<version>:<32 hex>`), so an operator can paste one into SQL.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, RecordBatch, StringArray,
    TimestampMillisecondArray, UInt8Array, UInt32Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use bus_schemas::{EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};

use crate::ArchiveError;

/// Columns in file order.
pub const COLUMNS: [&str; 15] = [
    "event_id",
    "key_id",
    "hash_version",
    "plan_id",
    "window_ms",
    "window_id",
    "node",
    "node_epoch",
    "seq",
    "at",
    "day",
    "correlation_id",
    "reason",
    "degraded",
    "retry_after_ms",
];

pub fn schema() -> SchemaRef {
    use DataType::*;
    let f = |name: &str, t: DataType| Field::new(name, t, false);
    Arc::new(Schema::new(vec![
        f(COLUMNS[0], Utf8),
        f(COLUMNS[1], Utf8),
        f(COLUMNS[2], UInt8),
        f(COLUMNS[3], UInt32),
        f(COLUMNS[4], UInt32),
        f(COLUMNS[5], UInt64),
        f(COLUMNS[6], UInt32),
        f(COLUMNS[7], UInt64),
        f(COLUMNS[8], UInt64),
        f(
            COLUMNS[9],
            Timestamp(TimeUnit::Millisecond, Some("+00:00".into())),
        ),
        f(COLUMNS[10], Date32),
        f(COLUMNS[11], Utf8),
        f(COLUMNS[12], Utf8),
        f(COLUMNS[13], Boolean),
        f(COLUMNS[14], UInt64),
    ]))
}

/// The `rollup` table (E3): events per key, window, reason and day, for days past the
/// raw events' retention.
pub fn rollup_schema() -> SchemaRef {
    use DataType::*;
    let f = |name: &str, t: DataType| Field::new(name, t, false);
    Arc::new(Schema::new(vec![
        f("day", Date32),
        f("key_id", Utf8),
        f("hash_version", UInt8),
        f("window_ms", UInt32),
        f("reason", Utf8),
        f("events", UInt64),
    ]))
}

/// `v<version>:<32 hex>`: the form `foldgate key-id` prints and policies name.
pub fn key_id_text(k: KeyId) -> String {
    k.text()
}

pub fn reason_text(r: LimitReason) -> &'static str {
    match r {
        LimitReason::Exhausted => "exhausted",
        LimitReason::FastPathDeadline => "fast_path_deadline",
        LimitReason::Backstop => "backstop",
    }
}

fn parse_reason(text: &str) -> Option<LimitReason> {
    [
        LimitReason::Exhausted,
        LimitReason::FastPathDeadline,
        LimitReason::Backstop,
    ]
    .into_iter()
    .find(|r| reason_text(*r) == text)
}

const MS_PER_DAY: i64 = 86_400_000;

/// Days since the Unix epoch (UTC) of a wall time in ms: the archive's partition.
pub fn day_of(at_ms: u64) -> i32 {
    (at_ms as i64).div_euclid(MS_PER_DAY) as i32
}

/// `YYYY-MM-DD` of a day number.
pub fn day_text(day: i32) -> String {
    chrono::DateTime::from_timestamp_millis(i64::from(day) * MS_PER_DAY)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| format!("day{day}"))
}

/// The events as one record batch, in the order given.
pub fn encode(events: &[LimitEvent]) -> RecordBatch {
    let col = |f: &dyn Fn(&LimitEvent) -> u64| -> UInt64Array { events.iter().map(f).collect() };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            events.iter().map(|e| e.id.to_string()),
        )),
        Arc::new(StringArray::from_iter_values(
            events.iter().map(|e| key_id_text(e.key)),
        )),
        Arc::new(events.iter().map(|e| e.key.version).collect::<UInt8Array>()),
        Arc::new(events.iter().map(|e| e.plan_id).collect::<UInt32Array>()),
        Arc::new(
            events
                .iter()
                .map(|e| e.window.length_ms)
                .collect::<UInt32Array>(),
        ),
        Arc::new(col(&|e| e.window.number)),
        Arc::new(events.iter().map(|e| e.id.node.0).collect::<UInt32Array>()),
        Arc::new(col(&|e| e.id.node_epoch.0)),
        Arc::new(col(&|e| e.id.seq)),
        Arc::new(
            TimestampMillisecondArray::from_iter_values(events.iter().map(|e| e.at_ms as i64))
                .with_timezone("+00:00"),
        ),
        Arc::new(Date32Array::from_iter_values(
            events.iter().map(|e| day_of(e.at_ms)),
        )),
        Arc::new(StringArray::from_iter_values(
            events.iter().map(|e| e.correlation_id.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            events.iter().map(|e| reason_text(e.reason)),
        )),
        Arc::new(
            events
                .iter()
                .map(|e| Some(e.degraded))
                .collect::<BooleanArray>(),
        ),
        Arc::new(col(&|e| e.retry_after_ms)),
    ];
    RecordBatch::try_new(schema(), columns).expect("columns match the schema")
}

fn column<'a, T: 'static>(b: &'a RecordBatch, name: &'static str) -> Result<&'a T, ArchiveError> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or(ArchiveError::Schema(name))
}

/// The events of a batch written by [`encode`]; a batch of another shape is an error.
pub fn decode(b: &RecordBatch) -> Result<Vec<LimitEvent>, ArchiveError> {
    let key = column::<StringArray>(b, "key_id")?;
    let plan = column::<UInt32Array>(b, "plan_id")?;
    let window_ms = column::<UInt32Array>(b, "window_ms")?;
    let window_id = column::<UInt64Array>(b, "window_id")?;
    let node = column::<UInt32Array>(b, "node")?;
    let epoch = column::<UInt64Array>(b, "node_epoch")?;
    let seq = column::<UInt64Array>(b, "seq")?;
    let at = column::<TimestampMillisecondArray>(b, "at")?;
    let cid = column::<StringArray>(b, "correlation_id")?;
    let reason = column::<StringArray>(b, "reason")?;
    let degraded = column::<BooleanArray>(b, "degraded")?;
    let retry = column::<UInt64Array>(b, "retry_after_ms")?;
    (0..b.num_rows())
        .map(|i| {
            Ok(LimitEvent {
                id: EventId {
                    node: NodeId(node.value(i)),
                    node_epoch: NodeEpoch(epoch.value(i)),
                    seq: seq.value(i),
                },
                key: KeyId::from_text(key.value(i)).ok_or(ArchiveError::Schema("key_id"))?,
                plan_id: plan.value(i),
                window: WindowId {
                    length_ms: window_ms.value(i),
                    number: window_id.value(i),
                },
                at_ms: at.value(i).max(0) as u64,
                correlation_id: cid.value(i).to_string(),
                reason: parse_reason(reason.value(i)).ok_or(ArchiveError::Schema("reason"))?,
                degraded: degraded.value(i),
                retry_after_ms: retry.value(i),
            })
        })
        .collect()
}

/// The `key_id` column of a batch, for filters that need no other column.
pub fn key_ids(b: &RecordBatch) -> Result<&StringArray, ArchiveError> {
    column::<StringArray>(b, "key_id")
}
