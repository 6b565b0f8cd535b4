//! SQL over the limit-event archive with DataFusion (E4). Each table is the archive's
//! finished files of that kind, each checked first: a file whose footer or schema does not
//! read (corrupt, truncated, foreign) is left out and named in a warning, so one bad file
//! never hides the rest of the history. DataFusion then reads the files itself, with
//! row-group pruning on their statistics.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
use datafusion::prelude::SessionContext;
use foldgate_archive::encoder::{rollup_schema, schema};
use foldgate_archive::reader::{DayRange, list_files};
use foldgate_archive::{ArchiveError, ArchiveLayout};

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("sql: {0}")]
    DataFusion(#[from] datafusion::error::DataFusionError),
}

/// Runs `sql` over the archive at `root`; returns its rows and a warning per skipped file.
pub async fn run_sql(
    root: &Path,
    sql: &str,
) -> Result<(Vec<RecordBatch>, Vec<String>), HistoryError> {
    let ctx = SessionContext::new();
    let layout = ArchiveLayout::new(root);
    let mut warnings = Vec::new();
    register(
        &ctx,
        "events",
        &layout.events_dir(),
        schema(),
        &mut warnings,
    )
    .await?;
    register(
        &ctx,
        "rollup",
        &layout.rollup_dir(),
        rollup_schema(),
        &mut warnings,
    )
    .await?;
    let rows = ctx.sql(sql).await?.collect().await?;
    Ok((rows, warnings))
}

async fn register(
    ctx: &SessionContext,
    name: &str,
    dir: &Path,
    schema: SchemaRef,
    warnings: &mut Vec<String>,
) -> Result<(), HistoryError> {
    let mut urls = Vec::new();
    for path in list_files(dir, DayRange::default())? {
        match check(&path, &schema) {
            Ok(()) => urls.push(ListingTableUrl::parse(path.to_string_lossy())?),
            Err(why) => warnings.push(format!("{}: {why}; skipped", path.display())),
        }
    }
    if urls.is_empty() {
        // An archive with no file of this kind yet still has the table, empty.
        ctx.register_table(name, Arc::new(MemTable::try_new(schema, vec![vec![]])?))?;
        return Ok(());
    }
    let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
        .with_file_extension(foldgate_archive::service::PARQUET_SUFFIX);
    let config = ListingTableConfig::new_with_multi_paths(urls)
        .with_listing_options(options)
        .with_schema(schema);
    ctx.register_table(name, Arc::new(ListingTable::try_new(config)?))?;
    Ok(())
}

/// Whether a file's footer reads and its columns are the table's.
fn check(path: &Path, expected: &SchemaRef) -> Result<(), String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let reader = SerializedFileReader::new(file).map_err(|e| format!("unreadable ({e})"))?;
    let meta = reader.metadata().file_metadata();
    let arrow = datafusion::parquet::arrow::parquet_to_arrow_schema(
        meta.schema_descr(),
        meta.key_value_metadata(),
    )
    .map_err(|e| format!("unreadable schema ({e})"))?;
    if arrow.fields() != expected.fields() {
        return Err("not the archive's schema".into());
    }
    Ok(())
}
