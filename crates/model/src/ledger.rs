//! The ledger of delivered offsets: which offsets of a topic-partition the event source delivered
//! in the batches a commit landed, so that an audit tells a gap Kafka itself leaves (a
//! transaction's marker, aborted records, a compacted topic) from a record that was lost.
//!
//! Ingest knows, per batch and topic-partition, the checkpoint it started from, the last offset
//! it took and how many records it took between them: the entry `from..=last` with its count.
//! Entries of one partition follow each other without a gap; an entry holding fewer records
//! than offsets is *sparse* (Kafka left gaps in it, or the event source skipped records). A
//! pending batch keeps what is not whole ([`Delivery`]). The commit stage folds each round's
//! entries ([`round_entries`]) into the ledger so far ([`Fold`]) and records it in the topic's
//! table's properties, [`LEDGER_PROPERTY_PREFIX`]`{topic}-{partition}`, in the same metadata
//! commit as the round (a round with no rows for the table still makes one). So offsets no
//! entry covers, above the first, belong to a batch whose entry never reached the table: a
//! batch lost before its commit.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{SourcePartition, SourceRange};

/// Table property of a topic-partition's folded ledger ([`Fold`]) on the topic's own table:
/// `streamtable.ledger.{topic}-{partition}`.
pub const LEDGER_PROPERTY_PREFIX: &str = "streamtable.ledger.";

/// The most entries one round records per topic-partition before neighbouring sparse entries
/// are joined too (their counts add up exactly; the audit then names the gaps of the joined
/// entry as candidates rather than as lost offsets).
pub const MAX_ROUND_ENTRIES: usize = 32;

/// What a pending batch took in each of its ranges, where that differs from one record per
/// offset of a range starting at the partition's checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Records a replay landed below the checkpoint (`streamtable replay`), which fill what
    /// the event source skipped: recorded apart from its deliveries.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// The ranges that are not whole: each with the checkpoint it started from (offsets
    /// between it and the range's first were never delivered) and the records it took.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<RangeDelivery>,
}

/// One range of a batch that is not whole (see [`Delivery`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeDelivery {
    /// The topic-partition.
    pub source: SourcePartition,
    /// The checkpoint the range started from (at most its first offset).
    pub from: i64,
    /// Records taken in `from..=last`.
    pub count: u64,
}

impl Delivery {
    /// Whether nothing needs storing: one record per offset of every range, each starting at
    /// its checkpoint.
    pub fn is_whole(&self) -> bool {
        !self.replayed && self.ranges.is_empty()
    }

    /// The delivery of ranges `(range, checkpoint it started from, records taken)`.
    pub fn of(ranges: impl IntoIterator<Item = (SourceRange, i64, u64)>) -> Delivery {
        Delivery {
            replayed: false,
            ranges: ranges
                .into_iter()
                .map(|(r, from, count)| {
                    let from = from.min(r.first_offset);
                    (r, from, count)
                })
                .filter(|(r, from, n)| {
                    *from != r.first_offset || span(r.first_offset, r.last_offset) != *n
                })
                .map(|(r, from, count)| RangeDelivery {
                    source: r.source,
                    from,
                    count,
                })
                .collect(),
        }
    }

    /// The ledger entry of range `r` of the batch.
    pub fn entry(&self, r: &SourceRange) -> Delivered {
        match self.ranges.iter().find(|d| d.source == r.source) {
            Some(d) => Delivered {
                first: d.from.min(r.first_offset),
                last: r.last_offset,
                count: d.count,
            },
            None => Delivered {
                first: r.first_offset,
                last: r.last_offset,
                count: span(r.first_offset, r.last_offset),
            },
        }
    }

    /// The stored form: `None` when whole; else `[replayed;]{"topic":[[partition, from,
    /// records], …]}`.
    pub fn encode(&self) -> Option<String> {
        if self.is_whole() {
            return None;
        }
        let mut by_topic: std::collections::BTreeMap<&str, Vec<[i64; 3]>> = Default::default();
        for d in &self.ranges {
            by_topic.entry(&d.source.topic).or_default().push([
                i64::from(d.source.partition),
                d.from,
                i64::try_from(d.count).unwrap_or(i64::MAX),
            ]);
        }
        let json = serde_json::to_string(&by_topic).ok()?;
        Some(if self.replayed {
            format!("replayed;{json}")
        } else {
            json
        })
    }

