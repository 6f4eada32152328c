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
//! The ledger of delivered offsets ([`crate::ledger`]), which every commit folds into the
//! topic's table's properties, tells an offset Kafka itself skips (a transaction's marker,
//! aborted records, a compacted topic) from a lost one ([`expect`]): offsets never delivered
//! are listed, not failed, on a partition whose batches saw such gaps; on one whose batches
//! never did, offsets no batch took were skipped by the event source, and fail. Below the
//! ledger's first range (history older than it) every offset is expected. With the topic's
//! log (`--bootstrap-servers`), every committed record below the checkpoint must have landed.
//! An upsert table is not audited here (it deletes the rows its keys' later records replace);
//! the commit stage checks each of its rounds.

pub mod expect;
pub mod given_up;

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use serde::Serialize;

use crate::backend::Backend;
use crate::checkpoint::SourcePartition;
use crate::commit::audit::DERIVED_KINDS;
use crate::error::{Error, Result};
use crate::ledger::{Fold, LEDGER_PROPERTY_PREFIX, Ledger};
use crate::query::{QueryEngine, TimeTravel};
use crate::spec::{DEAD_LETTER_TABLE, PipelineSpec};
pub use expect::Miscount;
use expect::Shape;

/// Most duplicated offsets and missing ranges listed per table (the counts are always whole).
pub const MAX_LISTED: usize = 1000;

/// One offset found more than once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Duplicate {
    /// The offset.
    pub offset: i64,
    /// Its rows in the table.
    pub in_table: i64,
    /// Its rows in `dead_letters`.
    pub in_dead_letters: i64,
    /// The live data files whose Kafka column bounds hold it (`path (snapshot id)`): the copies
    /// are in these.
    pub files: Vec<String>,
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
    /// The first offset the partition took, as its checkpoint says (`None`: not known, a
    /// checkpoint an earlier release created).
    pub first_taken: Option<i64>,
    /// Offset ranges (inclusive) of batches the event source gave up on (its on-failure
    /// destination's records).
    pub given_up: Vec<[i64; 2]>,
    /// Rows in the table.
    pub rows: i64,
    /// Rows in `dead_letters` (the topic's own rejections).
    pub dead_letters: i64,
    /// Offset ranges (inclusive) of batches not committed yet: not expected yet.
    pub pending: Vec<[i64; 2]>,
    /// Why the partition's ledger could not be read, if so (checked as if it had none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_error: Option<String>,
    /// Offset ranges (inclusive) no batch that landed took, in batches the event source gave
    /// up on: counted as missing until a replay lands them (or the log, `--bootstrap-servers`,
    /// says they held no record).
    pub skipped: Vec<[i64; 2]>,
    /// Offsets skipped in all.
    pub skipped_offsets: i64,
    /// Offsets delivered, by the ledger (`None`: the partition has no ledger yet).
    pub delivered: Option<u64>,
    /// Where the ledger starts: below it every offset is expected.
    pub ledger_from: Option<i64>,
    /// Offset ranges (inclusive) delivered (or older than the ledger) and found nowhere.
    pub missing: Vec<[i64; 2]>,
    /// How many offsets are missing in all (in `missing`, and what `short` ranges lack).
    pub missing_offsets: i64,
    /// Ranges delivered with Kafka's gaps inside that hold fewer offsets than were delivered.
    pub short: Vec<Miscount>,
    /// Ranges delivered with Kafka's gaps inside that hold more offsets than were delivered.
    pub surplus: Vec<Miscount>,
    /// Offset ranges (inclusive) the event source never delivered: gaps of the topic's log, or
    /// records it skipped (see `--bootstrap-servers`).
    pub not_delivered: Vec<[i64; 2]>,
    /// How many offsets were not delivered in all.
    pub not_delivered_offsets: i64,
    /// The comparison with the topic-partition's log (`--bootstrap-servers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<LogCheck>,
    /// Offsets found more than once (the first [`MAX_LISTED`]).
    pub duplicates: Vec<Duplicate>,
    /// How many offsets are found more than once in all.
    pub duplicated_offsets: i64,
    /// Offsets found at or above the partition's checkpoint (read again after the tables): the
    /// checkpoint went back (a reset or restored state store), and those offsets will land
    /// again.
    pub beyond_checkpoint: Option<[i64; 2]>,
    /// An upsert table's count of the records its entries hold (`None`: not an upsert table,
    /// or audited `--since`, where only batches lost or skipped are named).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upsert: Option<expect::UpsertCount>,
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
    /// What the audit of it does differently from what was asked, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
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
    /// The batches the event source gave up on, as read (`None`: not read).
    pub failed_batches: Option<FailedBatchesRead>,
}

