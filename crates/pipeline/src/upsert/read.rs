//! What the upsert commit reads of a data file (its rows' keys and Kafka positions, nothing
//! else: column pruning by field id) and of a position delete file.

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_row::{RowConverter, SortField};
use arrow_schema::DataType;
use futures::TryStreamExt;
use iceberg::table::Table;
use parquet::arrow::ProjectionMask;

use crate::error::{Error, Result};

/// Field id of a position delete file's `file_path` column (Iceberg spec, reserved).
pub const DELETE_FILE_PATH_ID: i32 = 2_147_483_546;
/// Field id of a position delete file's `pos` column (Iceberg spec, reserved).
pub const DELETE_POS_ID: i32 = 2_147_483_545;

const FIELD_ID: &str = "PARQUET:field_id";
/// Rows decoded per batch.
const BATCH_ROWS: usize = 64 * 1024;

/// One row of a data file as the upsert commit sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedRow {
    /// The 128-bit hash of the row's primary key ([`key_hashes`]).
    pub key: u128,
    /// The row's position in its file (0-based, the position a position delete names).
    pub pos: u64,
    /// `kafka_partition`.
    pub partition: i32,
    /// `kafka_offset`.
    pub offset: i64,
    /// `kafka_timestamp`, microseconds (ties between partitions).
    pub timestamp: i64,
}

/// The field ids the upsert commit reads: the key's columns, then the Kafka position.
#[derive(Debug, Clone)]
pub struct KeyColumns {
    /// The primary key's field ids, in key order.
    pub key: Vec<i32>,
    /// `kafka_partition`, `kafka_offset`, `kafka_timestamp`.
    pub partition: i32,
    /// See [`KeyColumns::partition`].
    pub offset: i32,
    /// See [`KeyColumns::partition`].
    pub timestamp: i32,
}

impl KeyColumns {
    /// The ids of `key` and of the Kafka columns in the table's current schema.
    pub fn of(table: &Table, key: &[String]) -> Result<KeyColumns> {
        let schema = table.metadata().current_schema();
        let id = |name: &str| {
            schema.field_by_name(name).map(|f| f.id).ok_or_else(|| {
                Error::Config(format!(
                    "table {}: the upsert key needs column {name:?}, which the table does not have",
                    table.identifier()
                ))
            })
        };
        Ok(KeyColumns {
            key: key.iter().map(|k| id(k)).collect::<Result<_>>()?,
            partition: id(crate::kafka::PARTITION)?,
            offset: id(crate::kafka::OFFSET)?,
            timestamp: id(crate::kafka::TIMESTAMP)?,
        })
    }
}

/// Every row of the data file at `path`, in file order, with its key hash and Kafka position.
pub async fn keyed_rows(
    table: &Table,
    path: &str,
    size: u64,
    columns: &KeyColumns,
) -> Result<Vec<KeyedRow>> {
    keyed(table, path, size, columns, false).await
}

/// [`keyed_rows`] of a key delete file, which must hold every key and Kafka column: one
/// without them (written before the key changed) would delete nothing, so it is refused.
pub async fn keyed_rows_complete(
    table: &Table,
    path: &str,
    size: u64,
    columns: &KeyColumns,
) -> Result<Vec<KeyedRow>> {
    keyed(table, path, size, columns, true).await
}