    /// Reads [`Delivery::encode`]'s form back (`None`: whole).
    pub fn decode(text: Option<&str>) -> Result<Delivery, String> {
        let Some(text) = text else {
            return Ok(Delivery::default());
        };
        let (replayed, json) = match text.strip_prefix("replayed;") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let by_topic: std::collections::BTreeMap<String, Vec<[i64; 3]>> =
            serde_json::from_str(json).map_err(|e| format!("delivered counts: {e}"))?;
        let mut ranges = Vec::new();
        for (topic, list) in by_topic {
            if list.len() > crate::checkpoint::MAX_RANGES {
                return Err(format!(
                    "delivered counts: {} for topic {topic}, more than a batch has",
                    list.len()
                ));
            }
            for [p, from, count] in list {
                let partition = i32::try_from(p)
                    .map_err(|_| format!("delivered counts: partition {p} of {topic}"))?;
                let count = u64::try_from(count)
                    .map_err(|_| format!("delivered counts: {count} records in {topic}-{p}"))?;
                ranges.push(RangeDelivery {
                    source: SourcePartition::new(topic.clone(), partition),
                    from,
                    count,
                });
            }
        }
        Ok(Delivery { replayed, ranges })
    }
}

/// Offsets in `first..=last`.
fn span(first: i64, last: i64) -> u64 {
    u64::try_from(i128::from(last) - i128::from(first) + 1).unwrap_or(0)
}

/// One entry of the ledger: the event source delivered `count` records with offsets in
/// `first..=last` (every offset of it when `count` is the range's length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Delivered {
    /// Lowest offset.
    pub first: i64,
    /// Highest offset.
    pub last: i64,
    /// Records delivered in the range.
    pub count: u64,
}

impl Delivered {
    /// Offsets in the range.
    pub fn span(&self) -> u64 {
        span(self.first, self.last)
    }

    /// Whether every offset of the range was delivered.
    pub fn whole(&self) -> bool {
        self.count == self.span()
    }
}

impl fmt::Display for Delivered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.whole() {
            write!(f, "{}-{}", self.first, self.last)
        } else {
            write!(f, "{}-{}:{}", self.first, self.last, self.count)
        }
    }
}

/// One round's entries of one topic-partition from its batches' ranges: in order, whole
/// neighbours (the second starting right after the first) joined. The same ranges give the same
/// entries, whichever snapshot records them. Past [`MAX_ROUND_ENTRIES`], every neighbour is
/// joined (a partition's batches follow each other, so its round becomes one entry); ranges
/// apart stay apart, so that offsets between them — a batch lost before its commit — stay
/// covered by no entry.
pub fn round_entries(ranges: impl IntoIterator<Item = Delivered>) -> Vec<Delivered> {
    let mut ranges: Vec<Delivered> = ranges
        .into_iter()
        .filter(|d| d.first >= 0 && d.last >= d.first && d.count <= d.span())
        .collect();
    ranges.sort_unstable();
    ranges.dedup();
    let out = join(ranges, |a, b| a.whole() && b.whole());
    if out.len() > MAX_ROUND_ENTRIES {
        join(out, |_, _| true)
    } else {
        out
    }
}

/// `ranges` (sorted) with each neighbour that starts right after the previous one joined,
/// where `may` allows.
fn join(ranges: Vec<Delivered>, may: impl Fn(&Delivered, &Delivered) -> bool) -> Vec<Delivered> {
    let mut out: Vec<Delivered> = Vec::with_capacity(ranges.len());
    for d in ranges {
        match out.last_mut() {
            Some(prev) if prev.last.checked_add(1) == Some(d.first) && may(prev, &d) => {
                prev.last = d.last;
                prev.count += d.count;
            }
            _ => out.push(d),
        }
    }
    out
}

/// The summary form of entries: `first-last` for a whole range, `first-last:count` for a
/// sparse one, comma-separated.
pub fn encode(entries: &[Delivered]) -> String {
    entries
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`encode`]'s form back; an impossible entry is refused, naming it.
pub fn decode(text: &str) -> Result<Vec<Delivered>, String> {
    let mut out = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let bad = || format!("delivered range {part:?} is not first-last[:count]");
        let (range, count) = match part.split_once(':') {
            Some((r, c)) => (r, Some(c.parse::<u64>().map_err(|_| bad())?)),
            None => (part, None),
        };
        let (a, b) = range.split_once('-').ok_or_else(bad)?;
        let (first, last) = (
            a.parse::<i64>().map_err(|_| bad())?,
            b.parse::<i64>().map_err(|_| bad())?,
        );
        if first < 0 || last < first {
            return Err(bad());
        }
        let whole = span(first, last);
        let count = count.unwrap_or(whole);
        if count > whole {
            return Err(format!(
                "delivered range {part:?} counts more records than it has offsets"
            ));
        }
        out.push(Delivered { first, last, count });
    }
    Ok(out)
}