/// Where the batches an event source gave up on were read, and what of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedBatchesRead {
    /// The location (`--failed-batches`).
    pub location: String,
    /// Records read.
    pub batches: usize,
    /// Records that could not be read, with why.
    pub unreadable: Vec<String>,
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
    audit_with(
        backend,
        spec,
        &AuditOptions {
            only,
            ..Default::default()
        },
    )
    .await
}

/// What an audit covers.
#[derive(Default)]
pub struct AuditOptions<'a> {
    /// Only this topic's table.
    pub only: Option<&'a str>,
    /// Only from each partition's first offset stamped at or after this time (epoch ms) on.
    pub since_ms: Option<i64>,
    /// The topics' own logs to compare with.
    pub log: Option<&'a dyn TopicLog>,
    /// The batches the event source gave up on (its on-failure destination's records), by
    /// topic-partition: ranges (inclusive, sorted, apart). `None`: not read.
    pub given_up: Option<&'a GivenUp>,
    /// Tables not to audit (`--skip`): they pass, said so.
    pub skip: &'a [String],
}

/// The offset ranges (inclusive, sorted, apart) of the batches an event source gave up on, by
/// topic-partition, as its on-failure destination's records say ([`given_up`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GivenUp {
    /// Ranges per topic-partition.
    pub ranges: BTreeMap<SourcePartition, Vec<[i64; 2]>>,
    /// Records read.
    pub batches: usize,
    /// Records that could not be read, each with why.
    pub unreadable: Vec<String>,
}

impl GivenUp {
    /// Adds a failed batch's records.
    pub fn add(&mut self, event: &crate::esm::EsmEvent) -> Result<()> {
        for (source, records) in crate::ingest::group_by_partition(event)? {
            let (Some(lo), Some(hi)) = (
                records.iter().map(|r| r.offset).min(),
                records.iter().map(|r| r.offset).max(),
            ) else {
                continue;
            };
            let list = self.ranges.entry(source).or_default();
            list.push([lo, hi]);
            list.sort_unstable();
            let mut joined: Vec<[i64; 2]> = Vec::with_capacity(list.len());
            for [a, b] in list.drain(..) {
                match joined.last_mut() {
                    Some(prev) if a <= prev[1].saturating_add(1) => prev[1] = prev[1].max(b),
                    _ => joined.push([a, b]),
                }
            }
            *list = joined;
        }
        self.batches += 1;
        Ok(())
    }
}

/// What a topic-partition's log holds (read by `--bootstrap-servers`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRead {
    /// The log's first offset (its low watermark).
    pub low: i64,
    /// The offsets of its committed records read, in order (aborted records and transaction
    /// markers are not records).
    pub offsets: Vec<i64>,
}

/// A topic's log, read for the audit.
pub trait TopicLog: Send + Sync {
    /// The committed records of `topic`-`partition` from `from` (or the log's start, if later)
    /// up to `to` (exclusive).
    fn read<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        from: i64,
        to: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<LogRead>> + Send + 'a>>;
}

/// The audit's comparison with a topic-partition's own log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogCheck {
    /// The log's first offset.
    pub log_from: i64,
    /// Committed records of the log below the checkpoint (and not pending).
    pub records: u64,
    /// Offset ranges whose records are in the log but in neither table: lost (delivered or
    /// not), the first [`MAX_LISTED`].
    pub not_landed: Vec<[i64; 2]>,
    /// Records not landed, in all.
    pub not_landed_offsets: i64,
    /// Records in the log below the first offset the pipeline took (it started after them,
    /// or they were lost before it): not failed, reported.
    pub before_first: u64,
}

