//! Compaction of a partition whose rows have position deletes (an upsert table's superseded
//! rows, or rows an analyst deleted with Athena's `DELETE`): its files are decoded, the deleted
//! rows dropped, and the rest written as new files with fresh statistics; the replace removes
//! the inputs and every delete file that named only them, so reads of the partition are again
//! those of an append-only table.
//!
//! Byte-for-byte stitching ([`super::rewrite`]) cannot drop rows, so such a partition always
//! takes this path, streaming: an input record batch and the output row group being encoded
//! are held at a time, the outputs rolled at the table's target file size.

use std::collections::{HashMap, HashSet};

use arrow_array::{BooleanArray, RecordBatch};
use futures::TryStreamExt;
use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::writer::CurrentFileStatus;
use iceberg::writer::file_writer::{
    FileWriter, FileWriterBuilder, ParquetWriter, ParquetWriterBuilder,
};

use super::rewrite::{ROW_GROUP_BYTES, Rewritten, compacted_file_properties};
use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::table::files::{self, FileEntry, SnapshotFiles};

/// The live delete files of a table and what they delete.
#[derive(Debug, Default)]
pub struct TableDeletes {
    /// Positions deleted, per data file path.
    pub positions: HashMap<String, HashSet<u64>>,
    /// Per live position delete file, the data files it names.
    pub names: HashMap<String, HashSet<String>>,
    /// Every live delete file's path (what the rewrite saw).
    pub seen: HashSet<String>,
    /// Whether an equality delete file is live (compaction then leaves the table alone).
    pub equality: bool,
    /// The live data files when the deletes were read.
    pub live: HashSet<String>,
}

impl TableDeletes {
    /// Reads the snapshot's live delete files.
    pub async fn load(table: &Table, current: &SnapshotFiles) -> Result<TableDeletes> {
        let mut out = TableDeletes {
            live: current
                .live()
                .map(|e| e.entry.file_path().to_string())
                .collect(),
            ..TableDeletes::default()
        };
        for FileEntry { entry, .. } in files::live_delete_files(table, current).await? {
            let path = entry.file_path().to_string();
            out.seen.insert(path.clone());
            if entry.content_type() != iceberg::spec::DataContentType::PositionDeletes {
                out.equality = true;
                continue;
            }
            let rows =
                crate::upsert::read::position_deletes(table, &path, entry.file_size_in_bytes())
                    .await?;
            let names = out.names.entry(path).or_default();
            for (file, pos) in rows {
                names.insert(file.clone());
                out.positions.entry(file).or_default().insert(pos);
            }
        }
        Ok(out)
    }

    /// Whether no delete file is live.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// The delete files naming only files in `removed` or files no longer live (removed by an
    /// earlier rewrite: a delete file naming one of them is not left live for good).
    pub fn covered_by(&self, removed: &HashSet<String>) -> HashSet<String> {
        self.names
            .iter()
            .filter(|(_, names)| {
                names.iter().any(|n| removed.contains(n))
                    && names
                        .iter()
                        .all(|n| removed.contains(n) || !self.live.contains(n))
            })
            .map(|(d, _)| d.clone())
            .collect()
    }
}

/// Rewrites the job's inputs (one partition's) without their deleted rows into files of about
/// `target_bytes`, streaming: one input record batch and the output row group being encoded
/// are held, never the partition.
pub async fn rewrite(
    table: &Table,
    layout: &TableLayout,
    job: &super::Job,
    deletes: &TableDeletes,
    prefix: &str,
    target_bytes: u64,
) -> Result<Rewritten> {
    let location = table.metadata().location().trim_end_matches('/');
    let dir = if job.path.is_empty() {
        format!("{location}/data")
    } else {
        format!("{location}/data/{}", job.path)
    };
    let mut out = Rolling {
        table,
        layout,
        dir,
        prefix,
        target_bytes: usize::try_from(target_bytes.max(1)).unwrap_or(usize::MAX),
        partition: job.partition.clone(),
        writer: None,
        written: Vec::new(),
        locations: Vec::new(),
    };
    let mut dropped: std::collections::BTreeMap<i32, u64> = Default::default();
    let copied = copy_kept(table, layout, job, deletes, &mut out, &mut dropped).await;
    let outputs = match copied {
        Ok(()) => out.finish().await,
        Err(e) => Err(e),
    };
    let outputs = match outputs {
        Ok(o) => o,
        Err(e) => {
            // Nothing names the files written so far: they go now, not at orphan clean-up.
            for at in &out.locations {
                let _ = table.file_io().delete(at).await;
            }
            return Err(e);
        }
    };
    let removed: Vec<String> = job
        .inputs
        .iter()
        .map(|e| e.file_path().to_string())
        .collect();
    Ok(Rewritten {
        removed,
        outputs,
        dropped,
    })
}

