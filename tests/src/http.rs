//! In-process gateways for the HTTP tests: an upstream and a `foldgate-node` on free
//! loopback ports, real sockets, the node's own code path.

use std::net::SocketAddr;
use std::sync::Arc;

use foldgate_harness::http_tools::{
    bench_key, bench_policy_toml, loopback, run_upstream, serve_on_loopback,
};
use gateway_node::http::auth::KeyHasher;
use gateway_node::http::node::{NodeGateway, NodeSettings, start_runtime, system_clock};
use tokio::sync::watch;

/// The tests' hash key (hex). Test-only: a deployment reads its own from `hash_key_file`.
pub const HASH_KEY_HEX: &str = "8f0c1b2a39485766a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0aa55";
pub const KEY_SEED: u64 = 0xf01d;

pub fn hasher() -> KeyHasher {
    KeyHasher::from_hex(1, HASH_KEY_HEX).expect("valid test key")
}

/// Test key `i` (raw), as the gateway's policy knows it.
pub fn key(i: u64) -> String {
    bench_key(KEY_SEED, i)
}

/// `[policy]` for keys 0..keys on one plan of `windows` (`(length_ms, limit)`).
pub fn policy(keys: u64, windows: &[(u32, u64)]) -> String {
    bench_policy_toml(&hasher(), KEY_SEED, keys, windows)
}

pub struct TestGateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub gateway: Arc<NodeGateway>,
    pub settings: NodeSettings,
    stop: watch::Sender<bool>,
}

impl TestGateway {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// An upstream on a free port (answers `200 ok`, after `delay_ms`). It stops when the
/// returned sender is dropped.
pub async fn start_upstream(delay_ms: u64) -> (SocketAddr, watch::Sender<bool>) {
    let (listener, addr) = loopback().await.expect("bind upstream");
    let (tx, rx) = watch::channel(false);
    tokio::spawn(run_upstream(listener, delay_ms, rx));
    (addr, tx)
}

/// A node gateway in this process, its upstream `upstream`. `extra` is TOML for any other
/// knob (dotted keys for tables: `server.drain_ms = 10`), then the `[policy]` table.
pub async fn start_gateway(upstream: SocketAddr, extra: &str, policy: &str) -> TestGateway {
    let text = format!(
        "upstream.urls = [\"http://{upstream}\"]\nhash_key_hex = \"{HASH_KEY_HEX}\"\nlog_level = \"warn\"\n{extra}\n{policy}"
    );
    let settings: NodeSettings = toml::from_str(&text).expect("test settings parse");
    let (stop_tx, stop) = watch::channel(false);
    let clock = system_clock();
    let runtime = start_runtime(&settings, Arc::clone(&clock), stop.clone())
        .await
        .expect("runtime starts");
    let gateway = Arc::new(NodeGateway::new(&settings, runtime, clock).expect("gateway"));
    let (addr, admin) = serve_on_loopback(Arc::clone(&gateway), settings.server.limits(), stop)
        .await
        .expect("bind");
    TestGateway {
        addr,
        admin,
        gateway,
        settings,
        stop: stop_tx,
    }
}