/// [`audit`], from `since_ms` on when given (per partition, from its first offset stamped at
/// or after it), comparing each topic-partition with its own log when `log` is given: every
/// committed record of the log below the checkpoint (but pending batches') must be in the
/// topic's table or in `dead_letters`.
pub async fn audit_with(
    backend: &Backend,
    spec: &PipelineSpec,
    options: &AuditOptions<'_>,
) -> Result<Audit> {
    let (only, log) = (options.only, options.log);
    // Since the epoch or before: everything (a Kafka timestamp of -1 is before it).
    let since_ms = options.since_ms.filter(|ms| *ms > 0);
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
    let before_checkpoints = checkpoints(backend, &sources).await?;
    let before: BTreeMap<(String, i32), i64> = before_checkpoints
        .iter()
        .map(|(k, c)| (k.clone(), c.next_offset))
        .collect();
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
        failed_batches: None,
    };
    for t in audited {
        let mut audit = TableAudit {
            table: t.name.clone(),
            topic: t.topic.clone(),
            partitions: Vec::new(),
            skipped: None,
            notes: Vec::new(),
        };
        if !t.land {
            audit.skipped = Some("land = false: the topic has no table of its own".into());
        } else if options.skip.iter().any(|s| s == &t.name) {
            audit.skipped = Some("--skip".into());
        }
        if audit.skipped.is_none() {
            let mut pending_ranges: BTreeMap<i32, Vec<[i64; 2]>> = BTreeMap::new();
            for b in &pending {
                for r in b.ranges().filter(|r| r.source.topic == t.topic) {
                    pending_ranges
                        .entry(r.source.partition)
                        .or_default()
                        // From the checkpoint it started at: what lies before its first
                        // record is its business too.
                        .push([b.delivery.entry(&r).first, r.last_offset]);
                }
            }
            let has_table = listed.iter().any(|n| n == &t.name);
            let has_dead = listed.iter().any(|n| n == DEAD_LETTER_TABLE);
            let mut ledgers = ledgers(backend, &t.topic, &t.name).await?;
            // An upsert table's counts are of whole partitions: audited whole, whatever --since.
            let since_ms = match (since_ms, &t.upsert) {
                (Some(_), Some(_)) => {
                    audit.notes.push(
                        "audited whole, not --since: an upsert table's records are counted (rows, tombstones, rows compaction dropped), and the counts are of whole partitions".into(),
                    );
                    None
                }
                (ms, _) => ms,
            };
            let starts = match since_ms {
                Some(ms) => {
                    let mut starts =
                        first_since(&engine, &t.name, &t.topic, has_table, has_dead, ms).await?;
                    // Where the ledger's time marks say the records stamped since start, when
                    // that is earlier than the first one found (rows lost right after the time
                    // are below it). A partition with no mark that late starts after its
                    // ledger, or after its last offset found if earlier (records its checkpoint
                    // moved past without landing them have no stamp to go by).
                    for (p, marks) in stamps(backend, &t.topic, &t.name).await? {
                        let after_ledger = match ledgers.get(&p) {
                            Some(Ok(l)) => l.end().map(|e| e.saturating_add(1)),
                            _ => None,
                        };
                        if let Some(from) = marks.start_since(ms).or(after_ledger) {
                            let start = starts.entry(p).or_insert(from);
                            *start = (*start).min(from);
                        }
                    }
                    // From the start of the ledger's sparse entry that holds the cut, so that
                    // it is counted whole (a whole range is checked offset by offset).
                    for (p, from) in starts.iter_mut() {
                        if let Some(Ok(l)) = ledgers.get(p)
                            && let Some(start) = l.sparse_start(*from)
                        {
                            *from = (*from).min(start);
                        }
                    }
                    Some(starts)
                }
                None => None,
            };
            let old_logs = resets(backend, &t.topic, &t.name).await?;
            // An upsert table's rows are read from its data files, the rows its position
            // deletes delete included: every record it was delivered is one of them (until
            // compaction drops it, counted), a tombstone (counted) or a dead letter.
            let raw = match (&t.upsert, has_table) {
                (Some(_), true) => {
                    let (table, _) = backend
                        .catalog
                        .load(&ident(backend, &t.name))
                        .await?
                        .ok_or_else(|| Error::Config(format!("table {} is gone", t.name)))?;
                    let (raw, unreadable) =
                        crate::commit::audit::raw_positions(&table, &t.topic, &old_logs).await?;
                    if !unreadable.is_empty() {
                        audit.skipped = Some(format!(
                            "{} data file(s) cannot be read: {}",
                            unreadable.len(),
                            unreadable.join("; ")
                        ));
                    }
                    Some(raw)
                }
                _ => None,
            };
            let counted_by = counts(backend, &t.topic, &t.name).await?;
            let found = landed(
                &engine,
                &t.name,
                &t.topic,
                has_table && raw.is_none(),
                has_dead,
                starts.as_ref(),
                raw,
                &old_logs,
            )
            .await?;
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
            let mut no_ledger: Vec<i32> = Vec::new();
            let now_at: BTreeMap<(String, i32), i64> = checkpoints(backend, &again)
                .await?
                .into_iter()
                .map(|(k, c)| (k, c.next_offset))
                .collect();
            for p in partitions {
                let key = (t.topic.clone(), p);
                let next_offset = before.get(&key).copied().unwrap_or(0);
                let now = now_at.get(&key).copied().unwrap_or(0);
                let f = found.get(&p).cloned().unwrap_or_default();
                let pend = pending_ranges.remove(&p).unwrap_or_default();
                let (ledger, ledger_error) = match ledgers.remove(&p) {
                    Some(Ok(l)) => (l, None),
                    Some(Err(why)) => (Ledger::default(), Some(why)),
                    None => (Ledger::default(), None),
                };
                let from = starts.as_ref().and_then(|s| s.get(&p).copied());
                let pend: Vec<[i64; 2]> = match from {
                    Some(from) => pend.into_iter().filter(|r| r[1] >= from).collect(),
                    None => pend,
                };
                let first_taken = before_checkpoints
                    .get(&key)
                    .map(|c| c.first_offset)
                    .filter(|f| *f >= 0);
                let given_up: Vec<[i64; 2]> = options
                    .given_up
                    .and_then(|g| g.ranges.get(&SourcePartition::new(&t.topic, p)))
                    .map(|r| r.iter().copied().filter(|r| r[0] < next_offset).collect())
                    .unwrap_or_default();
                let v = expect::judge_with(
                    &f.shape,
                    &expect::Expected {
                        next_offset,
                        pending: &pend,
                        ledger: &ledger,
                        from,
                        first: first_taken,
                        given_up: &given_up,
                    },
                );
                let beyond_checkpoint = f
                    .shape
                    .last
                    .filter(|last| *last >= now)
                    .map(|last| [now, last]);
                let lowest = [
                    f.shape.first,
                    ledger.start().filter(|_| from.is_none()),
                    first_taken.filter(|_| from.is_none()),
                    pend.iter().map(|r| r[0]).min(),
                ];
                let verified_from = lowest
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(0)
                    .min(next_offset);
                let mut v = v;
                // An upsert table: holes inside the ledger's entries are counted, not named.
                let upsert = match &t.upsert {
                    Some(_)
                        if ledger.is_empty() && (f.shape.first.is_some() || next_offset > 0) =>
                    {
                        no_ledger.push(p);
                        None
                    }
                    Some(_) => {
                        let uncovered = expect::uncovered(&v, &ledger);
                        // Skipped: the holes a batch the event source gave up on holds, and
                        // no replay landed (rows replace one another here, so a hole alone
                        // says nothing: a replayed tombstone is one too).
                        let replayed: Vec<[i64; 2]> = ledger
                            .replayed()
                            .iter()
                            .map(|d| [d.first, d.last])
                            .collect();
                        v.skipped = expect::within(&v.holes, &given_up)
                            .into_iter()
                            .flat_map(|h| expect::within(&[h], &ledger_ranges(&ledger)))
                            .flat_map(|h| expect::outside(h, &replayed))
                            .collect();
                        v.skipped_offsets = v
                            .skipped
                            .iter()
                            .map(|[a, b]| b.saturating_sub(*a).saturating_add(1))
                            .sum();
                        // Counts are of the partition's whole history: not for one moved to
                        // a new log (its old log's rows are not told apart here).
                        let count = (from.is_none() && !old_logs.contains_key(&p)).then(|| {
                            let c = counted_by.get(&p).copied().unwrap_or_default();
                            expect::upsert_count(&v, &ledger, c.tombstones, c.dropped)
                        });
                        let unaccounted = count.as_ref().map_or(0, |c| c.unaccounted().max(0));
                        let named: i64 = uncovered
                            .iter()
                            .map(|[a, b]| b.saturating_sub(*a).saturating_add(1))
                            .sum();
                        v.missing_offsets = named
                            .saturating_add(v.skipped_offsets)
                            .saturating_add(unaccounted);
                        let mut holes: Vec<[i64; 2]> =
                            uncovered.iter().chain(&v.skipped).copied().collect();
                        holes.sort_unstable();
                        v.missing = uncovered;
                        v.holes = holes;
                        v.short.clear();
                        v.surplus.clear();
                        v.not_delivered.clear();
                        v.not_delivered_offsets = 0;
                        count
                    }
                    None => None,
                };
                let log_check = match log {
                    Some(log) if next_offset > 0 => {
                        let read = log
                            .read(&t.topic, p, from.unwrap_or(0), next_offset)
                            .await?;
                        Some(expect::against_log(&v.holes, verified_from, &pend, &read))
                    }
                    _ => None,
                };
                if log_check.is_some() {
                    // The log says which of the offsets skipped between batches were records.
                    v.missing_offsets -= v.skipped_offsets;
                }
                audit.partitions.push(PartitionAudit {
                    ledger_error,
                    skipped_offsets: v.skipped_offsets,
                    skipped: v.skipped.iter().copied().take(MAX_LISTED).collect(),
                    partition: p,
                    log: log_check,
                    first_offset: f.shape.first,
                    verified_from,
                    next_offset,
                    first_taken,
                    given_up,
                    rows: f.rows,
                    dead_letters: f.dead_letters,
                    pending: pend,
                    delivered: (!ledger.is_empty()).then(|| ledger.delivered()),
                    ledger_from: ledger.start(),
                    missing_offsets: v.missing_offsets,
                    missing: v.missing.into_iter().take(MAX_LISTED).collect(),
                    short: v.short.into_iter().take(MAX_LISTED).collect(),
                    surplus: v.surplus.into_iter().take(MAX_LISTED).collect(),
                    not_delivered_offsets: v.not_delivered_offsets,
                    not_delivered: v.not_delivered.into_iter().take(MAX_LISTED).collect(),
                    duplicated_offsets: f.duplicated_offsets,
                    duplicates: holders(backend, &t.name, &t.topic, f.duplicates.clone(), p)
                        .await
                        .unwrap_or_else(|e| {
                            tracing::warn!(table = %t.name, error = %e,
                                "the files holding duplicated offsets could not be named");
                            f.duplicates
                        }),
                    beyond_checkpoint,
                    upsert,
                });
            }
            if !no_ledger.is_empty() && audit.skipped.is_none() {
                audit.skipped = Some(format!(
                    "partition(s) {no_ledger:?} have no ledger of delivered offsets yet (their rounds were committed by an earlier release): the next commit of each starts it; --skip {} passes the table meanwhile",
                    t.name
                ));
            }
        }
        out.tables.push(audit);
    }
    out.ok = out.tables.iter().all(|t| {
        // A table that could not be audited fails the audit, but one the topic does not land
        // and one skipped by request.
        let unaudited = t
            .skipped
            .as_deref()
            .is_some_and(|why| why != "--skip" && !why.starts_with("land = false"));
        !unaudited
            && t.partitions.iter().all(|p| {
                p.missing_offsets == 0
                    && p.duplicated_offsets == 0
                    && p.beyond_checkpoint.is_none()
                    && p.surplus.is_empty()
                    && p.log.as_ref().is_none_or(|l| l.not_landed_offsets == 0)
                    && p.upsert.as_ref().is_none_or(|u| u.unaccounted() == 0)
            })
    });
    Ok(out)
}

