//! The audit of one commit round: the round's own files hold, per topic-partition, every
//! record its batches were delivered (their ledger entries, see [`crate::ledger`]) exactly
//! once — in the topic's table (its rows, and for an upsert table its tombstones' key deletes)
//! or in `dead_letters`. It reads only the Kafka columns of the files the round just committed,
//! so its cost follows the round's rows, and it never fails the round: what it finds is
//! reported (`streamtable scheduled`, the `Audit…` metrics and their alarm), and
//! `streamtable audit` names the offsets.

use std::collections::BTreeMap;

use arrow_array::{Array, Int32Array, Int64Array, RecordBatch, StringArray};
use serde::Serialize;

use super::select::{Selector, TableFiles};
use crate::checkpoint::PendingBatch;
use crate::error::{Error, Result};
use crate::ledger::{self, Delivered};
use crate::spec::DEAD_LETTER_TABLE;
use crate::tables::TableSet;

/// Dead-letter kinds a derived table gives a record the topic's own table kept.
pub const DERIVED_KINDS: [&str; 3] = ["transform", "late", "future"];

/// Most findings a report lists (the counts are always whole).
const MAX_FINDINGS: usize = 20;

/// Most files a round's audit reads back (each takes a few GETs); a larger round (a backlog
/// caught up) is left to `streamtable audit`, and counted.
pub const MAX_FILES: usize = 400;

/// What the audits of a run's rounds found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RoundAudit {
    /// Rounds audited.
    pub rounds: u64,
    /// Rounds too large to read back ([`MAX_FILES`]).
    pub skipped_rounds: u64,
    /// Records delivered in the rounds' batches, of topics with a table of their own.
    pub delivered: u64,
    /// Of those, records in none of the round's files.
    pub missing: u64,
    /// Offsets found more than once in the round's files (the copies past the first).
    pub duplicated: u64,
    /// Offsets in the round's files that none of its batches delivered, or more of them in a
    /// range than it delivered.
    pub unexpected: u64,
    /// Files that could not be read: the rows they hold are not known, so records missing
    /// from their topics are not counted in that round.
    pub unreadable: u64,
    /// What was found, the first ones.
    pub findings: Vec<String>,
    /// Time the audits took.
    pub duration_ms: f64,
}

impl RoundAudit {
    /// Whether the rounds landed every delivered record exactly once.
    pub fn ok(&self) -> bool {
        self.missing == 0 && self.duplicated == 0 && self.unexpected == 0
    }

    /// Records missing, duplicated or unexpected, and files that could not be read back (one
    /// deleted or damaged after its commit looks so): what the `AuditMismatches` metric, and
    /// its alarm, count.
    pub fn mismatches(&self) -> u64 {
        self.missing
            .saturating_add(self.duplicated)
            .saturating_add(self.unexpected)
            .saturating_add(self.unreadable)
    }

    /// Adds another run's (or round's) audit.
    pub fn add(&mut self, other: RoundAudit) {
        self.rounds += other.rounds;
        self.skipped_rounds += other.skipped_rounds;
        self.delivered += other.delivered;
        self.missing += other.missing;
        self.duplicated += other.duplicated;
        self.unexpected += other.unexpected;
        self.unreadable += other.unreadable;
        self.duration_ms += other.duration_ms;
        for f in other.findings {
            self.note(f);
        }
    }

    fn note(&mut self, finding: String) {
        if self.findings.len() < MAX_FINDINGS {
            self.findings.push(finding);
        }
    }
}

/// Audits the round of `batches`, whose files by table are `by_table`.
pub(super) async fn audit_round(
    tables: &TableSet,
    selector: &mut Selector<'_>,
    batches: &[PendingBatch],
    by_table: &super::RoundFiles,
) -> RoundAudit {
    let started = std::time::Instant::now();
    let mut out = audit_files(tables, selector, batches, by_table).await;
    out.duration_ms = started.elapsed().as_secs_f64() * 1e3;
    out
}