/// The most entries a folded ledger keeps per topic-partition (a new entry starts only where
/// offsets went uncovered: a batch lost before its commit, a checkpoint moved by hand); past
/// it, every entry is joined into one (its count stays exact).
pub const MAX_FOLD_ENTRIES: usize = 1024;

/// A topic-partition's ledger as its table keeps it: every committed round's entries folded
/// into the entries before them (neighbours joined, their counts added), the ranges replays
/// landed (apart: a replay lands records found nowhere, which the event source either skipped
/// or delivered and lost, so they widen what an entry may hold rather than add to it), and
/// whether some batch ever saw a gap between its own records (a transaction's marker, aborted
/// or compacted records). The commit stage keeps it in the topic's table's properties
/// ([`LEDGER_PROPERTY_PREFIX`]), so expiring old snapshots loses nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fold {
    /// Some batch saw a gap between its own records.
    pub gaps_inside: bool,
    /// The delivered entries, in order, apart.
    pub entries: Vec<Delivered>,
    /// The ranges replays landed, in order, apart.
    pub replayed: Vec<Delivered>,
}

impl Fold {
    /// Folds a round in: its `delivered` entries, the ranges replays landed, and whether one
    /// of its batches saw a gap between its own records.
    pub fn add(&mut self, delivered: &[Delivered], replayed: &[Delivered], gaps_inside: bool) {
        self.gaps_inside |= gaps_inside;
        // Without gaps of its own, a partition's sparse entries are batches the event source
        // gave up on: kept apart from the whole ones, so that a loss in either is named.
        let gaps = self.gaps_inside;
        let same = move |a: &Delivered, b: &Delivered| gaps || a.whole() == b.whole();
        self.entries = fold_in(std::mem::take(&mut self.entries), delivered, same);
        self.replayed = fold_in(std::mem::take(&mut self.replayed), replayed, |_, _| true);
    }

    /// The stored form: [`encode`]d entries (after `~` when some batch saw a gap inside),
    /// then `|` and the replayed ranges, if any.
    pub fn encode(&self) -> String {
        let mut out = encode(&self.entries);
        if self.gaps_inside {
            out.insert(0, '~');
        }
        if !self.replayed.is_empty() {
            out.push('|');
            out.push_str(&encode(&self.replayed));
        }
        out
    }

    /// Reads [`Fold::encode`]'s form back; an impossible, overlapping or unordered entry, or
    /// more than [`MAX_FOLD_ENTRIES`], is refused, naming it.
    pub fn decode(text: &str) -> Result<Fold, String> {
        let (gaps_inside, rest) = match text.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (entries, replayed) = rest.split_once('|').unwrap_or((rest, ""));
        let read = |part: &str| -> Result<Vec<Delivered>, String> {
            let entries = decode(part)?;
            if entries.len() > MAX_FOLD_ENTRIES {
                return Err(format!(
                    "{} entries, more than a ledger keeps ({MAX_FOLD_ENTRIES})",
                    entries.len()
                ));
            }
            if let Some(w) = entries.windows(2).find(|w| w[1].first <= w[0].last) {
                return Err(format!(
                    "entries {} and {} overlap or are out of order",
                    w[0], w[1]
                ));
            }
            Ok(entries)
        };
        Ok(Fold {
            gaps_inside,
            entries: read(entries)?,
            replayed: read(replayed)?,
        })
    }
}

