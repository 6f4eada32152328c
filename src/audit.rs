//! `streamtable audit`: every offset the pipeline took from a topic-partition is in the topic's
//! table or in `dead_letters`, exactly once.
//!
//! Per topic-partition, the offsets expected are those from the lowest one that landed up to the
//! partition's checkpoint, but those of batches still pending (ingested, not yet committed).
//! The audit reads only the Kafka columns (`kafka_partition`, `kafka_offset`) of the topic's
//! table and of its dead letters (one query), so its cost follows the rows, not the bytes: an offset
//! missing (a range with none of them) or present more than once (with where its copies are)
//! is reported, and the audit fails. Dead letters that a derived table rejected (kinds
//! `transform`, `late`, `future`: the topic's own table has the record) are not counted.
//!
//! Offsets Kafka itself skips (transaction markers, aborted records, compacted topics) look
//! missing: the audit says so for the ranges it reports. An upsert table is not audited (it
//! deletes the rows its keys' later records replace).

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use serde::Serialize;

use crate::backend::Backend;
use crate::checkpoint::SourcePartition;
use crate::error::{Error, Result};
use crate::query::{QueryEngine, TimeTravel};
use crate::spec::{DEAD_LETTER_TABLE, PipelineSpec};

/// Most duplicated offsets and missing ranges listed per table (the counts are always whole).
pub const MAX_LISTED: usize = 1000;

/// Dead-letter kinds a derived table gives a record the topic's own table kept.
const DERIVED_KINDS: [&str; 3] = ["transform", "late", "future"];

/// One offset found more than once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Duplicate {
    /// The offset.
    pub offset: i64,
    /// Its rows in the table.
    pub in_table: i64,
    /// Its rows in `dead_letters`.
    pub in_dead_letters: i64,
}

/// The audit of one topic-partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionAudit {
    /// The partition.
    pub partition: i32,
    /// The lowest offset found (in the table or dead letters).
    pub first_offset: Option<i64>,
    /// Where the check starts: the lowest offset found (or pending). Below it nothing can be
    /// told apart from offsets the topic no longer holds, so a loss there is not seen.
    pub verified_from: i64,
    /// The partition's checkpoint: the next offset the pipeline takes.
    pub next_offset: i64,
    /// Rows in the table.
    pub rows: i64,
    /// Rows in `dead_letters` (the topic's own rejections).
    pub dead_letters: i64,
    /// Offset ranges (inclusive) of batches not committed yet: not expected yet.
    pub pending: Vec<[i64; 2]>,
    /// Offset ranges (inclusive) expected and found nowhere.
    pub missing: Vec<[i64; 2]>,
    /// How many offsets are missing in all.
    pub missing_offsets: i64,
    /// Offsets found more than once (the first [`MAX_LISTED`]).
    pub duplicates: Vec<Duplicate>,
    /// How many offsets are found more than once in all.
    pub duplicated_offsets: i64,
    /// Offsets found at or above the partition's checkpoint (read again after the tables): the
    /// checkpoint went back (a reset or restored state store), and those offsets will land
    /// again.
    pub beyond_checkpoint: Option<[i64; 2]>,
}

/// The audit of one topic's table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableAudit {
    /// The table.
    pub table: String,
    /// Its topic.
    pub topic: String,
    /// Its partitions, in order.
    pub partitions: Vec<PartitionAudit>,
    /// Why it was not audited, when it was not.
    pub skipped: Option<String>,
}

/// What `streamtable audit` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Audit {
    /// Whether every expected offset was found exactly once, and none beyond a checkpoint.
    pub ok: bool,
    /// The tables, in the spec's order.
    pub tables: Vec<TableAudit>,
    /// Pending batches that cannot be read (damaged, or written by a later release): their
    /// offsets, not known to be pending, may show as missing.
    pub unreadable_pending: Vec<String>,
}

impl Audit {
    /// Whether every expected offset was found exactly once, and none beyond a checkpoint.
    pub fn ok(&self) -> bool {
        self.ok
    }
}

