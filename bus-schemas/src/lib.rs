//! Foldgate's wire vocabulary. `domain` holds the validated types every other crate
//! speaks; the proto3 envelopes and their codec live beside it, and this is the only
//! crate that knows the bytes (B2).

pub mod domain;

pub use domain::*;
