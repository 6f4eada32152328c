//! Writer settings chosen per file from its rows:
//!
//! - a file of less than [`UNCOMPRESSED_BELOW`] bytes of Arrow data (a window's partial rows, a
//!   few dead letters) is written uncompressed: setting up a compressor per column costs more
//!   than it saves there, and compaction rewrites such files;
//! - a column whose first [`SAMPLE`] values are mostly distinct (order ids, Kafka offsets and
//!   timestamps, amounts) is written without a dictionary: a dictionary of unique values is
//!   larger than the values written plainly, and building it (hashing every value) was a fifth
//!   of Parquet encoding. Columns that repeat (countries, currencies, statuses) keep theirs.

use std::collections::HashSet;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

/// Files with less Arrow data than this (bytes) are written uncompressed.
pub const UNCOMPRESSED_BELOW: usize = 64 * 1024;

/// How many leading values of a column decide whether it keeps a dictionary.
pub const SAMPLE: usize = 512;

/// Fewer sampled values than this: the column keeps its dictionary (too few to tell).
const MIN_SAMPLE: usize = 64;

/// `props` as they suit a file of `rows`; `None` when they suit it unchanged.
pub fn for_file(props: &WriterProperties, rows: &RecordBatch) -> Option<WriterProperties> {
    let small = rows.get_array_memory_size() < UNCOMPRESSED_BELOW;
    let plain = mostly_distinct(rows);
    if !small && plain.is_empty() {
        return None;
    }
    let mut b = props.clone().into_builder();
    if small {
        b = b.set_compression(Compression::UNCOMPRESSED);
    }
    for name in plain {
        b = b.set_column_dictionary_enabled(ColumnPath::from(name), false);
    }
    Some(b.build())
}

/// The top-level columns of `rows` whose sampled non-NULL values are more than three quarters
/// distinct.
fn mostly_distinct(rows: &RecordBatch) -> Vec<String> {
    let n = rows.num_rows().min(SAMPLE);
    if n < MIN_SAMPLE {
        return Vec::new();
    }
    rows.schema()
        .fields()
        .iter()
        .zip(rows.columns())
        .filter(|(_, c)| {
            distinct(c.as_ref(), n)
                .is_some_and(|(d, valid)| valid >= MIN_SAMPLE && d * 4 > valid * 3)
        })
        .map(|(f, _)| f.name().clone())
        .collect()
}

/// (distinct, non-NULL) among the first `n` values of `c`; `None` for a type not sampled.
fn distinct(c: &dyn Array, n: usize) -> Option<(usize, usize)> {
    fn count<T: std::hash::Hash + Eq>(values: impl Iterator<Item = Option<T>>) -> (usize, usize) {
        let mut seen: HashSet<T, foldhash::fast::RandomState> = HashSet::default();
        let mut valid = 0;
        for v in values.flatten() {
            valid += 1;
            seen.insert(v);
        }
        (seen.len(), valid)
    }
    Some(match c.data_type() {
        DataType::Utf8 => count(c.as_string::<i32>().iter().take(n)),
        DataType::LargeUtf8 => count(c.as_string::<i64>().iter().take(n)),
        DataType::Binary => count(c.as_binary::<i32>().iter().take(n)),
        DataType::LargeBinary => count(c.as_binary::<i64>().iter().take(n)),
        DataType::Int32 => count(c.as_primitive::<Int32Type>().iter().take(n)),
        DataType::Int64 => count(c.as_primitive::<Int64Type>().iter().take(n)),
        DataType::Date32 => count(c.as_primitive::<Date32Type>().iter().take(n)),
        DataType::Timestamp(_, _) => count(
            c.as_primitive_opt::<TimestampMicrosecondType>()?
                .iter()
                .take(n),
        ),
        DataType::Decimal128(_, _) => count(c.as_primitive::<Decimal128Type>().iter().take(n)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    fn rows(n: usize) -> RecordBatch {
        let ids: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| format!("ord-{i:010}")),
        ));
        let countries: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| ["DE", "FR", "NL"][i % 3]),
        ));
        let offsets: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
        let sparse: ArrayRef = Arc::new(Int64Array::from_iter(
            (0..n).map(|i| (i % 100 == 0).then_some(i as i64)),
        ));
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("order_id", DataType::Utf8, false),
                Field::new("country", DataType::Utf8, false),
                Field::new("kafka_offset", DataType::Int64, false),
                Field::new("sparse", DataType::Int64, true),
            ])),
            vec![ids, countries, offsets, sparse],
        )
        .unwrap()
    }

    #[test]
    fn distinct_columns_go_plain_and_repeating_ones_keep_their_dictionary() {
        assert_eq!(
            mostly_distinct(&rows(5_000)),
            vec!["order_id", "kafka_offset"]
        );
        // Too few rows (or too few non-NULL values: `sparse`) to tell.
        assert!(mostly_distinct(&rows(10)).is_empty());
        let props = WriterProperties::builder().build();
        let tuned = for_file(&props, &rows(5_000)).expect("tuned");
        let enabled = |c: &str| tuned.dictionary_enabled(&ColumnPath::from(c));
        assert!(!enabled("order_id") && !enabled("kafka_offset"));
        assert!(enabled("country") && enabled("sparse"));
    }

    #[test]
    fn small_files_are_uncompressed() {
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        let tuned = for_file(&props, &rows(10)).expect("tuned");
        assert_eq!(
            tuned.compression(&ColumnPath::from("order_id")),
            Compression::UNCOMPRESSED
        );
        let large = for_file(&props, &rows(50_000)).expect("tuned: distinct columns");
        assert_eq!(
            large.compression(&ColumnPath::from("order_id")),
            Compression::SNAPPY
        );
    }
}