/// Reads every input of `job` a record batch at a time and writes the rows no position delete
/// names to `out`, counting those it leaves out in `dropped`.
async fn copy_kept(
    table: &Table,
    layout: &TableLayout,
    job: &super::Job,
    deletes: &TableDeletes,
    out: &mut Rolling<'_>,
    dropped: &mut std::collections::BTreeMap<i32, u64>,
) -> Result<()> {
    for input in &job.inputs {
        let path = input.file_path();
        let gone = deletes.positions.get(path);
        let mut batches = files::open_parquet(table, path, input.file_size_in_bytes())
            .await?
            .with_batch_size(64 * 1024)
            .build()
            .map_err(|e| Error::Internal(format!("read {path}: {e}")))?;
        let mut pos = 0u64;
        while let Some(batch) = batches
            .try_next()
            .await
            .map_err(|e| Error::Internal(format!("read {path}: {e}")))?
        {
            let rows = batch.num_rows();
            let projected = crate::table::project::project(&batch, &layout.arrow_schema)
                .map_err(|e| Error::Internal(format!("{path}: {e}")))?;
            let batch = match gone {
                Some(g) => {
                    let keep = BooleanArray::from_iter(
                        (0..rows as u64).map(|r| Some(!g.contains(&(pos + r)))),
                    );
                    count_dropped(&projected, &keep, dropped);
                    arrow_select::filter::filter_record_batch(&projected, &keep)
                        .map_err(|e| Error::Internal(format!("{path}: {e}")))?
                }
                None => projected,
            };
            pos += rows as u64;
            if batch.num_rows() > 0 {
                out.write(&batch).await?;
            }
        }
    }
    Ok(())
}

/// Output files of one partition's rewrite, each closed once it reaches the target size.
struct Rolling<'a> {
    table: &'a Table,
    layout: &'a TableLayout,
    dir: String,
    prefix: &'a str,
    target_bytes: usize,
    partition: iceberg::spec::Struct,
    writer: Option<ParquetWriter>,
    written: Vec<DataFile>,
    /// Every file opened, closed or not (removed again when the rewrite fails).
    locations: Vec<String>,
}

impl Rolling<'_> {
    fn ctx(&self, what: &str) -> String {
        format!("compaction of {}: {what}", self.layout.name)
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let writer = match &mut self.writer {
            Some(w) => w,
            None => {
                let at = format!(
                    "{}/{}-{:05}.parquet",
                    self.dir,
                    self.prefix,
                    self.locations.len()
                );
                let output = self
                    .table
                    .file_io()
                    .new_output(&at)
                    .map_err(|e| Error::iceberg(at.clone(), e))?;
                self.locations.push(at);
                // Row groups closed at a byte bound too: rows of up to a MiB (dead letters keep
                // whole values) must not make a 256k-row group as large as the file.
                let props = compacted_file_properties()
                    .into_builder()
                    .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
                    .build();
                let w = ParquetWriterBuilder::new(props, self.layout.schema.clone())
                    .build(output)
                    .await
                    .map_err(|e| Error::iceberg(self.ctx("parquet writer"), e))?;
                self.writer.insert(w)
            }
        };
        writer.write(batch).await.map_err(|e| {
            Error::iceberg(format!("compaction of {}: encode", self.layout.name), e)
        })?;
        if writer.current_written_size() >= self.target_bytes {
            self.close().await?;
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        let mut closed = writer
            .close()
            .await
            .map_err(|e| Error::iceberg(self.ctx("finish parquet"), e))?;
        let file = closed
            .pop()
            .ok_or_else(|| Error::Internal(self.ctx("the parquet writer returned no file")))?
            .partition(self.partition.clone())
            .partition_spec_id(self.layout.partition_spec.spec_id())
            .build()
            .map_err(|e| Error::Internal(self.ctx(&format!("data file description: {e}"))))?;
        self.written.push(file);
        Ok(())
    }

    async fn finish(&mut self) -> Result<Vec<DataFile>> {
        self.close().await?;
        Ok(std::mem::take(&mut self.written))
    }
}

/// Adds the rows `keep` leaves out of `batch` to `dropped`, by their `kafka_partition` (-1: a
/// row without one).
fn count_dropped(
    batch: &RecordBatch,
    keep: &BooleanArray,
    dropped: &mut std::collections::BTreeMap<i32, u64>,
) {
    let partitions = batch
        .column_by_name(crate::kafka::PARTITION)
        .and_then(|c| arrow_cast::cast(c, &arrow_schema::DataType::Int32).ok());
    let partitions = partitions
        .as_ref()
        .and_then(|c| c.as_any().downcast_ref::<arrow_array::Int32Array>());
    for i in 0..keep.len() {
        if keep.value(i) {
            continue;
        }
        let p = match partitions {
            Some(a) if arrow_array::Array::is_valid(a, i) => a.value(i),
            _ => -1,
        };
        *dropped.entry(p).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delete_file_goes_once_every_file_it_names_is_gone() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<HashSet<String>>();
        let deletes = TableDeletes {
            names: HashMap::from([
                ("d1".to_string(), set(&["a", "s1"])),
                ("d2".to_string(), set(&["b"])),
            ]),
            // s1 was removed by an earlier rewrite; a and b are live.
            live: set(&["a", "b"]),
            ..TableDeletes::default()
        };
        assert_eq!(deletes.covered_by(&set(&["a"])), set(&["d1"]));
        assert_eq!(deletes.covered_by(&set(&["b"])), set(&["d2"]));
        assert!(deletes.covered_by(&set(&["c"])).is_empty());
    }
}
