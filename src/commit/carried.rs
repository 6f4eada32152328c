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

use crate::config::Backend;
use crate::error::{Error, Result};
use crate::ingest::encode::{encode, micro_file_properties};
use crate::schema::TableLayout;

/// Most rows one carried part may hold (ingest carries files of at most 256 KB).
const MAX_ROWS: i64 = 1_000_000;

/// Most bytes one carried part's columns may decode to.
const MAX_DECODED_BYTES: i64 = 64 << 20;

/// A carried part (a Parquet file) as one batch in `schema` (the table's current schema,
/// columns matched by field id), or why it cannot be read.
pub(super) fn decode(
    part: &Bytes,
    schema: &ArrowSchemaRef,
) -> std::result::Result<RecordBatch, String> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(part.clone())
        .map_err(|e| format!("not a Parquet file: {e}"))?;
    let metadata = builder.metadata().clone();
    let rows = metadata.file_metadata().num_rows();
    let decoded: i64 = metadata
        .row_groups()
        .iter()
        .map(|rg| rg.total_byte_size().max(0))
        .sum();
    if !(0..=MAX_ROWS).contains(&rows) || decoded > MAX_DECODED_BYTES {
        return Err(format!(
            "{rows} rows of {decoded} bytes: more than a carried file holds ({MAX_ROWS} rows, {} MB)",
            MAX_DECODED_BYTES >> 20
        ));
    }
    let reader = builder
        .build()
        .map_err(|e| format!("cannot be decoded: {e}"))?;
    let mut batches = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| format!("cannot be decoded: {e}"))?;
        batches.push(crate::compact::project::project(&batch, schema)?);
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
