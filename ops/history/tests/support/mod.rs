//! What the history tests share: the count per key and day both sides are checked on.
#![allow(dead_code)]

use std::path::Path;

use datafusion::arrow::array::{Array, ArrayRef, Int64Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;

pub const COUNT_PER_KEY_AND_DAY: &str = "SELECT key_id, CAST(day AS VARCHAR) AS d, count(*) AS n \
     FROM events GROUP BY key_id, day ORDER BY key_id, d";

/// A string column as plain Utf8: DataFusion may hand strings back as Utf8View.
fn text(c: &ArrayRef) -> StringArray {
    cast(c, &DataType::Utf8)
        .unwrap()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap()
        .clone()
}

/// `key_id,day,events` lines from `foldgate-history`'s SQL, and its warnings.
pub async fn counts_per_key_and_day(root: &Path) -> (Vec<String>, Vec<String>) {
    let (rows, warnings) = foldgate_history::run_sql(root, COUNT_PER_KEY_AND_DAY)
        .await
        .unwrap();
    let mut lines = Vec::new();
    for b in &rows {
        let (k, d) = (text(b.column(0)), text(b.column(1)));
        let n = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
        for i in 0..b.num_rows() {
            lines.push(format!("{},{},{}", k.value(i), d.value(i), n.value(i)));
        }
    }
    (lines, warnings)
}
