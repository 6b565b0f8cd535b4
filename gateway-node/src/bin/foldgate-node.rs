//! `foldgate-node`: the gateway node. `foldgate-node --config node.toml [--set key=value]`.
//! Every knob is in `gateway-node/foldgate-node.example.toml`; `FOLDGATE_NODE_<KEY>`
//! environment variables override the file and `--set` overrides both.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use gateway_node::http::config::ConfigArgs;
use gateway_node::http::node::{NodeGateway, NodeSettings, start_runtime, system_clock};
use gateway_node::http::{init_logging, server};

#[derive(Parser)]
#[command(about = "Foldgate gateway node: authenticate, rate-limit, proxy")]
struct Args {
    #[command(flatten)]
    config: ConfigArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let settings: NodeSettings = args.config.load("FOLDGATE_NODE_")?;
    if args.config.print_config {
        let mut shown = settings.clone();
        if shown.hash_key_hex.is_some() {
            shown.hash_key_hex = Some("<redacted>".into());
        }
        println!("{}", toml::to_string_pretty(&shown)?);
        return Ok(());
    }
    init_logging(&settings.log_format, &settings.log_level);
    // Fail before binding anything if the secret or the fleet shape is wrong.
    settings.hashers()?;
    settings.node_config()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let (stop, shutdown) = tokio::sync::watch::channel(false);
            let clock = system_clock();
            let runtime = start_runtime(&settings, Arc::clone(&clock), shutdown)
                .await
                .context("starting the limiter runtime")?;
            let (node, epoch) = runtime.with_limiter(|l| (l.node(), l.epoch()));
            let events =
                gateway_node::events::start(&settings.events, node, epoch, stop.subscribe())?;
            let mut gateway = NodeGateway::new(&settings, runtime, clock)?;
            let mut pump = None;
            if let Some((queue, task)) = events {
                gateway = gateway.with_events(queue);
                pump = Some(task);
            }
            let gateway = Arc::new(gateway);
            let listeners = settings.server.bind().await?;
            tracing::info!(
                listen = %listeners.0.local_addr()?,
                admin = %listeners.1.local_addr()?,
                upstream = ?settings.upstream.urls,
                bus = if settings.nats_url.is_empty() { "embedded" } else { "nats" },
                limiter = settings.limiter_enabled,
                "foldgate-node started"
            );
            server::run_until_ctrl_c(gateway, settings.server.limits(), listeners, stop).await;
            // The pump saw the same stop: it writes what is left, then ends.
            if let Some(pump) = pump {
                pump.await.context("the limit-event pump")?;
            }
            anyhow::Ok(())
        })
}
