//! The derived tables of a topic's rows: run through [`crate::process::Processor`], encoded
//! like the topic's own table, and the rows a derived table's SQL failed on dead-lettered with
//! the table's name in the reason.

use std::collections::{BTreeMap, HashMap};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use parquet::file::properties::WriterProperties;

use super::Planned;
use super::records::{Counts, dead_letter};
use crate::decode::{DeadLetterBuilder, RejectKind, Rejection};
use crate::error::{Error, Result};
use crate::esm::EsmRecord;
use crate::process::Processor;
use crate::process::partition_state::PartitionState;
use crate::table::encode::{EncodedFile, encode};

/// Where the derived tables' files go, and how they are written.
pub(super) struct Output<'a> {
    pub locations: &'a HashMap<String, String>,
    pub stem: &'a str,
    pub props: &'a WriterProperties,
}

/// Encodes what every derived table fed by `source_table` gets from `rows` (decoded records of
/// `topic`); failed rows go to `dead`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn derived_files(
    processor: &Processor,
    out: &Output<'_>,
    source_table: &str,
    topic: &str,
    rows: &RecordBatch,
    planned: &[Planned<'_>],
    states: &mut BTreeMap<i32, PartitionState>,
    now_ms: i64,
    dead: &mut DeadLetterBuilder,
    counts: &mut Counts,
) -> Result<Vec<EncodedFile>> {
    let mut files = Vec::new();
    for d in processor.derive(source_table, rows, states, now_ms)? {
        counts.deduplicated += d.deduplicated;
        if let Some(batch) = &d.rows {
            counts.derived_rows += batch.num_rows() as u64;
            let location = out
                .locations
                .get(&d.table)
                .ok_or_else(|| Error::Internal(format!("no location for table {}", d.table)))?;
            files.extend(encode(&d.layout, batch, location, out.stem, out.props).await?);
        }
        if d.failures.is_empty() && d.late.is_empty() && d.future.is_empty() {
            continue;
        }
        let partitions = rows
            .column_by_name(crate::kafka::PARTITION)
            .and_then(|c| c.as_primitive_opt::<Int32Type>());
        let offsets = rows
            .column_by_name(crate::kafka::OFFSET)
            .and_then(|c| c.as_primitive_opt::<Int64Type>());
        let (Some(partitions), Some(offsets)) = (partitions, offsets) else {
            return Err(Error::Internal(format!(
                "rows of {source_table} carry no Kafka coordinates"
            )));
        };
        let (mut value_buf, mut key_buf) = (Vec::new(), Vec::new());
        let name = crate::spec::derived_name(&d.table);
        let failures = d.failures.iter().map(|(r, m)| {
            (
                r,
                RejectKind::Transform,
                format!("derived table {name}: {m}"),
            )
        });
        let late = d.late.iter().map(|(r, m)| (r, RejectKind::Late, m.clone()));
        let future = d
            .future
            .iter()
            .map(|(r, m)| (r, RejectKind::Future, m.clone()));
        for (row, kind, reason) in failures.chain(late).chain(future) {
            if *row >= rows.num_rows() || partitions.is_null(*row) {
                return Err(Error::Internal(format!(
                    "derived table {} reported row {row} of {}",
                    d.table,
                    rows.num_rows()
                )));
            }
            let key = (partitions.value(*row), offsets.value(*row));
            let Some((source, record)) = record_at(topic, planned, key) else {
                return Err(Error::Internal(format!(
                    "row {row} of {source_table} ({topic}-{}@{}) matches no record of the batch",
                    key.0, key.1
                )));
            };
            let rejection = Rejection::new(kind, reason);
            dead_letter(
                record,
                source,
                &rejection,
                dead,
                &mut value_buf,
                &mut key_buf,
            );
            counts.reject_derived(kind);
        }
    }
    Ok(files)
}

/// The record of `topic` at (partition, offset) in the batch (each partition's records are in
/// offset order).
fn record_at<'a>(
    topic: &str,
    planned: &'a [Planned<'a>],
    (partition, offset): (i32, i64),
) -> Option<(&'a crate::checkpoint::SourcePartition, &'a EsmRecord)> {
    let p = planned
        .iter()
        .find(|p| p.source.topic == topic && p.source.partition == partition)?;
    let at = p.records.binary_search_by_key(&offset, |r| r.offset).ok()?;
    Some((&p.source, p.records[at]))
}
