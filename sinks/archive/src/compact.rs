//! Compaction of a closed day (E3): every file of `events/day=D/` merged into one file,
//! de-duplicated by event id and sorted by key id (then time, then event id), in small
//! row groups so that a subject lookup reads a few groups and prunes the rest.
//!
//! Crash safety. The output is written under a temporary name, fsynced and renamed
//! (`service::AtomicParquet`); its footer lists the inputs it absorbed (key
//! [`ABSORBED_KEY`], archive-relative names). Only then are the inputs removed. A crash
//! before the rename leaves the inputs (and a temporary file no reader opens); a crash
//! after it leaves the output plus inputs that the output names as absorbed: readers skip
//! those ([`absorbed_in_day`], used by `reader::list_files`) and the next run removes them.
//! A file that arrives later (a late partition) is not in the list, so it stays and is
//! merged by the next compaction, with the previous output as one more input; event ids
//! are de-duplicated across all inputs, so a replayed range is not counted twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{
    SortColumn, concat_batches, filter_record_batch, lexsort_to_indices, take_record_batch,
};
use arrow::datatypes::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::ArchiveError;
use crate::config::ArchiveLayout;
use crate::encoder::{day_of, schema};
use crate::service::{AtomicParquet, PARQUET_SUFFIX, TEMP_SUFFIX, compacted_properties, sync_dir};

/// Footer key of a merge output (compacted day or roll-up): a JSON array of the
/// archive-relative names of the files it holds the rows of.
pub const ABSORBED_KEY: &str = "foldgate.absorbed";
/// Compacted day files are `compacted-g<generation>.parquet`.
pub const COMPACTED_PREFIX: &str = "compacted-g";
/// Roll-up files are `rollup-g<generation>.parquet`.
pub const ROLLUP_PREFIX: &str = "rollup-g";

/// Above this many rows a day is sorted in buckets on disk rather than in memory: a day at
/// the design's peak (43.2 M rows) would need several GB as Arrow arrays.
pub const IN_MEMORY_ROWS_MAX: u64 = 2 * 1024 * 1024;

/// What one compaction did.
#[derive(Debug, Default)]
pub struct CompactReport {
    pub day: i32,
    /// Files merged (including a previous compacted file).
    pub inputs: usize,
    pub rows_in: u64,
    /// `rows_in` less duplicate event ids.
    pub rows_out: u64,
    pub output: Option<PathBuf>,
    /// Files left in place because they do not read as the archive's schema.
    pub warnings: Vec<String>,
}

/// Today, as days since the Unix epoch (UTC).
pub fn today() -> i32 {
    day_of(chrono::Utc::now().timestamp_millis().max(0) as u64)
}

/// `events/day=D/x.parquet` for `root/events/day=D/x.parquet`.
pub fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

/// The day of a `day=YYYY-MM-DD` directory name.
pub fn parse_day_dir(name: &str) -> Option<i32> {
    let text = name.strip_prefix("day=")?;
    let d = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)?;
    i32::try_from((d - epoch).num_days()).ok()
}

/// The days that have a partition under `table`, in order.
pub fn days_in(table: &Path) -> Vec<i32> {
    let mut days: Vec<i32> = fs::read_dir(table)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| parse_day_dir(&e.file_name().to_string_lossy()))
        .collect();
    days.sort_unstable();
    days
}

/// Every finished Parquet file directly in `dir`, absorbed or not, in name order.
pub fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(PARQUET_SUFFIX) && !n.ends_with(TEMP_SUFFIX)
        })
        .collect();
    files.sort();
    files
}

fn is_output(path: &Path) -> bool {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    name.starts_with(COMPACTED_PREFIX) || name.starts_with(ROLLUP_PREFIX)
}

/// The archive-relative names a merge output's footer lists, or none.
pub fn absorbed_by(path: &Path) -> Vec<String> {
    let Ok(file) = File::open(path) else {
        return Vec::new();
    };
    let Ok(reader) = SerializedFileReader::new(file) else {
        return Vec::new();
    };
    reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .into_iter()
        .flatten()
        .filter(|kv| kv.key == ABSORBED_KEY)
        .filter_map(|kv| kv.value.as_deref())
        .filter_map(|v| serde_json::from_str::<Vec<String>>(v).ok())
        .flatten()
        .collect()
}

