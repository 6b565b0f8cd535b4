//! `foldgate-archiver`: settings from a TOML file (`--config`) and flags (a flag wins), then
//! the consume loop until SIGTERM or SIGINT, after which open files are written and
//! committed. Exit status 0 on a clean stop, 1 when the archive could not be written
//! (nothing uncommitted is lost: a restart resumes after the last renamed file).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use foldgate_archiver::{Archiver, ArchiverConfig, StopWhen};

#[derive(Parser, Debug)]
#[command(
    name = "foldgate-archiver",
    about = "Archive limit events from Kafka into Parquet, exactly once"
)]
struct Args {
    /// TOML settings (the same names as the flags, with `_`; a `[kafka]` table for
    /// librdkafka properties).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Kafka bootstrap servers, host:port[,host:port...].
    #[arg(long)]
    brokers: Option<String>,
    #[arg(long)]
    group_id: Option<String>,
    #[arg(long)]
    topic: Option<String>,
    /// The archive root (files go under events/day=YYYY-MM-DD/ and quarantine/).
    #[arg(long)]
    archive_dir: Option<PathBuf>,
    /// Close a partition's file at this many events...
    #[arg(long)]
    file_events_max: Option<usize>,
    /// ... or this many payload bytes...
    #[arg(long)]
    file_bytes_max: Option<usize>,
    /// ... or when its first message has waited this many ms.
    #[arg(long)]
    file_age_max_ms: Option<u64>,
    /// Event ids remembered per partition for de-duplication.
    #[arg(long)]
    dedupe_window: Option<usize>,
    #[arg(long)]
    stats_interval_ms: Option<u64>,
    /// Rewrite Prometheus text here every stats interval (node_exporter textfile format).
    #[arg(long)]
    metrics_file: Option<PathBuf>,
    /// A librdkafka property, KEY=VALUE (TLS, SASL, timeouts); repeatable.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    kafka: Vec<String>,
    /// Exit (status 0) once every assigned partition is read to its end and written.
    #[arg(long)]
    until_caught_up: bool,
    /// Log format: json or text.
    #[arg(long, default_value = "json")]
    log_format: String,
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Crash drills only: sleep this long between a flush's renames and its commit.
    #[arg(long, hide = true, default_value_t = 0)]
    test_pace_ms: u64,
}

fn settings(args: &Args) -> anyhow::Result<ArchiverConfig> {
    let mut c = match &args.config {
        Some(path) => ArchiverConfig::from_toml_file(path)?,
        None => ArchiverConfig::default(),
    };
    macro_rules! take {
        ($($field:ident),*) => { $( if let Some(v) = &args.$field { c.$field = v.clone(); } )* };
    }
    take!(
        brokers,
        group_id,
        topic,
        archive_dir,
        file_events_max,
        file_bytes_max,
        file_age_max_ms,
        dedupe_window,
        stats_interval_ms
    );
    if args.metrics_file.is_some() {
        c.metrics_file = args.metrics_file.clone();
    }
    for kv in &args.kafka {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("-X {kv}: expected KEY=VALUE");
        };
        c.kafka.insert(k.trim().to_string(), v.trim().to_string());
    }
    c.validate()?;
    Ok(c)
}

/// The gateway's `init_logging`, repeated: calling it would link the whole gateway into
/// the archiver for nine lines.
fn init_logging(format: &str, level: &str) {
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

/// SIGTERM and SIGINT set `stop`; a second one exits at once.
fn watch_signals(stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("signal runtime")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut term), Ok(mut int)) = (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                ) else {
                    return;
                };
                for _ in 0..2 {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                    if stop.swap(true, Ordering::Relaxed) {
                        std::process::exit(130);
                    }
                    tracing::info!("stopping: writing open files");
                }
            });
        })
        .context("signal thread")?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(&args.log_format, &args.log_level);
    let config = settings(&args)?;
    let archiver = Archiver::new(config)?
        .stop_when(if args.until_caught_up {
            StopWhen::CaughtUp
        } else {
            StopWhen::Stopped
        })
        .pace(Duration::from_millis(args.test_pace_ms));
    watch_signals(archiver.stop_flag())?;
    archiver.run()?;
    Ok(())
}
