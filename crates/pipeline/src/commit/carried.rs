//! Rows carried in state files ([`crate::checkpoint::CarriedRows`]): small derived-table files
//! (a window's partial rows, tens a batch) that ingest put into the state file it writes anyway
//! instead of a PUT of their own. A round writes a table's carried rows as one file per
//! partition value, named after the round and its content, in the same snapshot as the table's
//! other files; a round that crashes after writing them writes the same files again.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef as ArrowSchemaRef;
use arrow_select::concat::concat_batches;
use bytes::Bytes;
use iceberg::spec::DataFile;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::table::encode::{encode, micro_file_properties};

/// Most bytes one carried part's columns may decode to.
const MAX_DECODED_BYTES: i64 = 64 << 20;

/// A carried part (a Parquet file of `rows` rows, as its batch recorded) as one batch in
/// `schema` (the table's current schema, columns matched by field id), or why it cannot be
/// read. A part larger than a batch carries, or whose footer or pages hold other than `rows`
/// rows, is refused before its rows are kept.
pub(super) fn decode(
    part: &Bytes,
    schema: &ArrowSchemaRef,
    rows: u64,
) -> std::result::Result<RecordBatch, String> {
    if part.len() > crate::process::partition_state::MAX_CARRIED_BYTES {
        return Err(format!(
            "{} bytes: more than a batch carries ({} KB)",
            part.len(),
            crate::process::partition_state::MAX_CARRIED_BYTES >> 10
        ));
    }
    let builder = ParquetRecordBatchReaderBuilder::try_new(part.clone())
        .map_err(|e| format!("not a Parquet file: {e}"))?;
    let metadata = builder.metadata().clone();
    let in_footer = metadata.file_metadata().num_rows();
    let in_groups: i64 = metadata.row_groups().iter().map(|rg| rg.num_rows()).sum();
    let decoded: i64 = metadata
        .row_groups()
        .iter()
        .map(|rg| rg.total_byte_size().max(0))
        .sum();
    if u64::try_from(in_footer).ok() != Some(rows) || in_groups != in_footer {
        return Err(format!(
            "holds {in_footer} rows ({in_groups} in its row groups), not the {rows} its batch recorded"
        ));
    }
    if decoded > MAX_DECODED_BYTES {
        return Err(format!(
            "its columns decode to {decoded} bytes, more than a carried file holds ({} MB)",
            MAX_DECODED_BYTES >> 20
        ));
    }
    let reader = builder
        .build()
        .map_err(|e| format!("cannot be decoded: {e}"))?;
    let mut batches = Vec::new();
    let mut read = 0u64;
    for batch in reader {
        let batch = batch.map_err(|e| format!("cannot be decoded: {e}"))?;
        read += batch.num_rows() as u64;
        if read > rows {
            return Err(format!(
                "holds more than the {rows} rows its batch recorded"
            ));
        }
        batches.push(crate::table::project::project(&batch, schema)?);
    }
    concat_batches(schema, &batches).map_err(|e| e.to_string())
}

/// Writes `rows` (carried rows of `layout`'s table, in its current schema) as the table's files
/// of round `intent`: one per partition value. Returns their descriptions to commit.
pub(super) async fn write(
    backend: &Backend,
    layout: &TableLayout,
    table_location: &str,
    intent: &str,
    rows: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    let all = concat_batches(&layout.arrow_schema, rows)
        .map_err(|e| Error::Internal(format!("table {}: carried rows: {e}", layout.name)))?;
    let mut out = Vec::new();
    let stem = format!("carried-{intent}");
    for f in encode(
        layout,
        &all,
        table_location,
        &stem,
        &micro_file_properties(),
    )
    .await?
    {
        backend
            .warehouse
            .write(&f.location, f.bytes.clone())
            .await?;
        out.push(f.data_file);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;

    use super::*;

    fn schema() -> ArrowSchemaRef {
        let id = HashMap::from([("PARQUET:field_id".to_string(), "1".to_string())]);
        Arc::new(Schema::new(vec![
            Field::new("orders", DataType::Int64, false).with_metadata(id),
        ]))
    }

    fn part(n: i64) -> Bytes {
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
        let batch = RecordBatch::try_new(schema(), vec![values]).unwrap();
        let mut buf = Vec::new();
        let mut w = ArrowWriter::try_new(&mut buf, schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        Bytes::from(buf)
    }

    #[test]
    fn a_carried_part_is_read_only_with_the_rows_its_batch_recorded() {
        let rows = decode(&part(3), &schema(), 3).expect("three rows");
        assert_eq!(rows.num_rows(), 3);
        let e = decode(&part(3), &schema(), 2).unwrap_err();
        assert!(e.contains("not the 2 its batch recorded"), "{e}");
        let e = decode(&Bytes::from_static(b"PAR1 not parquet"), &schema(), 3).unwrap_err();
        assert!(e.contains("not a Parquet file"), "{e}");
        let big = Bytes::from(vec![
            0u8;
            crate::process::partition_state::MAX_CARRIED_BYTES + 1
        ]);
        let e = decode(&big, &schema(), 3).unwrap_err();
        assert!(e.contains("more than a batch carries"), "{e}");
    }
}