/// `list` (sorted, apart) with `more` folded in: overlapping entries always joined (their
/// counts added, at most their span), neighbours where `may` allows; past
/// [`MAX_FOLD_ENTRIES`], the older half joined into one (its count stays exact).
fn fold_in(
    list: Vec<Delivered>,
    more: &[Delivered],
    may: impl Fn(&Delivered, &Delivered) -> bool,
) -> Vec<Delivered> {
    let mut all: Vec<Delivered> = list
        .into_iter()
        .chain(more.iter().copied())
        .filter(valid)
        .collect();
    all.sort_unstable();
    all.dedup();
    let mut out: Vec<Delivered> = Vec::with_capacity(all.len());
    for d in all {
        match out.last_mut() {
            Some(prev)
                if d.first <= prev.last
                    || (prev.last.checked_add(1) == Some(d.first) && may(prev, &d)) =>
            {
                prev.last = prev.last.max(d.last);
                prev.count = prev.count.saturating_add(d.count).min(prev.span());
            }
            _ => out.push(d),
        }
    }
    if out.len() > MAX_FOLD_ENTRIES {
        let recent = out.split_off(out.len() / 2);
        let first = out[0].first;
        let last = out.iter().map(|d| d.last).max().unwrap_or(first);
        let count = out
            .iter()
            .fold(0u64, |n, d| n.saturating_add(d.count))
            .min(span(first, last));
        out = std::iter::once(Delivered { first, last, count })
            .chain(recent)
            .collect();
    }
    out
}

/// Whether an entry is possible.
fn valid(d: &Delivered) -> bool {
    d.first >= 0 && d.last >= d.first && d.count <= d.span()
}

/// Table property of an upsert table's topic-partition: what its records became other than
/// rows ([`Counted`]), `streamtable.counted.{topic}-{partition}`.
pub const COUNTED_PROPERTY_PREFIX: &str = "streamtable.counted.";

/// What an upsert table's records of one topic-partition became other than rows of its data
/// files: tombstones (a key's delete, in no data file) and rows compaction dropped (superseded
/// by a later record of their key, or deleted by a position delete, then rewritten away). Each
/// is counted in the same metadata commit as the change, so `streamtable audit` counts every
/// delivered record of an upsert table: its rows (deleted ones too, until compaction) plus
/// these plus its dead letters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Records that were tombstones (key deletes).
    pub tombstones: u64,
    /// Rows compaction dropped.
    pub dropped: u64,
}

impl Counted {
    /// The stored form: `tombstones,dropped`.
    pub fn encode(&self) -> String {
        format!("{},{}", self.tombstones, self.dropped)
    }

    /// Reads [`Counted::encode`]'s form back.
    pub fn decode(text: &str) -> Result<Counted, String> {
        let bad = || format!("counts {text:?} are not tombstones,dropped");
        let (t, d) = text.split_once(',').ok_or_else(bad)?;
        Ok(Counted {
            tombstones: t.trim().parse().map_err(|_| bad())?,
            dropped: d.trim().parse().map_err(|_| bad())?,
        })
    }
}

/// Table property of a topic-partition's time marks ([`Stamps`]) on the topic's own table:
/// `streamtable.stamps.{topic}-{partition}`.
pub const STAMPS_PROPERTY_PREFIX: &str = "streamtable.stamps.";

/// The most marks [`Stamps`] keep per topic-partition.
pub const MAX_STAMPS: usize = 64;

/// Where in a topic-partition's offsets its records' Kafka timestamps lie, coarsely: marks
/// `offset@ms`, each saying that the records from its offset up to the next mark's are stamped
/// at or before `ms`. Each commit round adds one at its first offset, with the latest
/// timestamp the partition had taken by then (its checkpoint's: at or after every record of
/// the round); past [`MAX_STAMPS`], the neighbours spanning the fewest offsets are joined (the
/// later time kept). So `audit --since T` starts a partition at the first mark stamped at or
/// after `T` ([`Stamps::start_since`]): no record stamped at or after `T` lies below it, found
/// or not (a row deleted after its commit included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stamps {
    /// `(offset, ms)`, by offset.
    pub marks: Vec<(i64, i64)>,
}

impl Stamps {
    /// Adds the mark `offset@ms` (a mark at the same offset keeps the later time).
    pub fn add(&mut self, offset: i64, ms: i64) {
        if offset < 0 {
            return;
        }
        match self.marks.binary_search_by_key(&offset, |m| m.0) {
            Ok(i) => self.marks[i].1 = self.marks[i].1.max(ms),
            Err(i) => self.marks.insert(i, (offset, ms)),
        }
        while self.marks.len() > MAX_STAMPS {
            // Join the neighbours whose joined segment spans the fewest offsets.
            let span = |i: usize| {
                let end = self.marks.get(i + 2).map_or(i64::MAX, |m| m.0);
                end.saturating_sub(self.marks[i].0)
            };
            let Some(i) = (0..self.marks.len() - 1).min_by_key(|&i| span(i)) else {
                break;
            };
            let later = self.marks[i + 1].1;
            self.marks[i].1 = self.marks[i].1.max(later);
            self.marks.remove(i + 1);
        }
    }