/// Audits the topics' tables of `spec` (only `only` when given).
///
/// What is read, in this order, so that a pipeline running meanwhile raises no false alarm: the
/// checkpoints (what is expected: below them), then the pending batches (not expected yet), then
/// the tables (a batch committed meanwhile is in them, one ingested meanwhile is above the
/// checkpoints read); after the tables, the checkpoints again (an offset found at or above its
/// partition's checkpoint then is one the checkpoint went back on).
pub async fn audit(backend: &Backend, spec: &PipelineSpec, only: Option<&str>) -> Result<Audit> {
    if let Some(name) = only
        && !spec.tables.iter().any(|t| t.name == name)
    {
        let names: Vec<&str> = spec.tables.iter().map(|t| t.name.as_str()).collect();
        return Err(Error::Config(format!(
            "audit: {name:?} is not a topic's table of the spec; audit one of: {}",
            names.join(", ")
        )));
    }
    let audited: Vec<&crate::spec::TableSpec> = spec
        .tables
        .iter()
        .filter(|t| only.is_none_or(|n| n == t.name))
        .collect();
    // 1. The checkpoints.
    let mut sources = Vec::new();
    for t in &audited {
        for p in backend.state.partitions(&t.topic).await? {
            sources.push(SourcePartition::new(&t.topic, p));
        }
    }
    let before = next_offsets(backend, &sources).await?;
    // 2. The pending batches, those that cannot be read included.
    let (mut pending, mut unreadable) = (Vec::new(), Vec::new());
    let mut after = None;
    loop {
        let page = backend.state.pending_page(after.as_deref(), 500).await?;
        pending.extend(page.batches);
        unreadable.extend(page.unreadable.into_iter().map(|(k, why)| {
            format!(
                "{}-{}@{}: {why}",
                k.source.topic, k.source.partition, k.first_offset
            )
        }));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    // 3. The tables.
    let engine = QueryEngine::new(backend, TimeTravel::Current).await?;
    let listed = engine.tables();
    let mut out = Audit {
        ok: true,
        tables: Vec::new(),
        unreadable_pending: unreadable,
    };
    for t in audited {
        let mut audit = TableAudit {
            table: t.name.clone(),
            topic: t.topic.clone(),
            partitions: Vec::new(),
            skipped: None,
        };
        if !t.land {
            audit.skipped = Some("land = false: the topic has no table of its own".into());
        } else if t.upsert.is_some() {
            audit.skipped = Some(
                "an upsert table: the rows its keys' later records replace are deleted by design"
                    .into(),
            );
        }
        if audit.skipped.is_none() {
            let mut pending_ranges: BTreeMap<i32, Vec<[i64; 2]>> = BTreeMap::new();
            for b in &pending {
                for r in b.ranges().filter(|r| r.source.topic == t.topic) {
                    pending_ranges
                        .entry(r.source.partition)
                        .or_default()
                        .push([r.first_offset, r.last_offset]);
                }
            }
            let has_table = listed.iter().any(|n| n == &t.name);
            let has_dead = listed.iter().any(|n| n == DEAD_LETTER_TABLE);
            let found = landed(&engine, &t.name, &t.topic, has_table, has_dead).await?;
            let mut partitions: Vec<i32> = before
                .keys()
                .filter(|(topic, _)| topic == &t.topic)
                .map(|(_, p)| *p)
                .collect();
            partitions.extend(found.keys().copied());
            partitions.sort_unstable();
            partitions.dedup();
            // 4. The checkpoints again: what was found must be below them.
            let again: Vec<SourcePartition> = partitions
                .iter()
                .map(|p| SourcePartition::new(&t.topic, *p))
                .collect();
            let now_at = next_offsets(backend, &again).await?;
            for p in partitions {
                let key = (t.topic.clone(), p);
                let next_offset = before.get(&key).copied().unwrap_or(0);
                let now = now_at.get(&key).copied().unwrap_or(0);
                let f = found.get(&p).cloned().unwrap_or_default();
                let pend = pending_ranges.remove(&p).unwrap_or_default();
                let missing = missing_ranges(&f.gaps, f.first, f.last, next_offset, &pend);
                let beyond_checkpoint = f.last.filter(|last| *last >= now).map(|last| [now, last]);
                audit.partitions.push(PartitionAudit {
                    partition: p,
                    first_offset: f.first,
                    verified_from: f
                        .first
                        .or_else(|| pend.iter().map(|r| r[0]).min())
                        .unwrap_or(0)
                        .min(next_offset),
                    next_offset,
                    rows: f.rows,
                    dead_letters: f.dead_letters,
                    pending: pend,
                    missing_offsets: missing.iter().map(|[a, b]| b - a + 1).sum(),
                    missing: missing.into_iter().take(MAX_LISTED).collect(),
                    duplicated_offsets: f.duplicated_offsets,
                    duplicates: f.duplicates,
                    beyond_checkpoint,
                });
            }
        }
        out.tables.push(audit);
    }
    out.ok = out.tables.iter().all(|t| {
        t.partitions.iter().all(|p| {
            p.missing_offsets == 0 && p.duplicated_offsets == 0 && p.beyond_checkpoint.is_none()
        })
    });
    Ok(out)
}

/// The checkpoints of `sources` (one batched read), by topic and partition.
async fn next_offsets(
    backend: &Backend,
    sources: &[SourcePartition],
) -> Result<BTreeMap<(String, i32), i64>> {
    Ok(backend
        .state
        .checkpoints(sources)
        .await?
        .into_iter()
        .zip(sources)
        .map(|(c, s)| ((s.topic.clone(), s.partition), c.next_offset))
        .collect())
}

/// What one partition's table and dead letters hold.
#[derive(Debug, Clone, Default)]
struct Found {
    first: Option<i64>,
    last: Option<i64>,
    rows: i64,
    dead_letters: i64,
    /// Ranges (inclusive) between offsets found, with none found inside.
    gaps: Vec<[i64; 2]>,
    duplicates: Vec<Duplicate>,
    duplicated_offsets: i64,
}

/// The Kafka positions of `table` (fed by `topic`) and of the topic's own dead letters, per
/// partition: one query reading only the Kafka columns, each offset once with its rows in
/// either, in order; the gaps and copies are found here in one pass.
async fn landed(
    engine: &QueryEngine,
    table: &str,
    topic: &str,
    has_table: bool,
    has_dead: bool,
) -> Result<BTreeMap<i32, Found>> {
    let mut parts = Vec::new();
    if has_table {
        parts.push(format!(
            "SELECT kafka_partition AS p, kafka_offset AS o, count(*) AS t, 0 AS d \
             FROM \"{table}\" GROUP BY 1, 2"
        ));
    }
    if has_dead {
        let kinds: Vec<String> = DERIVED_KINDS.iter().map(|k| format!("'{k}'")).collect();
        parts.push(format!(
            "SELECT kafka_partition AS p, kafka_offset AS o, 0 AS t, count(*) AS d \
             FROM {DEAD_LETTER_TABLE} WHERE topic = '{}' AND error_kind NOT IN ({}) GROUP BY 1, 2",
            topic.replace('\'', "''"),
            kinds.join(", ")
        ));
    }
    let mut out: BTreeMap<i32, Found> = BTreeMap::new();
    if parts.is_empty() {
        return Ok(out);
    }
    let batches = engine
        .query(&format!(
            "SELECT p, o, sum(t), sum(d) FROM ({}) u GROUP BY p, o ORDER BY p, o",
            parts.join(" UNION ALL ")
        ))
        .await?;
    for row in rows(&batches)? {
        let (p, o, t, d) = (row[0] as i32, row[1], row[2], row[3]);
        let f = out.entry(p).or_default();
        if let Some(last) = f.last
            && o > last + 1
        {
            f.gaps.push([last + 1, o - 1]);
        }
        f.first.get_or_insert(o);
        f.last = Some(o);
        f.rows += t;
        f.dead_letters += d;
        if t + d > 1 {
            f.duplicated_offsets += 1;
            if f.duplicates.len() < MAX_LISTED {
                f.duplicates.push(Duplicate {
                    offset: o,
                    in_table: t,
                    in_dead_letters: d,
                });
            }
        }
    }
    Ok(out)
}

/// Every row of `batches` as integers (NULL as 0).
fn rows(batches: &[RecordBatch]) -> Result<Vec<Vec<i64>>> {
    let mut out = Vec::new();
    for b in batches {
        let columns = b
            .columns()
            .iter()
            .map(|c| {
                let c = cast(c, &DataType::Int64).map_err(|e| Error::Internal(e.to_string()))?;
                c.as_any()
                    .downcast_ref::<Int64Array>()
                    .cloned()
                    .ok_or_else(|| Error::Internal("audit: a count is not an integer".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        for r in 0..b.num_rows() {
            out.push(
                columns
                    .iter()
                    .map(|c| if c.is_null(r) { 0 } else { c.value(r) })
                    .collect(),
            );
        }
    }
    Ok(out)
}

/// The offsets expected and not found, as inclusive ranges: the `gaps` between offsets found,
/// and what lies between the last one found (`last`) and the checkpoint (`next_offset`), but
/// for `pending` ranges (not committed yet). With nothing found, everything below the
/// checkpoint not pending is missing (from offset 0, or from the first pending batch: below it
/// nothing can be told).
pub fn missing_ranges(
    gaps: &[[i64; 2]],
    first: Option<i64>,
    last: Option<i64>,
    next_offset: i64,
    pending: &[[i64; 2]],
) -> Vec<[i64; 2]> {
    // Only below the checkpoint: a gap above it is of a batch not taken yet.
    let mut expected: Vec<[i64; 2]> = gaps
        .iter()
        .filter(|g| g[0] < next_offset)
        .map(|g| [g[0], g[1].min(next_offset - 1)])
        .collect();
    let tail_from = match (first, last) {
        (Some(_), Some(l)) => l + 1,
        _ => pending
            .iter()
            .map(|r| r[0])
            .min()
            .unwrap_or(0)
            .min(next_offset),
    };
    if tail_from < next_offset {
        expected.push([tail_from, next_offset - 1]);
    }
    let mut out = Vec::new();
    for r in expected {
        let mut pieces = vec![r];
        for p in pending {
            pieces = pieces
                .into_iter()
                .flat_map(|[a, b]| {
                    let mut left = Vec::new();
                    if a < p[0] {
                        left.push([a, b.min(p[0] - 1)]);
                    }
                    if b > p[1] {
                        left.push([a.max(p[1] + 1), b]);
                    }
                    left
                })
                .collect();
        }
        out.extend(pieces);
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::missing_ranges;

    #[test]
    fn missing_offsets_are_the_gaps_and_the_tail_but_what_is_pending() {
        // 0..=9 found but 4..=5, checkpoint 15, batch 12..=14 pending: 10..=11 lost.
        assert_eq!(
            missing_ranges(&[[4, 5]], Some(0), Some(9), 15, &[[12, 14]]),
            [[4, 5], [10, 11]]
        );
        // Everything accounted for.
        assert!(missing_ranges(&[], Some(0), Some(9), 10, &[]).is_empty());
        assert!(missing_ranges(&[], Some(0), Some(9), 20, &[[10, 19]]).is_empty());
        // A pending batch in the middle of a gap splits it.
        assert_eq!(
            missing_ranges(&[[3, 10]], Some(0), Some(20), 21, &[[5, 6]]),
            [[3, 4], [7, 10]]
        );
        // Gaps above the checkpoint are not expected yet.
        assert_eq!(
            missing_ranges(&[[3, 4], [8, 12]], Some(0), Some(20), 10, &[]),
            [[3, 4], [8, 9]]
        );
        // Nothing found: below the checkpoint, all but the pending batches.
        assert_eq!(missing_ranges(&[], None, None, 5, &[]), [[0, 4]]);
        assert!(missing_ranges(&[], None, None, 5, &[[3, 4]]).is_empty());
        assert!(missing_ranges(&[], None, None, 0, &[]).is_empty());
    }
}