/// Every file of day partition `day_dir_name` (in `events/` or `rollup/`) that a merge
/// output of that day already holds: readers skip them, maintenance removes them.
pub fn absorbed_in_day(root: &Path, day_dir_name: &str) -> HashSet<String> {
    let layout = ArchiveLayout::new(root);
    let mut out = HashSet::new();
    for table in [layout.events_dir(), layout.rollup_dir()] {
        for f in parquet_files(&table.join(day_dir_name)) {
            if is_output(&f) {
                out.extend(absorbed_by(&f));
            }
        }
    }
    out
}

/// Finishes what a crashed merge of `day` left: removes inputs its outputs absorbed, and
/// the merge's own temporary files. Returns how many files went.
pub fn recover_day(layout: &ArchiveLayout, day: i32) -> Result<usize, ArchiveError> {
    let name = day_dir_name(day);
    let absorbed = absorbed_in_day(&layout.root, &name);
    let mut removed = 0;
    for table in [layout.events_dir(), layout.rollup_dir()] {
        let dir = table.join(&name);
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            let file = entry.file_name().to_string_lossy().into_owned();
            let own_temp = file.ends_with(TEMP_SUFFIX)
                && (file.starts_with(COMPACTED_PREFIX) || file.starts_with(ROLLUP_PREFIX));
            if own_temp || absorbed.contains(&relative(&layout.root, &path)) {
                fs::remove_file(&path).map_err(|e| ArchiveError::io(&path, e))?;
                removed += 1;
            }
        }
        if removed > 0 {
            sync_dir(&dir)?;
        }
    }
    Ok(removed)
}

pub fn day_dir_name(day: i32) -> String {
    format!("day={}", crate::encoder::day_text(day))
}

/// The next free generation of `prefix` in `dir` (a day partition under `root`): above
/// every file there and every name a merge output of the day lists as absorbed, so a new
/// output never takes the name of one a later output already counted (whose leftover
/// would then be removed as absorbed).
pub fn next_generation(root: &Path, dir: &Path, prefix: &str) -> u32 {
    let generation = |name: &str| -> Option<u32> {
        name.strip_prefix(prefix)?
            .strip_suffix(PARQUET_SUFFIX)?
            .parse::<u32>()
            .ok()
    };
    let day_name = dir.file_name().unwrap_or_default().to_string_lossy();
    let listed = absorbed_in_day(root, &day_name);
    parquet_files(dir)
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .chain(
            listed
                .iter()
                .filter_map(|rel| Path::new(rel).file_name())
                .map(|n| n.to_string_lossy().into_owned()),
        )
        .filter_map(|n| generation(&n))
        .max()
        .map_or(1, |g| g + 1)
}

/// The file's reader if it is Parquet of `expected`'s columns, else why not.
pub fn open_checked(
    path: &Path,
    expected: &SchemaRef,
) -> Result<ParquetRecordBatchReaderBuilder<File>, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let b =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| format!("unreadable ({e})"))?;
    if b.schema().fields() != expected.fields() {
        return Err("not the archive's schema".into());
    }
    Ok(b)
}

/// Sorts by key id, time and event id, and drops repeated event ids (a replayed event is
/// the same row, so its copies sort next to each other).
pub fn sort_dedupe(b: &RecordBatch) -> Result<RecordBatch, ArchiveError> {
    if b.num_rows() == 0 {
        return Ok(b.clone());
    }
    let col = |n: &'static str| -> Result<ArrayRef, ArchiveError> {
        b.column_by_name(n).cloned().ok_or(ArchiveError::Schema(n))
    };
    let sort = [col("key_id")?, col("at")?, col("event_id")?].map(|values| SortColumn {
        values,
        options: None,
    });
    let sorted = take_record_batch(b, &lexsort_to_indices(&sort, None)?)?;
    let ids = sorted
        .column_by_name("event_id")
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or(ArchiveError::Schema("event_id"))?;
    let keep: BooleanArray = (0..ids.len())
        .map(|i| Some(i == 0 || ids.value(i) != ids.value(i - 1)))
        .collect();
    Ok(filter_record_batch(&sorted, &keep)?)
}

