//! Streaming rewrite of many small files into few target-size ones.
//!
//! Input files are read one record batch at a time (ranged reads through the table's `FileIO`)
//! and appended to a Parquet writer that rolls to a new file when the current one reaches the
//! target size. Memory is bounded by one input row group plus the output's in-progress row
//! group, whatever the input size.

use std::sync::Arc;

use arrow_array::RecordBatch;
use futures::StreamExt;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::FileMetadata;
use iceberg::spec::{DataFile, ManifestEntryRef, Struct};
use iceberg::table::Table;
use iceberg::writer::CurrentFileStatus;
use iceberg::writer::file_writer::{
    FileWriter, FileWriterBuilder, ParquetWriter, ParquetWriterBuilder,
};
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

/// Rows per output row group: large enough for good compression, small enough that the
/// in-progress row group stays a few tens of MB.
const ROW_GROUP_ROWS: usize = 256 * 1024;
/// Rows per batch read from the inputs.
const READ_BATCH_ROWS: usize = 8 * 1024;

/// Writer settings for compacted files: ZSTD level 3 (they are read many times).
pub fn compacted_file_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build()
}

/// Rewrites `inputs` (live files of one partition) into files of about `target_bytes`.
/// `prefix` makes output names unique (`{table}/data/{partition}/{prefix}-{n}.parquet`).
pub async fn rewrite(
    table: &Table,
    partition: &Struct,
    partition_path: &str,
    inputs: &[ManifestEntryRef],
    target_bytes: u64,
    prefix: &str,
) -> Result<Vec<DataFile>> {
    let metadata = table.metadata();
    let ident = table.identifier();
    let ctx = |what: &str| format!("{what} ({ident})");
    let schema = metadata.current_schema().clone();
    let arrow_schema = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(&schema)
            .map_err(|e| Error::iceberg(ctx("arrow schema"), e))?,
    );
    let builder = ParquetWriterBuilder::new(compacted_file_properties(), schema);
    let spec_id = metadata.default_partition_spec_id();
    let dir = if partition_path.is_empty() {
        format!("{}/data", metadata.location())
    } else {
        format!("{}/data/{partition_path}", metadata.location())
    };

    let mut outputs = Vec::new();
    let mut writer: Option<ParquetWriter> = None;
    for input in inputs {
        let path = input.file_path();
        let reader = table
            .file_io()
            .new_input(path)
            .map_err(|e| Error::iceberg(ctx(path), e))?
            .reader()
            .await
            .map_err(|e| Error::iceberg(ctx(&format!("open {path}")), e))?;
        let file = ArrowFileReader::new(
            FileMetadata {
                size: input.file_size_in_bytes(),
            },
            reader,
        );
        let mut stream = ParquetRecordBatchStreamBuilder::new(file)
            .await
            .map_err(|e| Error::Internal(ctx(&format!("read {path}: {e}"))))?
            .with_batch_size(READ_BATCH_ROWS)
            .build()
            .map_err(|e| Error::Internal(ctx(&format!("read {path}: {e}"))))?;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|e| Error::Internal(ctx(&format!("read {path}: {e}"))))?;
            let batch = RecordBatch::try_new(arrow_schema.clone(), batch.columns().to_vec())
                .map_err(|e| {
                    Error::Internal(ctx(&format!("{path} does not fit the table schema: {e}")))
                })?;
            let w = match writer.as_mut() {
                Some(w) => w,
                None => {
                    let location = format!("{dir}/{prefix}-{:05}.parquet", outputs.len());
                    let out = table
                        .file_io()
                        .new_output(&location)
                        .map_err(|e| Error::iceberg(ctx(&location), e))?;
                    let w = builder
                        .build(out)
                        .await
                        .map_err(|e| Error::iceberg(ctx("parquet writer"), e))?;
                    writer.insert(w)
                }
            };
            w.write(&batch)
                .await
                .map_err(|e| Error::iceberg(ctx("write compacted file"), e))?;
            if w.current_written_size() as u64 >= target_bytes
                && let Some(w) = writer.take()
            {
                outputs.push(finish(w, partition, spec_id).await?);
            }
        }
    }
    if let Some(w) = writer.take() {
        outputs.push(finish(w, partition, spec_id).await?);
    }
    Ok(outputs)
}

async fn finish(writer: ParquetWriter, partition: &Struct, spec_id: i32) -> Result<DataFile> {
    let mut built = writer
        .close()
        .await
        .map_err(|e| Error::iceberg("finish compacted file", e))?;
    let mut b = built
        .pop()
        .ok_or_else(|| Error::Internal("compacted file writer produced no file".into()))?;
    b.partition(partition.clone())
        .partition_spec_id(spec_id)
        .build()
        .map_err(|e| Error::Internal(format!("compacted file description: {e}")))
}
