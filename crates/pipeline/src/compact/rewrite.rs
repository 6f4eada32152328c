//! Rewriting many small files into few target-size ones, streaming, in bounded memory.
//!
//! Inputs are bin-packed, in order, into groups of at most the target size; each group becomes
//! one output file. Inside a group, row groups are taken one at a time (one ranged read each):
//!
//! - a row group of at least `stitch_min_bytes` (default [`STITCH_MIN_ROW_GROUP_BYTES`]) whose
//!   columns are encoded exactly as the output's is **stitched**: its column chunks are copied byte for byte (no decoding);
//! - smaller row groups (micro-files from ingest) are decoded and **re-encoded** together into
//!   row groups of [`ROW_GROUP_ROWS`] rows, so the output does not inherit their fragmentation.
//!
//! Memory holds one input row group plus at most one output row group being encoded, whatever
//! the input size. The output's Iceberg statistics are the inputs' combined (counts summed,
//! bounds widened), which is exact because a group never splits an input file.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef as ArrowSchemaRef;
use bytes::Bytes;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::{FileMetadata, FileWrite};
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, ManifestEntryRef, Struct,
};
use iceberg::table::Table;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::arrow_writer::{ArrowRowGroupWriterFactory, compute_leaves};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ArrowSchemaConverter, add_encoded_arrow_schema_to_metadata};
use parquet::basic::{Compression, ZstdLevel};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::SchemaDescriptor;

use super::row_group::{RowGroupBytes, Source, WHOLE_FILE_BYTES, read_batch_rows, row_group_range};
use crate::error::{Error, Result};

/// Rows per re-encoded output row group.
pub const ROW_GROUP_ROWS: usize = 256 * 1024;
/// Default: row groups at least this large (compressed) are copied as they are.
pub const STITCH_MIN_ROW_GROUP_BYTES: u64 = 1024 * 1024;
/// Default: decoded bytes buffered before they are encoded as an output row group. Rows of up to
/// 1 MiB (dead letters keep whole record values) must not make a row group of 256k rows
/// unbounded.
pub const ROW_GROUP_BYTES: usize = 128 * 1024 * 1024;

/// Writer settings for compacted files: ZSTD level 1 (the level ingest uses, so stitched and
/// re-encoded row groups match), row groups of [`ROW_GROUP_ROWS`] rows.
pub fn compacted_file_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build()
}

/// The result of rewriting one partition.
#[derive(Debug, Default)]
pub struct Rewritten {
    /// Inputs replaced by the outputs.
    pub removed: Vec<String>,
    /// The files written.
    pub outputs: Vec<DataFile>,
    /// Rows left out (deleted by position deletes), per Kafka partition.
    pub dropped: std::collections::BTreeMap<i32, u64>,
}

/// Rewrites the job's inputs (live files of one partition, in order) into files of about
/// `target_bytes`. `prefix` makes output names unique. Groups of a single file are left alone.
pub async fn rewrite(
    table: &Table,
    job: &super::Job,
    target_bytes: u64,
    stitch_min_bytes: u64,
    row_group_bytes: usize,
    prefix: &str,
) -> Result<Rewritten> {
    let (partition, partition_path, inputs) = (&job.partition, job.path.as_str(), &job.inputs[..]);
    let metadata = table.metadata();
    let ctx = |what: &str| format!("{what} ({})", table.identifier());
    let arrow_schema: ArrowSchemaRef = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(metadata.current_schema())
            .map_err(|e| Error::iceberg(ctx("arrow schema"), e))?,
    );
    let mut props = compacted_file_properties();
    add_encoded_arrow_schema_to_metadata(&arrow_schema, &mut props);
    let parquet_schema = ArrowSchemaConverter::new()
        .convert(&arrow_schema)
        .map_err(|e| Error::Internal(ctx(&format!("parquet schema: {e}"))))?;
    let field_ids: Vec<i32> = metadata
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.id)
        .collect();
    let dir = if partition_path.is_empty() {
        format!("{}/data", metadata.location())
    } else {
        format!("{}/data/{partition_path}", metadata.location())
    };
    let output = Output {
        arrow_schema,
        parquet_schema,
        props: Arc::new(props),
        field_ids,
        partition: partition.clone(),
        spec_id: metadata.default_partition_spec_id(),
        stitch_min_bytes: i64::try_from(stitch_min_bytes).unwrap_or(i64::MAX),
        row_group_bytes: row_group_bytes.max(1),
    };

    let mut result = Rewritten::default();
    for group in bin_pack(inputs, target_bytes) {
        if group.len() < 2 {
            continue;
        }
        let location = format!("{dir}/{prefix}-{:05}.parquet", result.outputs.len());
        let file = output.write(table, group, &location).await?;
        result
            .removed
            .extend(group.iter().map(|e| e.file_path().to_string()));
        result.outputs.push(file);
    }
    Ok(result)
}