async fn keyed(
    table: &Table,
    path: &str,
    size: u64,
    columns: &KeyColumns,
    complete: bool,
) -> Result<Vec<KeyedRow>> {
    let mut ids = columns.key.clone();
    ids.extend([columns.partition, columns.offset, columns.timestamp]);
    let batches = read_columns(table, path, size, &ids).await?;
    let n = columns.key.len();
    // A data file without a key column (written before the column was the key: a derived
    // table's new column) would read as a NULL key for all its rows, deleting all but one.
    if let Some((_, found)) = batches
        .iter()
        .find(|(_, found)| found[..n].iter().any(Option::is_none))
    {
        let missing: Vec<i32> = ids[..n]
            .iter()
            .zip(found)
            .filter(|(_, f)| f.is_none())
            .map(|(id, _)| *id)
            .collect();
        return Err(Error::Config(format!(
            "table {}: {} {path} lacks the primary_key columns of field ids {missing:?} (it was written before they were the key): its rows cannot be keyed; restore the earlier primary_key, or give the upsert table a new name so that it starts empty",
            table.identifier(),
            if complete {
                "key delete file"
            } else {
                "data file"
            }
        )));
    }
    if complete
        && let Some((_, found)) = batches
            .iter()
            .find(|(_, found)| found.iter().any(Option::is_none))
    {
        let missing: Vec<i32> = ids
            .iter()
            .zip(found)
            .filter(|(_, f)| f.is_none())
            .map(|(id, _)| *id)
            .collect();
        return Err(Error::Config(format!(
            "table {}: key delete file {path} lacks the columns of field ids {missing:?}: it was written for another primary_key; restore the key until its batch is committed",
            table.identifier()
        )));
    }
    let mut out = Vec::new();
    let mut pos = 0u64;
    for (batch, found) in batches {
        let rows = batch.num_rows();
        let key_arrays: Vec<Option<ArrayRef>> = found[..n]
            .iter()
            .map(|i| i.map(|i| batch.column(i).clone()))
            .collect();
        let hashes = key_hashes(&key_arrays, rows)
            .map_err(|e| Error::Internal(format!("keys of {path}: {e}")))?;
        let column = |slot: usize| found[slot].map(|i| batch.column(i).clone());
        let partitions = integers(column(n), rows, path, "kafka_partition")?;
        let offsets = integers(column(n + 1), rows, path, "kafka_offset")?;
        let timestamps = integers(column(n + 2), rows, path, "kafka_timestamp")?;
        for r in 0..rows {
            out.push(KeyedRow {
                key: hashes[r],
                pos,
                partition: i32::try_from(partitions[r]).unwrap_or(i32::MAX),
                offset: offsets[r],
                timestamp: timestamps[r],
            });
            pos += 1;
        }
    }
    Ok(out)
}

/// A Kafka column's values as 64-bit integers (timestamps as their microseconds); zeros for a
/// file without the column, a null as 0.
fn integers(array: Option<ArrayRef>, rows: usize, path: &str, what: &str) -> Result<Vec<i64>> {
    let Some(array) = array else {
        return Ok(vec![0; rows]);
    };
    let cast = arrow_cast::cast(&array, &DataType::Int64)
        .map_err(|e| Error::Internal(format!("{path}: {what}: {e}")))?;
    let values = cast
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| Error::Internal(format!("{path}: {what} is not an integer column")))?;
    Ok((0..rows)
        .map(|r| {
            if values.is_null(r) {
                0
            } else {
                values.value(r)
            }
        })
        .collect())
}

/// The (data file path, position) pairs of the position delete file at `path`.
pub async fn position_deletes(table: &Table, path: &str, size: u64) -> Result<Vec<(String, u64)>> {
    let batches = read_columns(table, path, size, &[DELETE_FILE_PATH_ID, DELETE_POS_ID]).await?;
    let mut out = Vec::new();
    for (batch, found) in batches {
        let (Some(p), Some(q)) = (found[0], found[1]) else {
            return Err(Error::Internal(format!(
                "position delete file {path} lacks file_path or pos"
            )));
        };
        let paths = arrow_cast::cast(batch.column(p), &DataType::Utf8)
            .map_err(|e| Error::Internal(format!("{path}: file_path: {e}")))?;
        let positions = arrow_cast::cast(batch.column(q), &DataType::Int64)
            .map_err(|e| Error::Internal(format!("{path}: pos: {e}")))?;
        let (Some(paths), Some(positions)) = (
            paths.as_any().downcast_ref::<StringArray>(),
            positions.as_any().downcast_ref::<Int64Array>(),
        ) else {
            return Err(Error::Internal(format!("{path}: unexpected column types")));
        };
        for r in 0..batch.num_rows() {
            if paths.is_null(r) || positions.is_null(r) || positions.value(r) < 0 {
                continue;
            }
            out.push((paths.value(r).to_string(), positions.value(r) as u64));
        }
    }
    Ok(out)
}

