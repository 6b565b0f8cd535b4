//! The HTTP gateway: `foldgate-node` puts the limiter in front of an upstream
//! API; `foldgate-edge` is the backstop in front of the nodes (D9).
//!
//! * [`node`] — authenticate, decide, proxy; the runtime (embedded or NATS) it decides on;
//!   its settings.
//! * [`edge`] — the per-key floor and the fleet ceiling share, outside the limiter.
//! * [`auth`] — the key from the request (D1), its HMAC id (D2), correlation ids.
//! * [`contract`] — the responses the gateway makes itself: 429 (D6), 401, 502, 504.
//! * [`proxy`] — the upstream hop, shared by node and edge.
//! * [`server`] — the accept loop: HTTP/1.1 and HTTP/2, connection and header bounds.
//! * [`metrics`] — Prometheus text from plain atomics.
//! * [`config`] — one TOML file per binary, overridden by environment and flags.

pub mod auth;
pub mod config;
pub mod contract;
pub mod edge;
pub mod metrics;
pub mod node;
pub mod proxy;
pub mod server;

/// Installs the tracing subscriber the binaries log through: JSON lines (or text) at
/// `level`, `RUST_LOG` overriding it.
pub fn init_logging(format: &str, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "text" {
        builder.try_init()
    } else {
        builder.json().flatten_event(true).try_init()
    };
}