/// Consecutive groups of inputs whose sizes add up to at most `target` (a larger single input
/// forms its own group).
fn bin_pack(inputs: &[ManifestEntryRef], target: u64) -> Vec<&[ManifestEntryRef]> {
    let mut groups = Vec::new();
    let (mut start, mut size) = (0, 0u64);
    for (i, e) in inputs.iter().enumerate() {
        let s = e.file_size_in_bytes();
        if i > start && size + s > target {
            groups.push(&inputs[start..i]);
            start = i;
            size = 0;
        }
        size += s;
    }
    if start < inputs.len() {
        groups.push(&inputs[start..]);
    }
    groups
}

/// What every output file of a rewrite shares.
struct Output {
    arrow_schema: ArrowSchemaRef,
    parquet_schema: SchemaDescriptor,
    props: Arc<WriterProperties>,
    field_ids: Vec<i32>,
    partition: Struct,
    spec_id: i32,
    stitch_min_bytes: i64,
    /// Decoded bytes buffered before an output row group is encoded.
    row_group_bytes: usize,
}

/// A byte sink shared with the Parquet writer, drained to the object store between row groups.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("sink poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    fn take(&self) -> Bytes {
        self.0
            .lock()
            .map(|mut v| Bytes::from(std::mem::take(&mut *v)))
            .unwrap_or_default()
    }
}

fn pq(what: String) -> impl Fn(parquet::errors::ParquetError) -> Error {
    move |e| Error::Internal(format!("{what}: {e}"))
}

