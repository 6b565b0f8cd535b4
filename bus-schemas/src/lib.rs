//! Foldgate's wire vocabulary, and the only crate that knows the bytes (B2).
//!
//! * [`domain`] — the validated types every other crate speaks, with the limits on everything.
//! * [`codec`] — [`Envelope`]: encode to proto3 bytes, decode with validation (size first,
//!   then framing, then schema version — an unknown one rejects the envelope whole — then
//!   every field). Unknown fields are tolerated.
//! * [`subjects`] — NATS subjects, the Kafka topic, the policy bucket.
//! * [`hashing`] — the fast deterministic hasher the state machines' maps share.
//! * `wire` — prost types generated at build time from `proto/` with a vendored protoc.

mod canonical;
pub mod codec;
pub mod domain;
pub mod hashing;
pub mod subjects;

#[doc(hidden)]
#[allow(clippy::all, clippy::pedantic)]
pub mod wire {
    include!(concat!(env!("OUT_DIR"), "/foldgate.v1.rs"));
}

pub use codec::{DecodeError, Envelope};
pub use domain::*;