async fn audit_files(
    tables: &TableSet,
    selector: &mut Selector<'_>,
    batches: &[PendingBatch],
    by_table: &super::RoundFiles,
) -> RoundAudit {
    let mut out = RoundAudit {
        rounds: 1,
        ..Default::default()
    };
    // The topics with a table of their own, and the round's entries of their partitions.
    type Entries = Vec<Delivered>;
    let mut delivered: BTreeMap<(String, i32), (Entries, Entries)> = BTreeMap::new();
    for b in batches {
        for r in b.ranges().filter(|r| r.first_offset >= 0) {
            if tables.topic_tables.contains_key(&r.source.topic) {
                let (d, replayed) = delivered
                    .entry((r.source.topic.clone(), r.source.partition))
                    .or_default();
                if b.delivery.replayed { replayed } else { d }.push(b.delivery.entry(&r));
            }
        }
    }
    if delivered.is_empty() {
        return out;
    }
    let files: usize = by_table
        .values()
        .map(|f| f.data_files.len() + f.key_deletes.len())
        .sum();
    if files > MAX_FILES {
        out.rounds = 0;
        out.skipped_rounds = 1;
        out.note(format!(
            "a round of {files} files is not read back (more than {MAX_FILES}); `streamtable audit` checks it"
        ));
        return out;
    }
    let mut found: BTreeMap<(String, i32), Vec<i64>> = BTreeMap::new();
    let topics: Vec<String> = {
        let mut t: Vec<String> = delivered.keys().map(|(t, _)| t.clone()).collect();
        t.dedup();
        t
    };
    // Topics some of whose round's files could not be read: what is missing is not known.
    let mut unknown: Vec<&str> = Vec::new();
    for topic in &topics {
        let Some(name) = tables.topic_tables.get(topic) else {
            continue;
        };
        let Some(files) = by_table.get(name) else {
            continue;
        };
        let before = out.unreadable;
        if let Err(e) = read_table(selector, name, topic, files, &mut found, &mut out).await {
            out.unreadable += 1;
            out.note(format!("table {name}: {e}"));
        }
        if out.unreadable > before {
            unknown.push(topic);
        }
    }
    if let Some(files) = by_table.get(DEAD_LETTER_TABLE) {
        let before = out.unreadable;
        if let Err(e) = read_dead_letters(selector, &topics, files, &mut found, &mut out).await {
            out.unreadable += 1;
            out.note(format!("table {DEAD_LETTER_TABLE}: {e}"));
        }
        if out.unreadable > before {
            unknown = topics.iter().map(String::as_str).collect();
        }
    }
    for ((topic, p), (entries, replayed)) in delivered {
        let mut offsets = found.remove(&(topic.clone(), p)).unwrap_or_default();
        offsets.sort_unstable();
        let before = offsets.len();
        offsets.dedup();
        let twice = (before - offsets.len()) as u64;
        if twice > 0 {
            out.duplicated += twice;
            out.note(format!(
                "{topic}-{p}: {twice} offset(s) more than once in the round's files"
            ));
        }
        let source = format!("{topic}-{p}");
        let entries = with_replays(ledger::round_entries(entries), replayed);
        if unknown.contains(&topic.as_str()) {
            // Only what was read can be judged: copies, and offsets from nowhere.
            let mut partial = RoundAudit::default();
            check_partition(&source, &entries, &offsets, &mut partial);
            out.delivered += partial.delivered;
            out.unexpected += partial.unexpected;
            continue;
        }
        check_partition(&source, &entries, &offsets, &mut out);
    }
    // Rows of partitions the round delivered nothing of.
    for ((topic, p), offsets) in found {
        out.unexpected += offsets.len() as u64;
        out.note(format!(
            "{topic}-{p}: {} row(s) in the round's files, yet none of its batches took from this partition",
            offsets.len()
        ));
    }
    out
}

/// The round's entries with the ranges replays landed (records the event source skipped there).
fn with_replays(mut entries: Vec<Delivered>, replayed: Vec<Delivered>) -> Vec<Delivered> {
    entries.extend(replayed);
    entries.sort_unstable();
    entries
}

/// Checks one partition's distinct `offsets` (sorted) against its round `entries` (sorted):
/// entry by entry when they are apart, else (a replay inside a delivered range) as a whole.
pub fn check_partition(source: &str, entries: &[Delivered], offsets: &[i64], out: &mut RoundAudit) {
    let within = |first: i64, last: i64| {
        let lo = offsets.partition_point(|o| *o < first);
        let hi = offsets.partition_point(|o| *o <= last);
        (hi.saturating_sub(lo)) as u64
    };
    let apart = entries.windows(2).all(|w| w[0].last < w[1].first);
    let mut inside = 0u64;
    let mut judge = |first: i64, last: i64, count: u64, out: &mut RoundAudit| {
        let n = within(first, last);
        inside += n;
        out.delivered += count;
        if n < count {
            out.missing += count - n;
            out.note(format!(
                "{source}: {} of the {count} records delivered in offsets {first}..={last} are in none of the round's files",
                count - n
            ));
        } else if n > count {
            out.unexpected += n - count;
            out.note(format!(
                "{source}: {n} offsets in {first}..={last} in the round's files, where {count} records were delivered"
            ));
        }
    };
    if apart {
        for d in entries {
            judge(d.first, d.last, d.count, out);
        }
    } else {
        // Overlapping ranges: one range over them all, their counts added (at most its span).
        let first = entries.iter().map(|d| d.first).min().unwrap_or(0);
        let last = entries.iter().map(|d| d.last).max().unwrap_or(-1);
        let span = u64::try_from(i128::from(last) - i128::from(first) + 1).unwrap_or(0);
        let count = entries.iter().map(|d| d.count).sum::<u64>().min(span);
        judge(first, last, count, out);
    }
    let outside = (offsets.len() as u64).saturating_sub(inside);
    if outside > 0 {
        out.unexpected += outside;
        out.note(format!(
            "{source}: {outside} offset(s) in the round's files outside the ranges its batches took"
        ));
    }
}