/// The 128-bit hash (xxh3) of each row's key: the key's columns in Arrow's row format, with
/// integers read as 64-bit and decimals at precision 38 (so that a widened column hashes as
/// before). A column missing from the file (added later) is null.
pub fn key_hashes(
    columns: &[Option<ArrayRef>],
    rows: usize,
) -> std::result::Result<Vec<u128>, String> {
    let normalised: Vec<ArrayRef> = columns
        .iter()
        .map(|c| match c {
            Some(a) => normalise(a),
            None => Ok(arrow_array::new_null_array(&DataType::Utf8, rows)),
        })
        .collect::<std::result::Result<_, String>>()?;
    let fields: Vec<SortField> = normalised
        .iter()
        .map(|a| SortField::new(a.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).map_err(|e| e.to_string())?;
    let encoded = converter
        .convert_columns(&normalised)
        .map_err(|e| e.to_string())?;
    Ok((0..rows)
        .map(|r| xxhash_rust::xxh3::xxh3_128(encoded.row(r).as_ref()))
        .collect())
}

fn normalise(a: &ArrayRef) -> std::result::Result<ArrayRef, String> {
    let to = match a.data_type() {
        DataType::Int8 | DataType::Int16 | DataType::Int32 => Some(DataType::Int64),
        DataType::Decimal128(_, s) => Some(DataType::Decimal128(38, *s)),
        DataType::LargeUtf8 | DataType::Utf8View => Some(DataType::Utf8),
        _ => None,
    };
    match to {
        Some(t) => arrow_cast::cast(a, &t).map_err(|e| e.to_string()),
        None => Ok(a.clone()),
    }
}

/// The file's top-level columns with the given field ids, in batches; per batch, where each id
/// is among the batch's columns (`None`: the file predates the column).
pub(crate) async fn read_columns(
    table: &Table,
    path: &str,
    size: u64,
    ids: &[i32],
) -> Result<Vec<(RecordBatch, Vec<Option<usize>>)>> {
    let builder = crate::table::files::open_parquet(table, path, size).await?;
    let schema = builder.schema().clone();
    let id_of = |i: usize| {
        schema
            .field(i)
            .metadata()
            .get(FIELD_ID)
            .and_then(|v| v.parse::<i32>().ok())
    };
    let roots: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| id_of(i).is_some_and(|id| ids.contains(&id)))
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
    let stream = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| Error::Internal(format!("read {path}: {e}")))?;
    let batches: Vec<RecordBatch> = stream
        .try_collect()
        .await
        .map_err(|e| Error::Internal(format!("read {path}: {e}")))?;
    Ok(batches
        .into_iter()
        .map(|b| {
            let bs = b.schema();
            let found = ids
                .iter()
                .map(|id| {
                    bs.fields().iter().position(|f| {
                        f.metadata()
                            .get(FIELD_ID)
                            .and_then(|v| v.parse::<i32>().ok())
                            == Some(*id)
                    })
                })
                .collect();
            (b, found)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Decimal128Array, Int32Array as I32, StringArray as S};
    use std::sync::Arc;

    #[test]
    fn a_widened_key_hashes_as_before() {
        let narrow: ArrayRef = Arc::new(I32::from(vec![1, 2]));
        let wide: ArrayRef = Arc::new(Int64Array::from(vec![1i64, 2]));
        assert_eq!(
            key_hashes(&[Some(narrow)], 2).unwrap(),
            key_hashes(&[Some(wide)], 2).unwrap()
        );
        let d9: ArrayRef = Arc::new(
            Decimal128Array::from(vec![100i128, 250])
                .with_precision_and_scale(9, 2)
                .unwrap(),
        );
        let d18: ArrayRef = Arc::new(
            Decimal128Array::from(vec![100i128, 250])
                .with_precision_and_scale(18, 2)
                .unwrap(),
        );
        assert_eq!(
            key_hashes(&[Some(d9)], 2).unwrap(),
            key_hashes(&[Some(d18)], 2).unwrap()
        );
    }

    #[test]
    fn keys_of_several_columns_are_told_apart() {
        // ("a", "bc") and ("ab", "c") concatenate alike; the row format does not.
        let first: ArrayRef = Arc::new(S::from(vec!["a", "ab"]));
        let second: ArrayRef = Arc::new(S::from(vec!["bc", "c"]));
        let h = key_hashes(&[Some(first), Some(second)], 2).unwrap();
        assert_ne!(h[0], h[1]);
    }
}
