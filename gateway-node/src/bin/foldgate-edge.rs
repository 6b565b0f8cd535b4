//! `foldgate-edge`: the backstop in front of the nodes (D9). `foldgate-edge --config
//! edge.toml [--set key=value]`; `FOLDGATE_EDGE_<KEY>` environment variables override the
//! file. Every knob is in `gateway-node/foldgate-edge.example.toml`.

use std::sync::Arc;

use clap::Parser;
use gateway_node::http::config::ConfigArgs;
use gateway_node::http::edge::{EdgeGuard, EdgeSettings};
use gateway_node::http::{init_logging, server};

#[derive(Parser)]
#[command(about = "Foldgate edge guard: per-key floor and fleet ceiling, outside the limiter")]
struct Args {
    #[command(flatten)]
    config: ConfigArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let settings: EdgeSettings = args.config.load("FOLDGATE_EDGE_")?;
    if args.config.print_config {
        println!("{}", toml::to_string_pretty(&settings)?);
        return Ok(());
    }
    init_logging(&settings.log_format, &settings.log_level);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let edge = Arc::new(EdgeGuard::new(&settings)?);
            let (stop, _) = tokio::sync::watch::channel(false);
            let listeners = settings.server.bind().await?;
            tracing::info!(
                listen = %listeners.0.local_addr()?,
                admin = %listeners.1.local_addr()?,
                nodes = settings.upstream.urls.len(),
                key_floor_per_s = settings.key_floor_per_s,
                ceiling_share_per_s = settings.ceiling_share_per_s(),
                "foldgate-edge started"
            );
            server::run_until_ctrl_c(edge, settings.server.limits(), listeners, stop).await;
            anyhow::Ok(())
        })
}