/// Compacts day `day` of `layout`'s events into one key-sorted file. `progress` hears
/// (rows done, rows to do) as the work goes. Refuses today's (or a later) day: other
/// writers are still adding files to it.
pub fn compact_day(
    layout: &ArchiveLayout,
    day: i32,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CompactReport, ArchiveError> {
    compact_day_bounded(layout, day, IN_MEMORY_ROWS_MAX, progress)
}

/// [`compact_day`], sorting in memory only up to `in_memory_rows_max` rows (tests take the
/// on-disk bucket path with a small bound).
pub fn compact_day_bounded(
    layout: &ArchiveLayout,
    day: i32,
    in_memory_rows_max: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CompactReport, ArchiveError> {
    if day >= today() {
        return Err(ArchiveError::OpenDay(crate::encoder::day_text(day)));
    }
    let mut report = CompactReport {
        day,
        ..CompactReport::default()
    };
    let dir = ArchiveLayout::day_dir(&layout.events_dir(), day);
    if !dir.is_dir() {
        return Ok(report);
    }
    recover_day(layout, day)?;
    let expected = schema();
    let mut inputs = Vec::new();
    for path in parquet_files(&dir) {
        match open_checked(&path, &expected) {
            Ok(b) => inputs.push((path, b)),
            Err(why) => report
                .warnings
                .push(format!("{}: {why}; left in place", path.display())),
        }
    }
    let already = inputs.len() == 1 && is_output(&inputs[0].0);
    if inputs.is_empty() || already {
        return Ok(report);
    }
    report.inputs = inputs.len();
    report.rows_in = inputs
        .iter()
        .map(|(_, b)| b.metadata().file_metadata().num_rows().max(0) as u64)
        .sum();
    let absorbed: Vec<String> = inputs
        .iter()
        .map(|(p, _)| relative(&layout.root, p))
        .collect();
    let name = format!(
        "{COMPACTED_PREFIX}{:06}{PARQUET_SUFFIX}",
        next_generation(&layout.root, &dir, COMPACTED_PREFIX)
    );
    let mut out = AtomicParquet::create(
        &dir,
        &name,
        expected.clone(),
        compacted_properties(),
        &[(
            ABSORBED_KEY,
            serde_json::to_string(&absorbed).expect("strings serialise"),
        )],
    )?;
    let builders: Vec<_> = inputs.into_iter().map(|(_, b)| b).collect();
    if report.rows_in <= in_memory_rows_max {
        let mut batches = Vec::new();
        for b in builders {
            for batch in b.build()? {
                batches.push(batch?);
            }
        }
        let all = concat_batches(&expected, &batches)?;
        progress(report.rows_in / 2, report.rows_in);
        write_sorted(&mut out, &sort_dedupe(&all)?)?;
        progress(report.rows_in, report.rows_in);
    } else {
        let scratch = layout.scratch_dir().join(format!("compact-{day}"));
        let _ = fs::remove_dir_all(&scratch);
        let result = bucket_sort(&scratch, builders, &expected, &mut out, &mut |done| {
            progress(done, report.rows_in * 2)
        });
        let _ = fs::remove_dir_all(&scratch);
        result?;
    }
    report.rows_out = out.rows();
    let output = out.commit()?;
    // The output is durable and lists its inputs: removing them now cannot lose a row.
    for rel in &absorbed {
        let p = layout.root.join(rel);
        fs::remove_file(&p).map_err(|e| ArchiveError::io(&p, e))?;
    }
    sync_dir(&dir)?;
    report.output = Some(output);
    Ok(report)
}

fn write_sorted(out: &mut AtomicParquet, b: &RecordBatch) -> Result<(), ArchiveError> {
    let step = crate::service::COMPACTED_ROW_GROUP_ROWS;
    let mut at = 0;
    while at < b.num_rows() {
        let n = step.min(b.num_rows() - at);
        out.write(&b.slice(at, n))?;
        at += n;
    }
    Ok(())
}

/// The bucket of a key id: its version and first two hex digits (`v1:3f`). Buckets in
/// text order hold key ids in text order, and a key id's copies share one bucket.
fn bucket_of(key_id: &str) -> &str {
    match key_id.find(':') {
        Some(colon) => key_id.get(..colon + 3).unwrap_or(key_id),
        None => key_id,
    }
}

/// Rows a bucket writer holds before it writes them out: a writer keeps its open row
/// group in memory, so with up to 256 buckets per hash version this bounds pass 1 to about
/// 2 M rows in memory (the archive's 128 Ki-row groups measured 6.2 GB of RSS at 43.2 M).
const SCRATCH_ROW_GROUP_ROWS: usize = 8 * 1024;
/// Rows read at a time in pass 1.
const SPLIT_BATCH_ROWS: usize = 64 * 1024;

/// Scratch buckets are read once and deleted: fast zstd, small row groups.
fn scratch_properties() -> parquet::file::properties::WriterProperties {
    parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(
            parquet::basic::ZstdLevel::try_new(1).expect("1 is in range"),
        ))
        .set_max_row_group_row_count(Some(SCRATCH_ROW_GROUP_ROWS))
        .build()
}

/// Pass 1 spreads the rows over buckets on disk by key-id prefix; pass 2 sorts each
/// bucket in memory and appends it to `out`, bucket after bucket in key order.
fn bucket_sort(
    scratch: &Path,
    builders: Vec<ParquetRecordBatchReaderBuilder<File>>,
    schema: &SchemaRef,
    out: &mut AtomicParquet,
    progress: &mut dyn FnMut(u64),
) -> Result<(), ArchiveError> {
    fs::create_dir_all(scratch).map_err(|e| ArchiveError::io(scratch, e))?;
    let mut buckets: BTreeMap<String, (PathBuf, ArrowWriter<File>)> = BTreeMap::new();
    let mut done = 0u64;
    for b in builders {
        // Big batches: each is split over up to 256 buckets, and a split of a few rows
        // per bucket costs more than the rows.
        for batch in b.with_batch_size(SPLIT_BATCH_ROWS).build()? {
            let batch = batch?;
            let keys = crate::encoder::key_ids(&batch)?;
            let mut rows: HashMap<&str, Vec<u32>> = HashMap::new();
            for i in 0..keys.len() {
                rows.entry(bucket_of(keys.value(i)))
                    .or_default()
                    .push(i as u32);
            }
            for (bucket, idx) in rows {
                let part = take_record_batch(&batch, &UInt32Array::from(idx))?;
                if !buckets.contains_key(bucket) {
                    let path = scratch.join(format!("b{}.parquet", buckets.len()));
                    let file = File::create(&path).map_err(|e| ArchiveError::io(&path, e))?;
                    let w = ArrowWriter::try_new(file, schema.clone(), Some(scratch_properties()))?;
                    buckets.insert(bucket.to_string(), (path, w));
                }
                let (_, w) = buckets.get_mut(bucket).expect("just inserted");
                w.write(&part)?;
            }
            done += batch.num_rows() as u64;
            progress(done);
        }
    }
    let mut paths = Vec::with_capacity(buckets.len());
    for (_, (path, w)) in buckets {
        w.close()?;
        paths.push(path);
    }
    for path in paths {
        let file = File::open(&path).map_err(|e| ArchiveError::io(&path, e))?;
        let batches = ParquetRecordBatchReaderBuilder::try_new(file)?
            .build()?
            .collect::<Result<Vec<_>, _>>()?;
        let all = concat_batches(schema, &batches)?;
        done += all.num_rows() as u64;
        write_sorted(out, &sort_dedupe(&all)?)?;
        fs::remove_file(&path).map_err(|e| ArchiveError::io(&path, e))?;
        progress(done);
    }
    Ok(())
}

/// Compacts every closed day (before `today`) that is not one compacted file yet.
pub fn compact_closed_days(
    layout: &ArchiveLayout,
    today: i32,
    progress: &mut dyn FnMut(i32, u64, u64),
) -> Result<Vec<CompactReport>, ArchiveError> {
    let mut reports = Vec::new();
    for day in days_in(&layout.events_dir()) {
        if day >= today {
            continue;
        }
        reports.push(compact_day(layout, day, &mut |d, t| progress(day, d, t))?);
    }
    Ok(reports)
}