impl Output {
    /// Writes one output file from a group of inputs; returns its `DataFile`.
    async fn write(
        &self,
        table: &Table,
        group: &[ManifestEntryRef],
        location: &str,
    ) -> Result<DataFile> {
        let file_io = table.file_io();
        let mut out: Box<dyn FileWrite> = file_io
            .new_output(location)
            .map_err(|e| Error::iceberg(location.to_string(), e))?
            .writer()
            .await
            .map_err(|e| Error::iceberg(format!("create {location}"), e))?;
        let sink = Sink::default();
        let mut writer = SerializedFileWriter::new(
            sink.clone(),
            self.parquet_schema.root_schema_ptr(),
            self.props.clone(),
        )
        .map_err(pq(format!("open {location}")))?;
        let factory = ArrowRowGroupWriterFactory::new(&writer, self.arrow_schema.clone());
        let mut pending: Vec<RecordBatch> = Vec::new();
        let mut pending_rows = 0usize;
        let mut pending_bytes = 0usize;
        let mut written = 0u64;

        for input in group {
            let path = input.file_path();
            let size = input.file_size_in_bytes();
            // A small file (a micro-file) is read with one GET; a large one footer first, then
            // a ranged read per row group.
            let (meta, mut source) = if size <= WHOLE_FILE_BYTES {
                let bytes = file_io
                    .new_input(path)
                    .map_err(|e| Error::iceberg(path.to_string(), e))?
                    .read()
                    .await
                    .map_err(|e| Error::iceberg(format!("read {path}"), e))?;
                let meta = ParquetMetaDataReader::new()
                    .with_page_index_policy(PageIndexPolicy::Optional)
                    .parse_and_finish(&bytes)
                    .map_err(pq(format!("footer of {path}")))?;
                (Arc::new(meta), Source::Whole(bytes))
            } else {
                let reader = file_io
                    .new_input(path)
                    .map_err(|e| Error::iceberg(path.to_string(), e))?
                    .reader()
                    .await
                    .map_err(|e| Error::iceberg(format!("open {path}"), e))?;
                let mut file = ArrowFileReader::new(FileMetadata { size }, reader);
                // With page indexes: copied column chunks keep their offset and column indexes.
                let meta: Arc<ParquetMetaData> = Arc::new(
                    ParquetMetaDataReader::new()
                        .with_page_index_policy(PageIndexPolicy::Optional)
                        .load_and_finish(&mut file, size)
                        .await
                        .map_err(pq(format!("footer of {path}")))?,
                );
                (meta, Source::Ranged(file))
            };
            let stitchable =
                meta.file_metadata().schema_descr().columns() == self.parquet_schema.columns();
            let reader_meta = ArrowReaderMetadata::try_new(meta.clone(), ArrowReaderOptions::new())
                .map_err(pq(format!("schema of {path}")))?;
            for (i, rg) in meta.row_groups().iter().enumerate() {
                let (start, end) = row_group_range(rg);
                let bytes = match &mut source {
                    Source::Whole(all) => {
                        let (from, to) = (start as usize, end as usize);
                        if from > to || to > all.len() {
                            return Err(Error::Internal(format!(
                                "read {path}: row group {i} lies outside the file"
                            )));
                        }
                        all.slice(from..to)
                    }
                    Source::Ranged(file) => file
                        .get_bytes(start..end)
                        .await
                        .map_err(pq(format!("read {path}")))?,
                };
                let chunk = RowGroupBytes { base: start, bytes };
                let offset_index = meta.offset_index().and_then(|o| o.get(i));
                let column_index = meta.column_index().and_then(|c| c.get(i));
                // Row groups without page indexes are re-encoded: a Parquet file must have them
                // for every column chunk or for none.
                let indexed = offset_index.is_some_and(|o| o.len() == rg.num_columns());
                if stitchable && indexed && rg.compressed_size() >= self.stitch_min_bytes {
                    self.encode(&factory, &mut writer, &mut pending)?;
                    (pending_rows, pending_bytes) = (0, 0);
                    let mut rg_out = writer
                        .next_row_group()
                        .map_err(pq(format!("write {location}")))?;
                    for (c, column) in rg.columns().iter().enumerate() {
                        let close = ColumnCloseResult {
                            bytes_written: column.compressed_size() as u64,
                            rows_written: rg.num_rows() as u64,
                            metadata: column.clone(),
                            bloom_filter: None,
                            column_index: column_index.and_then(|ci| ci.get(c)).cloned(),
                            offset_index: offset_index.and_then(|oi| oi.get(c)).cloned(),
                        };
                        rg_out
                            .append_column(&chunk, close)
                            .map_err(pq(format!("copy {path} into {location}")))?;
                    }
                    rg_out.close().map_err(pq(format!("write {location}")))?;
                } else {
                    let batches = ParquetRecordBatchReaderBuilder::new_with_metadata(
                        chunk,
                        reader_meta.clone(),
                    )
                    .with_row_groups(vec![i])
                    .with_batch_size(read_batch_rows(rg))
                    .build()
                    .map_err(pq(format!("decode {path}")))?;
                    for batch in batches {
                        let batch =
                            batch.map_err(|e| Error::Internal(format!("decode {path}: {e}")))?;
                        let batch = crate::table::project::project(&batch, &self.arrow_schema)
                            .map_err(|e| {
                                Error::Internal(format!(
                                    "{path} does not fit the table schema: {e}"
                                ))
                            })?;
                        pending_rows += batch.num_rows();
                        pending_bytes += batch.get_array_memory_size();
                        pending.push(batch);
                        if pending_rows >= ROW_GROUP_ROWS || pending_bytes >= self.row_group_bytes {
                            self.encode(&factory, &mut writer, &mut pending)?;
                            (pending_rows, pending_bytes) = (0, 0);
                        }
                    }
                }
                let bytes = sink.take();
                written += bytes.len() as u64;
                out.write(bytes)
                    .await
                    .map_err(|e| Error::iceberg(format!("write {location}"), e))?;
            }
        }
        self.encode(&factory, &mut writer, &mut pending)?;
        let meta = writer.close().map_err(pq(format!("finish {location}")))?;
        let tail = sink.take();
        written += tail.len() as u64;
        out.write(tail)
            .await
            .map_err(|e| Error::iceberg(format!("write {location}"), e))?;
        out.close()
            .await
            .map_err(|e| Error::iceberg(format!("close {location}"), e))?;
        self.data_file(group, &meta, location, written)
    }