    /// The first offset of the first segment stamped at or after `since_ms` (no record below it
    /// is), `None` when no segment is.
    pub fn start_since(&self, since_ms: i64) -> Option<i64> {
        self.marks
            .iter()
            .find(|(_, ms)| *ms >= since_ms)
            .map(|(o, _)| *o)
    }

    /// The stored form: `offset@ms,…`.
    pub fn encode(&self) -> String {
        self.marks
            .iter()
            .map(|(o, ms)| format!("{o}@{ms}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Reads [`Stamps::encode`]'s form back; an impossible or unordered mark, or more than
    /// [`MAX_STAMPS`], is refused, naming it.
    pub fn decode(text: &str) -> Result<Stamps, String> {
        let mut marks = Vec::new();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let bad = || format!("time mark {part:?} is not offset@ms");
            let (o, ms) = part.split_once('@').ok_or_else(bad)?;
            let (o, ms) = (
                o.parse::<i64>().map_err(|_| bad())?,
                ms.parse::<i64>().map_err(|_| bad())?,
            );
            if o < 0 {
                return Err(bad());
            }
            marks.push((o, ms));
        }
        if marks.len() > MAX_STAMPS {
            return Err(format!(
                "{} time marks, more than kept ({MAX_STAMPS})",
                marks.len()
            ));
        }
        if let Some(w) = marks.windows(2).find(|w| w[1].0 <= w[0].0) {
            return Err(format!(
                "time marks {}@{} and {}@{} are out of order",
                w[0].0, w[0].1, w[1].0, w[1].1
            ));
        }
        Ok(Stamps { marks })
    }
}

/// One topic-partition's ledger as the audit reads it: whole ranges, sparse entries, and
/// whether some batch saw a gap between its own records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    whole: Vec<[i64; 2]>,
    sparse: BTreeSet<Delivered>,
    gaps_inside: bool,
    replayed: Vec<Delivered>,
}

impl Ledger {
    /// The ledger of `entries` (overlapping whole ranges are joined).
    pub fn new(entries: impl IntoIterator<Item = Delivered>) -> Ledger {
        let mut whole = Vec::new();
        let mut sparse = BTreeSet::new();
        for d in entries.into_iter().filter(valid) {
            if d.whole() {
                whole.push([d.first, d.last]);
            } else {
                sparse.insert(d);
            }
        }
        whole.sort_unstable();
        let mut joined: Vec<[i64; 2]> = Vec::with_capacity(whole.len());
        for [a, b] in whole {
            match joined.last_mut() {
                Some(prev) if a <= prev[1].saturating_add(1) => prev[1] = prev[1].max(b),
                _ => joined.push([a, b]),
            }
        }
        Ledger {
            whole: joined,
            sparse,
            gaps_inside: false,
            replayed: Vec::new(),
        }
    }

    /// The ledger a table's fold records.
    pub fn from_fold(fold: &Fold) -> Ledger {
        Ledger {
            gaps_inside: fold.gaps_inside,
            replayed: fold.replayed.clone(),
            ..Ledger::new(fold.entries.iter().copied())
        }
    }

    /// The ranges replays landed, in order.
    pub fn replayed(&self) -> &[Delivered] {
        &self.replayed
    }

    /// Records replays landed in ranges overlapping `first..=last` (at most its span).
    pub fn replayed_within(&self, first: i64, last: i64) -> u64 {
        self.replayed
            .iter()
            .filter(|r| r.first <= last && first <= r.last)
            .fold(0u64, |n, r| n.saturating_add(r.count))
            .min(span(first, last))
    }

    /// Whether some batch saw a gap between its own records: the topic-partition has gaps of
    /// its own (transactions, compaction), so gaps between batches may be Kafka's too.
    pub fn gaps_inside(&self) -> bool {
        self.gaps_inside
    }

    /// Whether no entry was recorded.
    pub fn is_empty(&self) -> bool {
        self.whole.is_empty() && self.sparse.is_empty()
    }

