//! Parquet micro-files: Arrow batches to ZSTD Parquet with Iceberg field ids, one file per
//! partition value, named deterministically.
//!
//! Files are encoded in memory with Iceberg's `ParquetWriter` (which also computes the column
//! statistics of the `DataFile`), with the writer settings adjusted per file to its rows
//! ([`super::tuning`]: small files uncompressed, mostly distinct columns without a
//! dictionary). Files are then named
//! `{table}/data/{partition path}/{stem}-{seq}-{content hash}.parquet`. The name is a pure
//! function of the file's bytes and of the batch it came from: a retry that produces the same
//! bytes rewrites the same object, and an invocation that produces different bytes (another
//! `failed_at`, another writer version during a deploy) can never overwrite a file that a
//! committed checkpoint references.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;
use bytes::Bytes;
use iceberg::io::FileIO;
use iceberg::spec::{DataFile, FormatVersion, Struct, serialize_data_file_to_json};
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};
use crate::partition::partition_path;
use crate::schema::TableLayout;

/// One encoded data file, ready to upload.
#[derive(Debug, Clone)]
pub struct EncodedFile {
    /// Table the file belongs to.
    pub table: String,
    /// Final location of the file.
    pub location: String,
    /// The Parquet bytes.
    pub bytes: Bytes,
    /// The Iceberg description of the file (path, partition, counts, bounds).
    pub data_file: DataFile,
    /// Whether it holds an upsert table's tombstones (keys to delete), not rows of the table.
    pub key_deletes: bool,
}

impl EncodedFile {
    /// The `DataFile` as JSON, to be kept with the pending batch until commit.
    pub fn data_file_json(&self, layout: &TableLayout) -> Result<String> {
        serialize_data_file_to_json(
            self.data_file.clone(),
            &layout.partition_type,
            FormatVersion::V2,
        )
        .map_err(|e| Error::iceberg(format!("serialize data file {}", self.location), e))
    }
}

/// Writer settings for micro-files: ZSTD level 1 with dictionaries (the fastest setting that
/// still compresses well; compaction rewrites into large files later).
pub fn micro_file_properties() -> WriterProperties {
    micro_file_properties_at(1)
}

/// Writer settings for micro-files at ZSTD `level` (1 to 22; out-of-range levels become 1).
pub fn micro_file_properties_at(level: i32) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(level).unwrap_or_default(),
        ))
        .build()
}

static STAGING: AtomicU64 = AtomicU64::new(0);