    /// Encodes the buffered batches as one row group.
    fn encode(
        &self,
        factory: &ArrowRowGroupWriterFactory,
        writer: &mut SerializedFileWriter<Sink>,
        pending: &mut Vec<RecordBatch>,
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let index = writer.flushed_row_groups().len();
        let mut columns = factory
            .create_column_writers(index)
            .map_err(pq("column writers".into()))?;
        for batch in pending.drain(..) {
            let mut leaf = columns.iter_mut();
            for (field, array) in self.arrow_schema.fields().iter().zip(batch.columns()) {
                for l in
                    compute_leaves(field, array).map_err(pq(format!("encode {}", field.name())))?
                {
                    let w = leaf
                        .next()
                        .ok_or_else(|| Error::Internal("more leaves than columns".into()))?;
                    w.write(&l)
                        .map_err(pq(format!("encode {}", field.name())))?;
                }
            }
        }
        let mut rg = writer.next_row_group().map_err(pq("row group".into()))?;
        for w in columns {
            w.close()
                .and_then(|c| c.append_to_row_group(&mut rg))
                .map_err(pq("row group".into()))?;
        }
        rg.close().map_err(pq("row group".into()))?;
        Ok(())
    }

    /// The output's `DataFile`: counts and bounds combined from the inputs, sizes and split
    /// offsets from the written file.
    fn data_file(
        &self,
        group: &[ManifestEntryRef],
        meta: &ParquetMetaData,
        location: &str,
        size: u64,
    ) -> Result<DataFile> {
        let mut records = 0u64;
        let mut values: HashMap<i32, u64> = HashMap::new();
        let mut nulls: HashMap<i32, u64> = HashMap::new();
        let mut nans: HashMap<i32, u64> = HashMap::new();
        let mut lower: HashMap<i32, Datum> = HashMap::new();
        let mut upper: HashMap<i32, Datum> = HashMap::new();
        for e in group {
            let f = e.data_file();
            records += f.record_count();
            for (m, src) in [
                (&mut values, f.value_counts()),
                (&mut nulls, f.null_value_counts()),
                (&mut nans, f.nan_value_counts()),
            ] {
                for (k, v) in src {
                    *m.entry(*k).or_default() += v;
                }
            }
            for (k, v) in f.lower_bounds() {
                match lower.get(k) {
                    Some(cur) if cur <= v => {}
                    _ => {
                        lower.insert(*k, v.clone());
                    }
                }
            }
            for (k, v) in f.upper_bounds() {
                match upper.get(k) {
                    Some(cur) if cur >= v => {}
                    _ => {
                        upper.insert(*k, v.clone());
                    }
                }
            }
        }
        let written_rows = meta.file_metadata().num_rows() as u64;
        if written_rows != records {
            return Err(Error::Internal(format!(
                "{location}: wrote {written_rows} rows but the inputs hold {records}"
            )));
        }
        let mut sizes: HashMap<i32, u64> = HashMap::new();
        for rg in meta.row_groups() {
            for (i, c) in rg.columns().iter().enumerate() {
                if let Some(id) = self.field_ids.get(i) {
                    *sizes.entry(*id).or_default() += c.compressed_size() as u64;
                }
            }
        }
        let offsets: Vec<i64> = meta
            .row_groups()
            .iter()
            .filter_map(|rg| rg.file_offset())
            .collect();
        DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path(location.to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(self.partition.clone())
            .partition_spec_id(self.spec_id)
            .record_count(records)
            .file_size_in_bytes(size)
            .column_sizes(sizes)
            .value_counts(values)
            .null_value_counts(nulls)
            .nan_value_counts(nans)
            .lower_bounds(lower)
            .upper_bounds(upper)
            .split_offsets(Some(offsets))
            .build()
            .map_err(|e| Error::Internal(format!("{location}: data file description: {e}")))
    }
}