/// The Iceberg identifier of table `name` in the backend's namespace.
fn ident(backend: &Backend, name: &str) -> iceberg::TableIdent {
    iceberg::TableIdent::new(
        iceberg::NamespaceIdent::new(backend.namespace.clone()),
        name.to_string(),
    )
}

/// The checkpoints of `sources` (one batched read), by topic and partition.
async fn checkpoints(
    backend: &Backend,
    sources: &[SourcePartition],
) -> Result<BTreeMap<(String, i32), crate::checkpoint::Checkpoint>> {
    Ok(backend
        .state
        .checkpoints(sources)
        .await?
        .into_iter()
        .zip(sources)
        .map(|(c, s)| ((s.topic.clone(), s.partition), c))
        .collect())
}

/// The ledger of delivered offsets of `topic`'s partitions, from its own table's properties
/// (`streamtable.ledger.{topic}-{partition}`, folded by every commit); one that cannot be read
/// is reported for its partition alone.
async fn ledgers(
    backend: &Backend,
    topic: &str,
    table: &str,
) -> Result<BTreeMap<i32, std::result::Result<Ledger, String>>> {
    let prefix = format!("{LEDGER_PROPERTY_PREFIX}{topic}-");
    let ident = ident(backend, table);
    let mut out = BTreeMap::new();
    let Some((t, _)) = backend.catalog.load(&ident).await? else {
        return Ok(out);
    };
    for (key, value) in t.metadata().properties() {
        let Some(p) = key
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let ledger = Fold::decode(value)
            .map(|f| Ledger::from_fold(&f))
            .map_err(|why| format!("table {table}'s property {key} cannot be read ({why}); offsets are checked as if it had no ledger"));
        out.insert(p, ledger);
    }
    Ok(out)
}