/// The Kafka positions of a topic table's round files (rows, key deletes, carried rows).
async fn read_table(
    selector: &mut Selector<'_>,
    name: &str,
    topic: &str,
    files: &TableFiles,
    found: &mut BTreeMap<(String, i32), Vec<i64>>,
    out: &mut RoundAudit,
) -> Result<()> {
    let table = selector.table(name).await?;
    let ids = field_ids(&table, name, &["kafka_partition", "kafka_offset"])?;
    let paths = files
        .data_files
        .iter()
        .map(|f| (f.file_path().to_string(), f.file_size_in_bytes()))
        .chain(files.key_deletes.iter().cloned())
        .collect();
    for (path, read) in read_all(&selector.options().runner, &table, paths, &ids).await {
        let batches = match read {
            Ok(b) => b,
            Err(e) => {
                out.unreadable += 1;
                out.note(format!("{path}: {e}"));
                continue;
            }
        };
        for (b, at) in batches {
            let (Some(p), Some(o)) = (at[0], at[1]) else {
                out.unreadable += 1;
                out.note(format!("{path}: no Kafka columns"));
                break;
            };
            positions(topic, &b, p, o, None, found)?;
        }
    }
    for b in &files.carried {
        let schema = b.schema();
        if let (Ok(p), Ok(o)) = (
            schema.index_of("kafka_partition"),
            schema.index_of("kafka_offset"),
        ) {
            positions(topic, b, p, o, None, found)?;
        }
    }
    Ok(())
}

/// The Kafka positions of the round's dead letters of `topics`, but those a derived table
/// gave (the topic's own table has the record).
async fn read_dead_letters(
    selector: &mut Selector<'_>,
    topics: &[String],
    files: &TableFiles,
    found: &mut BTreeMap<(String, i32), Vec<i64>>,
    out: &mut RoundAudit,
) -> Result<()> {
    let table = selector.table(DEAD_LETTER_TABLE).await?;
    let ids = field_ids(
        &table,
        DEAD_LETTER_TABLE,
        &["kafka_partition", "kafka_offset", "topic", "error_kind"],
    )?;
    let paths = files
        .data_files
        .iter()
        .map(|f| (f.file_path().to_string(), f.file_size_in_bytes()))
        .collect();
    for (path, read) in read_all(&selector.options().runner, &table, paths, &ids).await {
        let batches = match read {
            Ok(b) => b,
            Err(e) => {
                out.unreadable += 1;
                out.note(format!("{path}: {e}"));
                continue;
            }
        };
        for (b, at) in batches {
            let (Some(p), Some(o), Some(t), Some(k)) = (at[0], at[1], at[2], at[3]) else {
                out.unreadable += 1;
                out.note(format!("{path}: no Kafka columns"));
                break;
            };
            let topic_of = strings(&b, t)?;
            let kind_of = strings(&b, k)?;
            for topic in topics {
                let keep: Vec<bool> = (0..b.num_rows())
                    .map(|i| {
                        topic_of.is_valid(i)
                            && topic_of.value(i) == topic
                            && !(kind_of.is_valid(i) && DERIVED_KINDS.contains(&kind_of.value(i)))
                    })
                    .collect();
                positions(topic, &b, p, o, Some(&keep), found)?;
            }
        }
    }
    Ok(())
}

/// The field ids of `columns` in `table`'s current schema, or an error naming the missing one.
fn field_ids(table: &iceberg::table::Table, name: &str, columns: &[&str]) -> Result<Vec<i32>> {
    let schema = table.metadata().current_schema();
    columns
        .iter()
        .map(|c| {
            schema
                .field_by_name(c)
                .map(|f| f.id)
                .ok_or_else(|| Error::Internal(format!("table {name} has no column {c}")))
        })
        .collect()
}