    /// The lowest offset recorded.
    pub fn start(&self) -> Option<i64> {
        let w = self.whole.first().map(|r| r[0]);
        let s = self.sparse.first().map(|d| d.first);
        match (w, s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The highest offset recorded.
    pub fn end(&self) -> Option<i64> {
        let w = self.whole.last().map(|r| r[1]);
        let s = self.sparse.iter().map(|d| d.last).max();
        w.max(s)
    }

    /// The first offset of the sparse entry that holds `offset`, if one does (an entry counted
    /// as a whole: it cannot be cut).
    pub fn sparse_start(&self, offset: i64) -> Option<i64> {
        self.sparse
            .iter()
            .find(|d| d.first <= offset && offset <= d.last)
            .map(|d| d.first)
    }

    /// Whole ranges, joined, in order.
    pub fn whole(&self) -> &[[i64; 2]] {
        &self.whole
    }

    /// Sparse entries, in order.
    pub fn sparse(&self) -> impl Iterator<Item = &Delivered> {
        self.sparse.iter()
    }

    /// Offsets delivered in all.
    pub fn delivered(&self) -> u64 {
        self.whole
            .iter()
            .map(|[a, b]| span(*a, *b))
            .chain(self.sparse.iter().map(|d| d.count))
            .fold(0u64, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(first: i64, last: i64, count: u64) -> Delivered {
        Delivered { first, last, count }
    }

    #[test]
    fn a_round_joins_whole_neighbours_and_keeps_sparse_ranges_apart() {
        // Three whole batches in a row, a gap, a sparse batch, a whole one after it.
        let e = round_entries([
            d(0, 9, 10),
            d(10, 19, 10),
            d(20, 24, 5),
            d(30, 39, 9),
            d(40, 49, 10),
        ]);
        assert_eq!(e, [d(0, 24, 25), d(30, 39, 9), d(40, 49, 10)]);
        assert_eq!(encode(&e), "0-24,30-39:9,40-49");
        assert_eq!(decode(&encode(&e)), Ok(e));
        // Order and repeats do not matter: the same ranges give the same entries.
        assert_eq!(
            round_entries([d(10, 19, 10), d(0, 9, 10), d(0, 9, 10)]),
            [d(0, 19, 20)]
        );
    }

    #[test]
    fn too_many_entries_are_joined_with_their_exact_count_but_not_across_a_loss() {
        // 1,000 batches of 10 offsets with a transaction's marker each.
        let many: Vec<Delivered> = (0..1000).map(|i| d(i * 10, i * 10 + 9, 9)).collect();
        assert_eq!(round_entries(many.clone()), [d(0, 9999, 9000)]);
        // Batch 500 lost before its commit: its offsets stay covered by no entry.
        let lost: Vec<Delivered> = many.into_iter().filter(|e| e.first != 5000).collect();
        assert_eq!(round_entries(lost), [d(0, 4999, 4500), d(5010, 9999, 4491)]);
    }

    #[test]
    fn impossible_entries_are_refused_by_name() {
        for bad in ["5", "9-3", "a-b", "0-9:11", "-1-3", "0-9:x"] {
            let err = decode(bad).expect_err(bad);
            assert!(err.contains(bad), "{err}");
        }
        assert_eq!(decode(""), Ok(vec![]));
    }

    #[test]
    fn a_ledger_unites_the_snapshots_of_a_round() {
        let l = Ledger::new([
            d(0, 24, 25),
            d(30, 39, 9),
            d(10, 19, 10),
            d(30, 39, 9),
            d(40, 49, 10),
        ]);
        assert_eq!(l.whole(), [[0, 24], [40, 49]]);
        assert_eq!(l.sparse().copied().collect::<Vec<_>>(), [d(30, 39, 9)]);
        assert_eq!((l.start(), l.delivered()), (Some(0), 44));
    }

    #[test]
    fn a_batch_stores_only_what_is_not_whole() {
        let r = |p: i32, a: i64, b: i64| SourceRange {
            source: SourcePartition::new("orders", p),
            first_offset: a,
            last_offset: b,
        };
        assert!(Delivery::of([(r(0, 0, 9), 0, 10)]).is_whole());
        // Partition 1 started at checkpoint 3 (3..=4 never delivered) and took 4 of 5..=9.
        let d = Delivery::of([(r(0, 0, 9), 0, 10), (r(1, 5, 9), 3, 4)]);
        assert_eq!(d.entry(&r(1, 5, 9)), self::d(3, 9, 4));
        assert_eq!(d.entry(&r(0, 0, 9)), self::d(0, 9, 10));
        let text = d.encode().expect("stored");
        assert_eq!(text, r#"{"orders":[[1,3,4]]}"#);
        assert_eq!(Delivery::decode(Some(&text)), Ok(d.clone()));
        assert_eq!(Delivery::decode(None), Ok(Delivery::default()));
        let replayed = Delivery {
            replayed: true,
            ..d
        };
        assert_eq!(Delivery::decode(replayed.encode().as_deref()), Ok(replayed));
        assert!(Delivery::decode(Some("{")).is_err());
        assert!(Delivery::decode(Some(r#"{"t":[[1,2,-3]]}"#)).is_err());
    }

    #[test]
    fn time_marks_bound_where_records_stamped_since_a_time_start() {
        let mut s = Stamps::default();
        s.add(0, 1_000);
        s.add(100, 2_000);
        s.add(200, 3_000);
        assert_eq!(s.start_since(500), Some(0));
        assert_eq!(s.start_since(1_500), Some(100));
        assert_eq!(s.start_since(3_000), Some(200));
        assert_eq!(s.start_since(3_001), None);
        assert_eq!(Stamps::decode(&s.encode()), Ok(s.clone()));
        // Past the limit, the neighbours spanning the fewest offsets join, keeping the later
        // time: a start is never later than it should be.
        let mut many = Stamps::default();
        for i in 0..(MAX_STAMPS as i64 + 10) {
            many.add(i * 10, i * 100);
        }
        assert_eq!(many.marks.len(), MAX_STAMPS);
        for since in (0..7_400).step_by(37) {
            let start = many.start_since(since).unwrap_or(i64::MAX);
            // Record i*10 is stamped i*100: none stamped at or after `since` lies below start.
            let first = (0..(MAX_STAMPS as i64 + 10))
                .find(|i| i * 100 >= since)
                .map_or(i64::MAX, |i| i * 10);
            assert!(start <= first, "since {since}: start {start} > {first}");
        }
        assert!(Stamps::decode("5@1,3@2").is_err());
        assert!(Stamps::decode("x").is_err());
    }

    #[test]
    fn a_fold_joins_rounds_and_keeps_a_loss_apart() {
        let mut f = Fold::default();
        f.add(&[d(0, 9, 10)], &[], false);
        f.add(&[d(10, 19, 10)], &[], false);
        assert_eq!(f.entries, [d(0, 19, 20)]);
        assert_eq!(f.encode(), "0-19");
        // Without gaps of its own, a skipping batch (40..=49 from checkpoint 40, 5 records)
        // stays apart from the whole ones.
        f.add(&[d(20, 39, 20), d(40, 49, 5), d(50, 59, 10)], &[], false);
        assert_eq!(f.entries, [d(0, 39, 40), d(40, 49, 5), d(50, 59, 10)]);
        // A batch lost before its commit (60..=69): the next round starts apart.
        f.add(&[d(70, 79, 9)], &[], true);
        assert!(f.gaps_inside);
        assert_eq!(f.entries, [d(0, 59, 55), d(70, 79, 9)]);
        assert_eq!(f.encode(), "~0-59:55,70-79:9");
        assert_eq!(Fold::decode(&f.encode()), Ok(f.clone()));
        // Replays are kept apart from the deliveries.
        f.add(&[], &[d(40, 44, 5), d(45, 46, 2)], false);
        assert_eq!(f.replayed, [d(40, 46, 7)]);
        assert_eq!(f.encode(), "~0-59:55,70-79:9|40-46");
        assert_eq!(Fold::decode(&f.encode()), Ok(f.clone()));
        // An entry overlapping another (a replay's batch committed before the one that
        // skipped past it) is joined, never kept overlapping.
        f.add(&[d(75, 89, 10)], &[], false);
        assert_eq!(f.entries, [d(0, 59, 55), d(70, 89, 19)]);
        // Impossible entries are dropped; a damaged fold is refused by name.
        f.add(&[d(95, 90, 1), d(100, 101, 5)], &[], false);
        assert_eq!(f.entries, [d(0, 59, 55), d(70, 89, 19)]);
        assert!(Fold::decode("~0-5:9").is_err());
        assert!(Fold::decode("0-9,5-20").is_err(), "overlapping");
        assert!(Fold::decode("10-19,0-9").is_err(), "out of order");
        // Huge counts saturate rather than overflow.
        let big = Fold::decode("0-9223372036854775806:9223372036854775806").expect("one entry");
        let l = Ledger::from_fold(&big);
        assert_eq!(l.delivered(), 9223372036854775806);
    }
}
