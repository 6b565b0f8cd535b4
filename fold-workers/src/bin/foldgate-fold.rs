//! `foldgate-fold`: a fold worker process. It competes for shard leases in the NATS
//! key-value bucket and owns whatever it holds (see `fold_workers::service`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bus_schemas::ShardId;
use clap::Parser;
use fold_workers::OwnerConfig;
use fold_workers::service::{Candidate, FoldWorkerStats, LeaseConfig, run_elected_worker};

#[derive(Parser)]
#[command(name = "foldgate-fold", about = "Foldgate fold worker")]
struct Args {
    /// NATS server URL.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// This worker's name, as written into the leases it holds.
    #[arg(long)]
    name: String,
    /// Key shards in the fleet (one lease each).
    #[arg(long, default_value_t = 20)]
    shards: u32,
    /// Gateway nodes in the fleet (the takeover fence waits for all of them).
    #[arg(long, default_value_t = 20)]
    fleet: u32,
    /// Standing options: per mille of each window's leasable allowance the nodes take
    /// unasked (0: off). Must equal the nodes' `standing_permille`.
    #[arg(long, default_value_t = OwnerConfig::reference(ShardId(0)).standing_permille)]
    standing_permille: u64,
    /// Lease lifetime, ms; renewed every quarter of it.
    #[arg(long, default_value_t = 500)]
    lease_ms: u64,
    /// After taking a shard, how long to wait for every fleet node to acknowledge the new
    /// owner before granting to those that have (C8), ms. Without a bound, one node down
    /// kept the whole shard withheld (nodes kept "healthy" by its empty answers, so none
    /// self-granted) until that node came back.
    #[arg(long, default_value_t = 1_000)]
    takeover_ack_timeout_ms: u64,
    /// mTLS to NATS (B2): the CA to trust (PEM). Setting it requires TLS.
    #[arg(long)]
    nats_ca_file: Option<std::path::PathBuf>,
    /// This worker's certificate and key (PEM); the server maps the certificate to the
    /// fold role, the only one allowed to publish grants (A56).
    #[arg(long, requires = "nats_key_file")]
    nats_cert_file: Option<std::path::PathBuf>,
    #[arg(long, requires = "nats_cert_file")]
    nats_key_file: Option<std::path::PathBuf>,
    /// Address for Prometheus `GET /metrics` (F6); unset serves none. Keep it off the
    /// public network.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let client = foldgate_runtime::nats::connect_options(
        args.nats_ca_file.as_deref(),
        args.nats_cert_file
            .as_deref()
            .zip(args.nats_key_file.as_deref()),
    )
    .connect(&args.nats)
    .await
    .with_context(|| format!("connecting to {}", args.nats))?;
    let clock = foldgate_runtime::system_clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    // SIGTERM too: it is what systemd, Kubernetes and `docker stop` send, and with Ctrl-C
    // alone a deploy never handed the shards back, leaving them unowned for a lease.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("a SIGTERM handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    let stats = Arc::new(FoldWorkerStats::default());
    if let Some(addr) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding --metrics-listen {addr}"))?;
        // Tests pass port 0 and read the bound address from here.
        eprintln!("metrics listening on {}", listener.local_addr()?);
        tokio::spawn(fold_workers::metrics::serve(
            listener,
            Arc::clone(&stats),
            stop.clone(),
        ));
    }
    let (shards, fleet) = (args.shards, args.fleet);
    let standing_permille = args.standing_permille.min(1_000);
    let takeover_ack_timeout_ms = Some(args.takeover_ack_timeout_ms);
    let lease = LeaseConfig {
        ttl: Duration::from_millis(args.lease_ms),
        renew_every: Duration::from_millis((args.lease_ms / 4).max(10)),
        ..LeaseConfig::reference()
    };
    run_elected_worker(
        client,
        Candidate {
            name: args.name,
            shard_count: shards,
            lease,
            policy_bucket: Some(bus_schemas::subjects::POLICY_BUCKET.to_string()),
        },
        move |s| OwnerConfig {
            shards,
            fleet_size: fleet,
            takeover_ack_timeout_ms,
            standing_permille,
            ..OwnerConfig::reference(ShardId(s))
        },
        clock,
        stats,
        stop,
    )
    .await?;
    Ok(())
}