/// The ranges (inclusive, sorted) the ledger's entries cover.
fn ledger_ranges(ledger: &Ledger) -> Vec<[i64; 2]> {
    let mut r: Vec<[i64; 2]> = ledger
        .whole()
        .iter()
        .copied()
        .chain(ledger.sparse().map(|d| [d.first, d.last]))
        .collect();
    r.sort_unstable();
    r
}

/// Partitions of `topic` moved to a new log (`streamtable reset-partition`): the old log's
/// checkpoint and latest timestamp, from the topic's table's properties.
async fn resets(backend: &Backend, topic: &str, table: &str) -> Result<BTreeMap<i32, (i64, i64)>> {
    let prefix = format!("{}{topic}-", crate::commit::ledger::RESET_PROPERTY_PREFIX);
    let mut out = BTreeMap::new();
    let Some((t, _)) = backend.catalog.load(&ident(backend, table)).await? else {
        return Ok(out);
    };
    for (key, value) in t.metadata().properties() {
        let Some(p) = key
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some((o, ms)) = value
            .split_once('@')
            .and_then(|(o, ms)| Some((o.parse::<i64>().ok()?, ms.parse::<i64>().ok()?)))
        {
            out.insert(p, (o, ms));
        }
    }
    Ok(out)
}

/// What `topic`'s upsert table counted of its partitions' records other than rows
/// ([`crate::ledger::Counted`]); counts that cannot be read count as none (the audit then
/// finds those records unaccounted for).
async fn counts(
    backend: &Backend,
    topic: &str,
    table: &str,
) -> Result<BTreeMap<i32, crate::ledger::Counted>> {
    let prefix = format!("{}{topic}-", crate::ledger::COUNTED_PROPERTY_PREFIX);
    let mut out = BTreeMap::new();
    let Some((t, _)) = backend.catalog.load(&ident(backend, table)).await? else {
        return Ok(out);
    };
    for (key, value) in t.metadata().properties() {
        let Some(p) = key
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(c) = crate::ledger::Counted::decode(value) {
            out.insert(p, c);
        }
    }
    Ok(out)
}