/// The columns `ids` of each of `paths` (with their sizes), read in parallel, in their order.
async fn read_all(
    runner: &crate::scheduled::runner::Runner,
    table: &iceberg::table::Table,
    paths: Vec<(String, u64)>,
    ids: &[i32],
) -> Vec<(String, Result<Vec<(RecordBatch, Vec<Option<usize>>)>>)> {
    let names: Vec<String> = paths.iter().map(|(p, _)| p.clone()).collect();
    let ids: std::sync::Arc<[i32]> = ids.into();
    let results = runner
        .run(paths, |(path, size)| {
            let (table, ids) = (table.clone(), ids.clone());
            async move { read(&table, &path, size, &ids).await }
        })
        .await;
    names
        .into_iter()
        .zip(results)
        .map(|(path, r)| {
            (
                path,
                r.unwrap_or_else(|panic| Err(Error::Internal(panic.to_string()))),
            )
        })
        .collect()
}

/// The columns `ids` of a file, read again once if the first read fails (a throttled GET).
async fn read(
    table: &iceberg::table::Table,
    path: &str,
    size: u64,
    ids: &[i32],
) -> Result<Vec<(RecordBatch, Vec<Option<usize>>)>> {
    match crate::upsert::read::read_columns(table, path, size, ids).await {
        Ok(b) => Ok(b),
        Err(_) => crate::upsert::read::read_columns(table, path, size, ids).await,
    }
}

fn strings(b: &RecordBatch, at: usize) -> Result<StringArray> {
    let c = arrow_cast::cast(b.column(at), &arrow_schema::DataType::Utf8)
        .map_err(|e| Error::Internal(format!("dead letters: {e}")))?;
    c.as_any()
        .downcast_ref::<StringArray>()
        .cloned()
        .ok_or_else(|| Error::Internal("dead letters: a text column is not text".into()))
}

/// Adds the rows' (partition, offset) of `b` (those `keep` selects) to `found`.
fn positions(
    topic: &str,
    b: &RecordBatch,
    p: usize,
    o: usize,
    keep: Option<&[bool]>,
    found: &mut BTreeMap<(String, i32), Vec<i64>>,
) -> Result<()> {
    let p = arrow_cast::cast(b.column(p), &arrow_schema::DataType::Int32)
        .map_err(|e| Error::Internal(format!("kafka_partition: {e}")))?;
    let o = arrow_cast::cast(b.column(o), &arrow_schema::DataType::Int64)
        .map_err(|e| Error::Internal(format!("kafka_offset: {e}")))?;
    let (Some(p), Some(o)) = (
        p.as_any().downcast_ref::<Int32Array>(),
        o.as_any().downcast_ref::<Int64Array>(),
    ) else {
        return Err(Error::Internal("the Kafka columns are not integers".into()));
    };
    for i in 0..b.num_rows() {
        if keep.is_some_and(|k| !k[i]) || p.is_null(i) || o.is_null(i) {
            continue;
        }
        found
            .entry((topic.to_string(), p.value(i)))
            .or_default()
            .push(o.value(i));
    }
    Ok(())
}

/// The Kafka positions of every row of `table`'s live data files, rows its position deletes
/// delete included (an upsert table's superseded rows are records it was delivered), per Kafka
/// partition, unsorted; and the files that could not be read, each with why. Rows of a
/// partition moved to a new log that are the old log's (in `old_logs`: partition → the old
/// log's checkpoint and latest Kafka timestamp, ms, -1 unknown) are left out: below that
/// checkpoint and stamped no later than that timestamp.
pub async fn raw_positions(
    table: &iceberg::table::Table,
    topic: &str,
    old_logs: &BTreeMap<i32, (i64, i64)>,
) -> Result<(BTreeMap<i32, Vec<i64>>, Vec<String>)> {
    let name = table.identifier().name().to_string();
    let mut columns = vec!["kafka_partition", "kafka_offset"];
    if !old_logs.is_empty() {
        columns.push("kafka_timestamp");
    }
    let ids = field_ids(table, &name, &columns)?;
    let files = crate::table::files::load_current(table).await?;
    let mut found: BTreeMap<(String, i32), Vec<i64>> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for f in files.live() {
        let (path, size) = (f.entry.file_path(), f.entry.file_size_in_bytes());
        match read(table, path, size, &ids).await {
            Ok(batches) => {
                for (b, at) in batches {
                    let (Some(p), Some(o)) = (at[0], at[1]) else {
                        unreadable.push(format!("{path}: no Kafka columns"));
                        break;
                    };
                    let keep = match at.get(2) {
                        Some(ts) => Some(new_log_rows(&b, p, o, *ts, old_logs)?),
                        None => None,
                    };
                    positions(topic, &b, p, o, keep.as_deref(), &mut found)?;
                }
            }
            Err(e) => unreadable.push(format!("{path}: {e}")),
        }
    }
    Ok((
        found.into_iter().map(|((_, p), o)| (p, o)).collect(),
        unreadable,
    ))
}