/// Encodes `batch` (rows of `layout`'s table) into one Parquet file per partition value.
///
/// `table_location` is the table's root; `stem` identifies the batch (topic, partition and
/// offsets). Files are returned in a deterministic order (by partition path).
pub async fn encode(
    layout: &TableLayout,
    batch: &RecordBatch,
    table_location: &str,
    stem: &str,
    props: &WriterProperties,
) -> Result<Vec<EncodedFile>> {
    if batch.num_rows() == 0 {
        return Ok(Vec::new());
    }
    let ctx = |what: &str| format!("table {}: {what}", layout.name);
    let mut groups: Vec<(String, Struct, RecordBatch)> =
        super::split::split_by_partition(layout, batch)?
            .into_iter()
            .map(|(tuple, rows)| {
                let path = partition_path(&layout.partition_spec, &layout.partition_type, &tuple);
                (path, tuple, rows)
            })
            .collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));

    let staging = FileIO::new_with_memory();
    let builder = ParquetWriterBuilder::new(props.clone(), layout.schema.clone());
    let mut files = Vec::with_capacity(groups.len());
    for (seq, (path, partition, rows)) in groups.into_iter().enumerate() {
        let tuned = super::tuning::for_file(props, &rows)
            .map(|p| ParquetWriterBuilder::new(p, layout.schema.clone()));
        let builder = tuned.as_ref().unwrap_or(&builder);
        let staged = format!(
            "memory:/staging/{}.parquet",
            STAGING.fetch_add(1, Ordering::Relaxed)
        );
        let output = staging
            .new_output(&staged)
            .map_err(|e| Error::iceberg(ctx("staging"), e))?;
        let mut writer = builder
            .build(output)
            .await
            .map_err(|e| Error::iceberg(ctx("parquet writer"), e))?;
        writer
            .write(&rows)
            .await
            .map_err(|e| Error::iceberg(ctx("encode parquet"), e))?;
        let mut written = writer
            .close()
            .await
            .map_err(|e| Error::iceberg(ctx("finish parquet"), e))?;
        let mut data_file = written
            .pop()
            .ok_or_else(|| Error::Internal(ctx("parquet writer returned no file")))?;
        let input = staging
            .new_input(&staged)
            .map_err(|e| Error::iceberg(ctx("staging"), e))?;
        let bytes = input
            .read()
            .await
            .map_err(|e| Error::iceberg(ctx("read staged file"), e))?;
        staging
            .delete(&staged)
            .await
            .map_err(|e| Error::iceberg(ctx("drop staged file"), e))?;

        let hash = xxhash_rust::xxh3::xxh3_64(&bytes);
        let dir = if path.is_empty() {
            String::new()
        } else {
            format!("{path}/")
        };
        let location = format!("{table_location}/data/{dir}{stem}-{seq:03}-{hash:016x}.parquet");
        let data_file = data_file
            .file_path(location.clone())
            .partition(partition)
            .partition_spec_id(layout.partition_spec.spec_id())
            .build()
            .map_err(|e| Error::Internal(ctx(&format!("data file description: {e}"))))?;
        files.push(EncodedFile {
            table: layout.name.clone(),
            location,
            bytes,
            data_file,
            key_deletes: false,
        });
    }
    Ok(files)
}

/// A shareable default for callers that do not tune the writer.
pub fn default_properties() -> Arc<WriterProperties> {
    Arc::new(micro_file_properties())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::split::tests::{batch, layout};
    use parquet::file::reader::{FileReader, SerializedFileReader};

    /// The codec of every column chunk of an encoded file.
    fn codecs(file: &EncodedFile) -> Vec<Compression> {
        let reader = SerializedFileReader::new(file.bytes.clone()).expect("parquet");
        let meta = reader.metadata();
        meta.row_groups()
            .iter()
            .flat_map(|g| g.columns().iter().map(|c| c.compression()))
            .collect()
    }

    #[tokio::test]
    async fn small_files_are_written_uncompressed_and_large_ones_with_zstd() {
        let layout = layout(&[]);
        let props = micro_file_properties();
        let few: Vec<(i64, Option<&str>, i64)> = (0..20).map(|i| (i, Some("DE"), i)).collect();
        let many: Vec<(i64, Option<&str>, i64)> = (0..20_000).map(|i| (i, Some("DE"), i)).collect();
        let small = encode(&layout, &batch(&layout, &few), "mem://t", "s", &props)
            .await
            .expect("encode");
        let large = encode(&layout, &batch(&layout, &many), "mem://t", "l", &props)
            .await
            .expect("encode");
        assert!(
            codecs(&small[0])
                .iter()
                .all(|c| *c == Compression::UNCOMPRESSED),
            "{:?}",
            codecs(&small[0])
        );
        assert!(
            codecs(&large[0])
                .iter()
                .all(|c| matches!(c, Compression::ZSTD(_))),
            "{:?}",
            codecs(&large[0])
        );
        // The unique column is written plainly, the repeating one with a dictionary.
        let reader = SerializedFileReader::new(large[0].bytes.clone()).expect("parquet");
        let chunks = reader.metadata().row_group(0).columns();
        let dictionary = |name: &str| {
            chunks
                .iter()
                .find(|c| c.column_path().string() == name)
                .map(|c| c.dictionary_page_offset().is_some())
        };
        assert_eq!(dictionary("id"), Some(false));
        assert_eq!(dictionary("country"), Some(true));
        // Both read back whole, with their statistics.
        assert_eq!(small[0].data_file.record_count(), 20);
        assert_eq!(large[0].data_file.record_count(), 20_000);
    }
}