/// The time marks of `topic`'s partitions ([`crate::ledger::Stamps`]), from its own table's
/// properties; marks that cannot be read are left out (the audit then starts the partition
/// from what it finds).
async fn stamps(
    backend: &Backend,
    topic: &str,
    table: &str,
) -> Result<BTreeMap<i32, crate::ledger::Stamps>> {
    let prefix = format!("{}{topic}-", crate::ledger::STAMPS_PROPERTY_PREFIX);
    let mut out = BTreeMap::new();
    let Some((t, _)) = backend.catalog.load(&ident(backend, table)).await? else {
        return Ok(out);
    };
    for (key, value) in t.metadata().properties() {
        let Some(p) = key
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(s) = crate::ledger::Stamps::decode(value) {
            out.insert(p, s);
        }
    }
    Ok(out)
}

/// `dups` of partition `p` with the live data files of `table` and of `dead_letters` (of
/// `topic`) whose column bounds hold each, and the snapshots that added them: read from the
/// manifests only.
async fn holders(
    backend: &Backend,
    table: &str,
    topic: &str,
    mut dups: Vec<Duplicate>,
    p: i32,
) -> Result<Vec<Duplicate>> {
    use iceberg::spec::{Datum, PrimitiveLiteral};
    if dups.is_empty() {
        return Ok(dups);
    }
    let int = |d: Option<&Datum>| match d.map(Datum::literal) {
        Some(PrimitiveLiteral::Int(v)) => Some(i64::from(*v)),
        Some(PrimitiveLiteral::Long(v)) => Some(*v),
        _ => None,
    };
    let text = |d: Option<&Datum>| match d.map(Datum::literal) {
        Some(PrimitiveLiteral::String(v)) => Some(v.clone()),
        _ => None,
    };
    for name in [table, DEAD_LETTER_TABLE] {
        let ident = ident(backend, name);
        let Some((t, _)) = backend.catalog.load(&ident).await? else {
            continue;
        };
        let schema = t.metadata().current_schema().clone();
        let id = |c: &str| schema.field_by_name(c).map(|f| f.id);
        let (Some(pid), Some(oid)) = (id("kafka_partition"), id("kafka_offset")) else {
            continue;
        };
        let tid = (name == DEAD_LETTER_TABLE).then(|| id("topic")).flatten();
        let files = crate::table::files::load_current(&t).await?;
        for e in files.live() {
            let f = e.entry.data_file();
            let (lo, hi) = (f.lower_bounds(), f.upper_bounds());
            let in_range = |id: i32, v: i64| {
                int(lo.get(&id)).is_none_or(|l| l <= v) && int(hi.get(&id)).is_none_or(|h| v <= h)
            };
            if !in_range(pid, i64::from(p)) {
                continue;
            }
            if let Some(tid) = tid {
                let t = topic.to_string();
                let below = text(lo.get(&tid)).is_some_and(|l| l > t);
                let above = text(hi.get(&tid)).is_some_and(|h| h < t);
                if below || above {
                    continue;
                }
            }
            let label = format!(
                "{} (snapshot {})",
                f.file_path(),
                e.entry
                    .snapshot_id()
                    .map_or_else(|| "?".to_string(), |s| s.to_string())
            );
            for d in dups.iter_mut().filter(|d| in_range(oid, d.offset)) {
                match d.files.len() {
                    0..10 => d.files.push(label.clone()),
                    10 => d.files.push("…".to_string()),
                    _ => {}
                }
            }
        }
    }
    Ok(dups)
}

