//! One input row group of a rewrite, read by itself: a small input file is fetched whole, a
//! large one by the byte range of each row group, and the row group's bytes are decoded with
//! the offsets of the file they came from.

use bytes::Bytes;
use iceberg::arrow::ArrowFileReader;
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::reader::{ChunkReader, Length};

/// Rows per batch when decoding a row group (fewer for wide rows: see [`READ_BATCH_BYTES`]).
pub(super) const READ_BATCH_ROWS: usize = 8 * 1024;
/// Decoded bytes per batch read from a row group, estimated from the row group's statistics.
pub(super) const READ_BATCH_BYTES: i64 = 16 * 1024 * 1024;

/// Input files up to this size are read whole, with one request.
pub(super) const WHOLE_FILE_BYTES: u64 = 8 << 20;

/// Where an input file's bytes come from.
pub(super) enum Source {
    /// Read whole (small files).
    Whole(Bytes),
    /// Read by range (large files).
    Ranged(ArrowFileReader),
}

/// One row group's bytes, addressed with the offsets of the file they came from.
pub(super) struct RowGroupBytes {
    pub base: u64,
    pub bytes: Bytes,
}

impl Length for RowGroupBytes {
    fn len(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }
}

impl ChunkReader for RowGroupBytes {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        use bytes::Buf;
        let from = start
            .checked_sub(self.base)
            .filter(|s| *s <= self.bytes.len() as u64)
            .ok_or_else(|| {
                parquet::errors::ParquetError::General(format!(
                    "offset {start} outside the row group read"
                ))
            })?;
        Ok(self.bytes.slice(from as usize..).reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let from = start
            .checked_sub(self.base)
            .map(|s| s as usize)
            .filter(|s| s + length <= self.bytes.len());
        from.map(|f| self.bytes.slice(f..f + length))
            .ok_or_else(|| {
                parquet::errors::ParquetError::General(format!(
                    "range {start}+{length} outside the row group read"
                ))
            })
    }
}

pub(super) fn row_group_range(rg: &RowGroupMetaData) -> (u64, u64) {
    let start = rg
        .columns()
        .iter()
        .map(|c| c.dictionary_page_offset().unwrap_or(c.data_page_offset()))
        .min()
        .unwrap_or(0);
    let end = rg
        .columns()
        .iter()
        .map(|c| c.dictionary_page_offset().unwrap_or(c.data_page_offset()) + c.compressed_size())
        .max()
        .unwrap_or(0);
    (start.max(0) as u64, end.max(0) as u64)
}

/// Rows per decoded batch of a row group: at most [`READ_BATCH_ROWS`], fewer when the row
/// group's uncompressed size says its rows are wide.
pub(super) fn read_batch_rows(rg: &RowGroupMetaData) -> usize {
    let rows = rg.num_rows().max(1);
    let bytes_per_row = (rg.total_byte_size() / rows).max(1);
    (READ_BATCH_BYTES / bytes_per_row).clamp(1, READ_BATCH_ROWS as i64) as usize
}
