//! The connect options every Foldgate bus client (node, fold worker, tools) uses.

use std::path::Path;
use std::time::Duration;

/// How long a bus client (node or worker) waits before reconnect attempt `attempt`:
/// 10 ms for the first 500 (~5 s), then one round (25 ms) for as long as it takes. F7 wants
/// the fleet back within 3 rounds of the bus returning; async-nats' default backoff took
/// 1.5 s, and a later step to 1 s retries left a 5 s outage 826 ms from recovery at fleet
/// size (BENCHMARKS.md). An attempt on a down server is one refused loopback or LAN
/// connect, so a fleet of clients at one per round per client costs it nothing.
pub fn reconnect_delay(attempt: usize) -> Duration {
    Duration::from_millis(if attempt < 500 { 10 } else { 25 })
}

/// The connect options every Foldgate bus client uses: `reconnect_delay`, and mTLS (B2)
/// when a CA is given (TLS is then required) and a client certificate and key.
pub fn connect_options(
    ca_file: Option<&Path>,
    cert_and_key: Option<(&Path, &Path)>,
) -> async_nats::ConnectOptions {
    let mut options = async_nats::ConnectOptions::new().reconnect_delay_callback(reconnect_delay);
    if let Some(ca) = ca_file {
        options = options
            .require_tls(true)
            .add_root_certificates(ca.to_path_buf());
    }
    if let Some((cert, key)) = cert_and_key {
        options = options.add_client_certificate(cert.to_path_buf(), key.to_path_buf());
    }
    options
}