/// What one partition's table and dead letters hold.
#[derive(Debug, Clone, Default)]
struct Found {
    shape: Shape,
    rows: i64,
    dead_letters: i64,
    duplicates: Vec<Duplicate>,
    duplicated_offsets: i64,
}

/// The Kafka positions of `table` (fed by `topic`) and of the topic's own dead letters, per
/// partition: one query reading only the Kafka columns, each offset once with its rows in
/// either, in order; the gaps and copies are found here in one pass.
#[allow(clippy::too_many_arguments)]
async fn landed(
    engine: &QueryEngine,
    table: &str,
    topic: &str,
    has_table: bool,
    has_dead: bool,
    starts: Option<&BTreeMap<i32, i64>>,
    raw: Option<BTreeMap<i32, Vec<i64>>>,
    old_logs: &BTreeMap<i32, (i64, i64)>,
) -> Result<BTreeMap<i32, Found>> {
    // With a start per partition: the lowest pushed down, each applied below.
    let lowest = starts.and_then(|s| s.values().min().copied());
    let mut above = lowest.map_or_else(String::new, |o| format!(" AND kafka_offset >= {o}"));
    // Partitions moved to a new log: the old log's rows (below its checkpoint, stamped at or
    // before its latest record) are not the new log's.
    for (p, (checkpoint, newest)) in old_logs {
        let stamped = if *newest >= 0 {
            format!(" AND kafka_timestamp <= to_timestamp_millis({newest})")
        } else {
            String::new()
        };
        above.push_str(&format!(
            " AND NOT (kafka_partition = {p} AND kafka_offset < {checkpoint}{stamped})"
        ));
    }
    let mut parts = Vec::new();
    if has_table {
        parts.push(format!(
            "SELECT kafka_partition AS p, kafka_offset AS o, count(*) AS t, 0 AS d \
             FROM \"{table}\" WHERE true{above} GROUP BY 1, 2"
        ));
    }
    if has_dead {
        let kinds: Vec<String> = DERIVED_KINDS.iter().map(|k| format!("'{k}'")).collect();
        parts.push(format!(
            "SELECT kafka_partition AS p, kafka_offset AS o, 0 AS t, count(*) AS d \
             FROM {DEAD_LETTER_TABLE} WHERE topic = '{}' AND error_kind NOT IN ({}){above} GROUP BY 1, 2",
            topic.replace('\'', "''"),
            kinds.join(", ")
        ));
    }
    let mut out: BTreeMap<i32, Found> = BTreeMap::new();
    let mut counted: Vec<Vec<i64>> = if parts.is_empty() {
        Vec::new()
    } else {
        let batches = engine
            .query(&format!(
                "SELECT p, o, sum(t), sum(d) FROM ({}) u GROUP BY p, o ORDER BY p, o",
                parts.join(" UNION ALL ")
            ))
            .await?;
        rows(&batches)?
    };
    // Rows read from the data files themselves (an upsert table's, deleted ones included),
    // merged in offset order.
    if let Some(raw) = raw {
        let mut by: BTreeMap<(i64, i64), (i64, i64)> = counted
            .iter()
            .map(|r| ((r[0], r[1]), (r[2], r[3])))
            .collect();
        for (p, offsets) in raw {
            for o in offsets {
                if lowest.is_some_and(|l| o < l) {
                    continue;
                }
                by.entry((i64::from(p), o)).or_default().0 += 1;
            }
        }
        counted = by
            .into_iter()
            .map(|((p, o), (t, d))| vec![p, o, t, d])
            .collect();
    }
    for row in counted {
        let (p, o, t, d) = (row[0] as i32, row[1], row[2], row[3]);
        if starts.is_some_and(|s| s.get(&p).is_some_and(|from| o < *from)) {
            continue;
        }
        let f = out.entry(p).or_default();
        if let Some(last) = f.shape.last
            && o > last + 1
        {
            f.shape.gaps.push([last + 1, o - 1]);
        }
        f.shape.first.get_or_insert(o);
        f.shape.last = Some(o);
        f.rows += t;
        f.dead_letters += d;
        if t + d > 1 {
            f.duplicated_offsets += 1;
            if f.duplicates.len() < MAX_LISTED {
                f.duplicates.push(Duplicate {
                    offset: o,
                    in_table: t,
                    in_dead_letters: d,
                    files: Vec::new(),
                });
            }
        }
    }
    Ok(out)
}

