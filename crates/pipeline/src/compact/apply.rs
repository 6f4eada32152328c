//! Compaction of a partition whose rows have position deletes (an upsert table's superseded
//! rows, or rows an analyst deleted with Athena's `DELETE`): its files are decoded, the deleted
//! rows dropped, and the rest written as new files with fresh statistics; the replace removes
//! the inputs and every delete file that named only them, so reads of the partition are again
//! those of an append-only table.
//!
//! Byte-for-byte stitching ([`super::rewrite`]) cannot drop rows, so such a partition always
//! takes this path; the partition's rows are held decoded while they are written (its files
//! are at most the run's byte budget).

use std::collections::{HashMap, HashSet};

use arrow_array::{BooleanArray, RecordBatch};
use futures::TryStreamExt;
use iceberg::table::Table;

use super::rewrite::{Rewritten, compacted_file_properties};
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

/// Rewrites the job's inputs without their deleted rows into one file per partition value.
pub async fn rewrite(
    table: &Table,
    layout: &TableLayout,
    job: &super::Job,
    deletes: &TableDeletes,
    prefix: &str,
) -> Result<Rewritten> {
    let location = table.metadata().location().trim_end_matches('/');
    let mut kept: Vec<RecordBatch> = Vec::new();
    let mut dropped: std::collections::BTreeMap<i32, u64> = Default::default();
    for input in &job.inputs {
        let path = input.file_path();
        let gone = deletes.positions.get(path);
        let batches: Vec<RecordBatch> =
            files::open_parquet(table, path, input.file_size_in_bytes())
                .await?
                .with_batch_size(64 * 1024)
                .build()
                .map_err(|e| Error::Internal(format!("read {path}: {e}")))?
                .try_collect()
                .await
                .map_err(|e| Error::Internal(format!("read {path}: {e}")))?;
        let mut pos = 0u64;
        for batch in batches {
            let rows = batch.num_rows();
            let projected = crate::table::project::project(&batch, &layout.arrow_schema)
                .map_err(|e| Error::Internal(format!("{path}: {e}")))?;
            let batch = match gone {
                Some(g) => {
                    let keep = BooleanArray::from_iter(
                        (0..rows as u64).map(|r| Some(!g.contains(&(pos + r)))),
                    );
                    count_dropped(&projected, &keep, &mut dropped);
                    arrow_select::filter::filter_record_batch(&projected, &keep)
                        .map_err(|e| Error::Internal(format!("{path}: {e}")))?
                }
                None => projected,
            };
            pos += rows as u64;
            if batch.num_rows() > 0 {
                kept.push(batch);
            }
        }
    }
    let removed: Vec<String> = job
        .inputs
        .iter()
        .map(|e| e.file_path().to_string())
        .collect();
    if kept.is_empty() {
        return Ok(Rewritten {
            removed,
            outputs: Vec::new(),
            dropped,
        });
    }
    let all = arrow_select::concat::concat_batches(&layout.arrow_schema, &kept)
        .map_err(|e| Error::Internal(format!("compaction of {}: {e}", job.path)))?;
    drop(kept);
    let encoded =
        crate::table::encode::encode(layout, &all, location, prefix, &compacted_file_properties())
            .await?;
    let mut outputs = Vec::with_capacity(encoded.len());
    for f in encoded {
        table
            .file_io()
            .new_output(&f.location)
            .map_err(|e| Error::iceberg(f.location.clone(), e))?
            .write(f.bytes)
            .await
            .map_err(|e| Error::iceberg(format!("write {}", f.location), e))?;
        outputs.push(f.data_file);
    }
    Ok(Rewritten {
        removed,
        outputs,
        dropped,
    })
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
