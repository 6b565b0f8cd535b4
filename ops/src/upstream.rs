//! `foldgate upstream`: a tiny upstream API for local runs, `200 ok` to everything, until
//! Ctrl-C.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use foldgate_harness::http_tools;

/// Serves on `listen`, answering each request after `delay_ms`.
pub fn run(listen: SocketAddr, delay_ms: u64) -> Result<()> {
    crate::runtime()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        eprintln!("foldgate upstream on {}", listener.local_addr()?);
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = stop_tx.send(true);
        });
        http_tools::run_upstream(listener, delay_ms, stop).await;
        Ok(())
    })
}