/// Per partition, the lowest offset of `table` and of the topic's dead letters stamped at or
/// after `since_ms`.
async fn first_since(
    engine: &QueryEngine,
    table: &str,
    topic: &str,
    has_table: bool,
    has_dead: bool,
    since_ms: i64,
) -> Result<BTreeMap<i32, i64>> {
    let at = format!("to_timestamp_millis({since_ms})");
    let mut parts = Vec::new();
    if has_table {
        parts.push(format!(
            "SELECT kafka_partition AS p, min(kafka_offset) AS o FROM \"{table}\" \
             WHERE kafka_timestamp >= {at} GROUP BY 1"
        ));
    }
    if has_dead {
        parts.push(format!(
            "SELECT kafka_partition AS p, min(kafka_offset) AS o FROM {DEAD_LETTER_TABLE} \
             WHERE topic = '{}' AND kafka_timestamp >= {at} GROUP BY 1",
            topic.replace('\'', "''")
        ));
    }
    let mut out: BTreeMap<i32, i64> = BTreeMap::new();
    if parts.is_empty() {
        return Ok(out);
    }
    let batches = engine
        .query(&format!(
            "SELECT p, min(o) FROM ({}) u GROUP BY p",
            parts.join(" UNION ALL ")
        ))
        .await?;
    for row in rows(&batches)? {
        out.insert(row[0] as i32, row[1]);
    }
    // A partition with nothing stamped since: from after its last offset found (what its
    // checkpoint moved past since must still be accounted for).
    let mut last = Vec::new();
    if has_table {
        last.push(format!(
            "SELECT kafka_partition AS p, max(kafka_offset) AS o FROM \"{table}\" GROUP BY 1"
        ));
    }
    if has_dead {
        last.push(format!(
            "SELECT kafka_partition AS p, max(kafka_offset) AS o FROM {DEAD_LETTER_TABLE} \
             WHERE topic = '{}' GROUP BY 1",
            topic.replace('\'', "''")
        ));
    }
    let batches = engine
        .query(&format!(
            "SELECT p, max(o) FROM ({}) u GROUP BY p",
            last.join(" UNION ALL ")
        ))
        .await?;
    for row in rows(&batches)? {
        out.entry(row[0] as i32)
            .or_insert_with(|| row[1].saturating_add(1));
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
