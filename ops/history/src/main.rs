//! `foldgate-history`: SQL over the limit-event archive (E4), tables `events` and
//! `rollup`. `foldgate history --sql` runs this binary; it is built on its own (`cargo
//! build --release -p foldgate-history`) so that no other binary links DataFusion.

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use foldgate_archive::output::{self, Format};

#[derive(Parser)]
#[command(
    name = "foldgate-history",
    about = "SQL over a Foldgate limit-event archive (tables `events` and `rollup`)"
)]
struct Args {
    /// The archive's root (`events/`, `rollup/` under it).
    #[arg(long)]
    archive: PathBuf,
    /// The query, e.g. "SELECT key_id, count(*) FROM events GROUP BY key_id".
    #[arg(long)]
    sql: String,
    /// table, csv or json (one object a line).
    #[arg(long, default_value = "table")]
    format: Format,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (batches, warnings) = rt.block_on(foldgate_history::run_sql(&args.archive, &args.sql))?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    output::write(&mut std::io::stdout().lock(), args.format, &batches)?;
    Ok(())
}
