//! NATS subjects and other bus names. Only this crate spells them.

/// Per-shard report subject (C1, B1): fold workers consume it as a queue group.
pub fn report(shard: u32) -> String {
    format!("foldgate.v1.report.{shard}")
}

/// Per-shard fast-path request subject (D5), request/reply.
pub fn fast_path(shard: u32) -> String {
    format!("foldgate.v1.fast.{shard}")
}

/// A node's grant inbox: the reply subject of its reports.
pub fn grant_inbox(node: u32) -> String {
    format!("foldgate.v1.grant.{node}")
}

pub const REPORT_ALL: &str = "foldgate.v1.report.*";
pub const FAST_PATH_ALL: &str = "foldgate.v1.fast.*";
pub const GRANT_ALL: &str = "foldgate.v1.grant.*";
/// The same three trees as NATS permission patterns (`>`: every subject below).
pub const REPORT_TREE: &str = "foldgate.v1.report.>";
pub const FAST_PATH_TREE: &str = "foldgate.v1.fast.>";
pub const GRANT_TREE: &str = "foldgate.v1.grant.>";

/// Whether `subject` is a shard's report subject (`report`).
pub fn is_report(subject: &str) -> bool {
    subject.starts_with("foldgate.v1.report.")
}

/// The queue group of a shard's fold workers: one of them takes each report.
pub fn fold_queue_group(shard: u32) -> String {
    format!("foldgate-fold.{shard}")
}

/// NATS key-value bucket of the fold workers' shard leases.
pub const OWNERS_BUCKET: &str = "foldgate-owners";
/// Kafka topic of limit events (E1).
pub const LIMIT_EVENTS_TOPIC: &str = "foldgate.limit-events";
/// NATS key-value bucket holding the policy snapshot (P1).
pub const POLICY_BUCKET: &str = "foldgate-policy";
/// The key in `POLICY_BUCKET` that holds the snapshot.
pub const POLICY_KEY: &str = "snapshot";