/// Which rows of `b` are not an old log's (see [`raw_positions`]); `ts`: the Kafka timestamp
/// column, if the file has it (without it, a row below an old log's checkpoint is the old
/// log's).
fn new_log_rows(
    b: &RecordBatch,
    p: usize,
    o: usize,
    ts: Option<usize>,
    old_logs: &BTreeMap<i32, (i64, i64)>,
) -> Result<Vec<bool>> {
    let int = |at: usize, to: &arrow_schema::DataType, what: &str| {
        arrow_cast::cast(b.column(at), to).map_err(|e| Error::Internal(format!("{what}: {e}")))
    };
    let p = int(p, &arrow_schema::DataType::Int32, "kafka_partition")?;
    let o = int(o, &arrow_schema::DataType::Int64, "kafka_offset")?;
    let ts = match ts {
        Some(at) => Some(int(
            at,
            &arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Millisecond, None),
            "kafka_timestamp",
        )?),
        None => None,
    };
    let ts = match &ts {
        Some(t) => Some(
            arrow_cast::cast(t, &arrow_schema::DataType::Int64)
                .map_err(|e| Error::Internal(format!("kafka_timestamp: {e}")))?,
        ),
        None => None,
    };
    let (Some(p), Some(o)) = (
        p.as_any().downcast_ref::<Int32Array>(),
        o.as_any().downcast_ref::<Int64Array>(),
    ) else {
        return Err(Error::Internal("the Kafka columns are not integers".into()));
    };
    let ts = ts
        .as_ref()
        .and_then(|t| t.as_any().downcast_ref::<Int64Array>());
    Ok((0..b.num_rows())
        .map(|i| {
            let Some((checkpoint, newest)) = old_logs.get(&p.value(i)) else {
                return true;
            };
            let below = o.value(i) < *checkpoint;
            let stamped_before =
                *newest < 0 || ts.is_none_or(|t| t.is_null(i) || t.value(i) <= *newest);
            !(below && stamped_before)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(first: i64, last: i64, count: u64) -> Delivered {
        Delivered { first, last, count }
    }

    #[test]
    fn a_replay_inside_a_delivered_range_is_counted_with_it() {
        // 0..=29 delivered with 10 records (20..=29), 10..=19 replayed: 20 in all.
        let entries = with_replays(vec![d(0, 29, 10)], vec![d(10, 19, 10)]);
        let all: Vec<i64> = (10..30).collect();
        let mut out = RoundAudit::default();
        check_partition("t-0", &entries, &all, &mut out);
        assert!(out.ok(), "{out:?}");
        // A replay overlapping two ranges, offsets counted once: no overflow, no false alarm.
        let entries = with_replays(vec![d(0, 9, 5), d(10, 29, 10)], vec![d(5, 19, 10)]);
        let all: Vec<i64> = (5..30).collect();
        let mut out = RoundAudit::default();
        check_partition("t-0", &entries, &all, &mut out);
        assert!(out.ok(), "{out:?}");
    }

    #[test]
    fn a_round_holds_what_it_delivered_or_says_what_not() {
        let mut out = RoundAudit::default();
        let all: Vec<i64> = (0..10).chain(12..15).collect();
        check_partition("t-0", &[d(0, 9, 10), d(10, 14, 3)], &all, &mut out);
        assert!(out.ok(), "{out:?}");
        assert_eq!(out.delivered, 13);
        // Offsets 3 and 4 lost; offset 20 from nowhere.
        let mut out = RoundAudit::default();
        let some: Vec<i64> = [0, 1, 2, 5, 6, 7, 8, 9, 12, 13, 14, 20].to_vec();
        check_partition("t-0", &[d(0, 9, 10), d(10, 14, 3)], &some, &mut out);
        assert_eq!((out.missing, out.unexpected), (2, 1));
        assert!(out.findings[0].contains("2 of the 10 records delivered in offsets 0..=9"));
        // More offsets in a sparse range than it delivered.
        let mut out = RoundAudit::default();
        check_partition("t-0", &[d(10, 14, 3)], &[10, 11, 12, 13], &mut out);
        assert_eq!(out.unexpected, 1);
    }
}
