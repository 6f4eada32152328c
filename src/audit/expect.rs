//! What an audit concludes for one topic-partition from the offsets found, its checkpoint, its
//! pending batches and its ledger of delivered offsets ([`crate::ledger`]): pure.
//!
//! An offset expected and found nowhere (a *hole*) is
//! - **missing** where the ledger says it was delivered (a whole entry), where no entry covers
//!   it above where the partition started (a batch whose entry never reached a snapshot: lost
//!   before its commit), or below the ledger's first entry down to the checkpoint's first
//!   offset (history older than the ledger, or a first batch lost before its commit: every
//!   offset is expected there);
//! - inside a *sparse* entry (batches that took fewer records than their offsets from their
//!   checkpoints on), counted: the entry holds its delivered count (to which what replays
//!   landed in it may add) or is short by the difference. The holes of an entry that is not
//!   short were **never delivered** to a batch that landed: Kafka's own gaps (a transaction's
//!   marker, aborted records, a compacted topic) — unless the event source reports giving up
//!   on a batch that held them (its on-failure destination's records, `given_up`): those were
//!   **skipped** and count as missing until `streamtable replay` lands them. An event source
//!   skips a batch only so (with no destination it retries until the batch lands), so nothing
//!   is guessed from the holes' shape. The topic's log (`--bootstrap-servers`) tells which
//!   offsets were records, whatever the ledger says.

use serde::Serialize;

use crate::ledger::{Delivered, Ledger};

/// Most ranges listed per sparse range that is short.
const MAX_LISTED_GAPS: usize = 100;

/// The offsets found in one partition's table and dead letters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// The lowest offset found.
    pub first: Option<i64>,
    /// The highest offset found.
    pub last: Option<i64>,
    /// Ranges (inclusive) between offsets found, with none found inside, in order.
    pub gaps: Vec<[i64; 2]>,
}

/// A range the event source delivered with gaps, whose offsets found differ from its count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Miscount {
    /// Its lowest offset.
    pub first: i64,
    /// Its highest offset.
    pub last: i64,
    /// Records delivered in it.
    pub delivered: u64,
    /// Offsets found in it.
    pub found: u64,
    /// Its offsets found nowhere (lost ones among Kafka's gaps), the first ones.
    pub holes: Vec<[i64; 2]>,
}

/// What one partition's audit concludes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Offset ranges (inclusive) delivered and found nowhere.
    pub missing: Vec<[i64; 2]>,
    /// Offsets lost in all (in `missing`, and what `short` ranges lack).
    pub missing_offsets: i64,
    /// Sparse ranges holding fewer offsets than were delivered in them.
    pub short: Vec<Miscount>,
    /// Sparse ranges holding more offsets than were delivered in them (a damaged ledger, or
    /// rows whose Kafka columns are wrong).
    pub surplus: Vec<Miscount>,
    /// Offset ranges (inclusive) the event source never delivered, between ledger ranges.
    pub not_delivered: Vec<[i64; 2]>,
    /// Offsets not delivered in all.
    pub not_delivered_offsets: i64,
    /// Offset ranges (inclusive) no batch that landed took, in a batch the event source gave
    /// up on: counted as missing until a replay lands them.
    pub skipped: Vec<[i64; 2]>,
    /// Offsets skipped in all (part of `missing_offsets`).
    pub skipped_offsets: i64,
    /// Every offset range expected and found nowhere, whatever the ledger says of it.
    pub holes: Vec<[i64; 2]>,
}

/// Offsets in `a..=b` (saturating: a damaged ledger may name any range).
fn len([a, b]: [i64; 2]) -> i64 {
    i64::try_from(i128::from(b) - i128::from(a) + 1).unwrap_or(i64::MAX)
}

/// The audit of one partition: `found` against the checkpoint (`next_offset`), the `pending`
/// ranges (not expected yet) and the `ledger`; from `from` on when given (`found` then holds
/// nothing below it, and an entry that starts below it is not counted).
pub fn judge(
    found: &Shape,
    next_offset: i64,
    pending: &[[i64; 2]],
    ledger: &Ledger,
    from: Option<i64>,
) -> Verdict {
    judge_with(
        found,
        &Expected {
            next_offset,
            pending,
            ledger,
            from,
            first: None,
            given_up: &[],
        },
    )
}

/// What a partition's audit expects, besides what was found.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The checkpoint: every offset below it was taken (but pending batches').
    pub next_offset: i64,
    /// Ranges (inclusive) of batches not committed yet: not expected yet.
    pub pending: &'a [[i64; 2]],
    /// The ledger of delivered offsets.
    pub ledger: &'a Ledger,
    /// Where the audit starts (`--since`): found nothing below it, and an entry that starts
    /// below it is not counted.
    pub from: Option<i64>,
    /// The first offset the partition took (its checkpoint's, when known).
    pub first: Option<i64>,
    /// Ranges (inclusive, sorted) of batches the event source gave up on.
    pub given_up: &'a [[i64; 2]],
}

/// [`judge`] with everything an audit knows of the partition.
pub fn judge_with(found: &Shape, e: &Expected<'_>) -> Verdict {
    let (next_offset, pending, ledger, from) = (e.next_offset, e.pending, e.ledger, e.from);
    // Expected from where the partition started (its first offset, the ledger's first range)
    // even if nothing was found that low.
    let started = match (e.first.filter(|f| *f >= 0), ledger.start()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut shape = found.clone();
    if let Some(start) = from.or(started) {
        match shape.first {
            Some(first) if start < first => {
                shape.gaps.insert(0, [start, first - 1]);
                shape.first = Some(start);
            }
            None if start < next_offset => {
                shape.first = Some(start);
                shape.last = Some(start - 1);
            }
            _ => {}
        }
    }
    let holes = missing_ranges(&shape.gaps, shape.first, shape.last, next_offset, pending);
    let mut v = classify(&holes, ledger, from, e.given_up);
    v.holes = holes;
    v
}

/// What an upsert table's audit of one partition counts: its records replace one another by
/// design, so the holes inside the ledger's entries are counted rather than named — each
/// delivered record is a row (a superseded one too, until compaction), a dead letter, a
/// tombstone or a row compaction dropped (`counted`), and the entries' own gaps are Kafka's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UpsertCount {
    /// Offsets expected and found nowhere inside the ledger's entries.
    pub holes: i64,
    /// Of those, offsets the entries say were never delivered (Kafka's gaps; replays' ranges
    /// taken off).
    pub gaps: i64,
    /// Records that were tombstones.
    pub tombstones: i64,
    /// Rows compaction dropped.
    pub dropped: i64,
}

impl UpsertCount {
    /// Delivered records neither rows, dead letters, tombstones nor dropped rows (negative:
    /// more accounted for than delivered — a damaged count, or rows from nowhere).
    pub fn unaccounted(&self) -> i64 {
        self.holes
            .saturating_sub(self.gaps)
            .saturating_sub(self.tombstones)
            .saturating_sub(self.dropped)
    }
}

/// The count of an upsert partition's holes inside its ledger's entries against what the
/// table counted of its records (`tombstones`, `dropped`); `skipped` (holes the event source
/// gave up on, already missing) are taken off both sides.
pub fn upsert_count(v: &Verdict, ledger: &Ledger, tombstones: u64, dropped: u64) -> UpsertCount {
    let entries: Vec<([i64; 2], Option<Delivered>)> = ledger
        .whole()
        .iter()
        .map(|r| (*r, None))
        .chain(ledger.sparse().map(|d| ([d.first, d.last], Some(*d))))
        .collect();
    let overlap = |a: [i64; 2], b: [i64; 2]| {
        let (lo, hi) = (a[0].max(b[0]), a[1].min(b[1]));
        if lo > hi { 0 } else { len([lo, hi]) }
    };
    let mut c = UpsertCount {
        tombstones: i64::try_from(tombstones).unwrap_or(i64::MAX),
        dropped: i64::try_from(dropped).unwrap_or(i64::MAX),
        ..UpsertCount::default()
    };
    for (range, sparse) in &entries {
        for h in &v.holes {
            c.holes = c.holes.saturating_add(overlap(*range, *h));
        }
        for h in &v.skipped {
            c.holes = c.holes.saturating_sub(overlap(*range, *h));
        }
        if let Some(d) = sparse {
            let gaps = d.span().saturating_sub(d.count);
            let replayed = ledger.replayed_within(d.first, d.last);
            let skipped: i64 = v.skipped.iter().map(|h| overlap(*range, *h)).sum();
            c.gaps = c.gaps.saturating_add(
                i64::try_from(gaps.saturating_sub(replayed))
                    .unwrap_or(i64::MAX)
                    .saturating_sub(skipped),
            );
        }
    }
    c
}

/// The pieces of `holes` inside `ranges` (sorted, disjoint).
pub fn within(holes: &[[i64; 2]], ranges: &[[i64; 2]]) -> Vec<[i64; 2]> {
    holes.iter().flat_map(|h| split(*h, ranges).0).collect()
}

/// The pieces of `hole` outside `ranges` (sorted, disjoint).
pub fn outside(hole: [i64; 2], ranges: &[[i64; 2]]) -> Vec<[i64; 2]> {
    split(hole, ranges).1
}

/// Holes of `v` covered by no entry of `ledger` above where it starts: batches lost before
/// their commit (missing whatever the table's kind).
pub fn uncovered(v: &Verdict, ledger: &Ledger) -> Vec<[i64; 2]> {
    let mut covered: Vec<[i64; 2]> = ledger
        .whole()
        .iter()
        .copied()
        .chain(ledger.sparse().map(|d| [d.first, d.last]))
        .collect();
    covered.sort_unstable();
    let mut out = Vec::new();
    for h in &v.holes {
        let (_, outside) = split(*h, &covered);
        out.extend(outside);
    }
    out
}

/// `range` cut into the pieces inside `ranges` (sorted, disjoint) and those outside.
fn split(range: [i64; 2], ranges: &[[i64; 2]]) -> (Vec<[i64; 2]>, Vec<[i64; 2]>) {
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    let mut x = range[0];
    for r in ranges {
        if r[1] < x || r[0] > range[1] {
            continue;
        }
        if r[0] > x {
            outside.push([x, r[0] - 1]);
        }
        let end = r[1].min(range[1]);
        inside.push([x.max(r[0]), end]);
        x = end.saturating_add(1);
        if x > range[1] {
            break;
        }
    }
    if x <= range[1] {
        outside.push([x, range[1]]);
    }
    (inside, outside)
}

/// The comparison with the log: its records (`read`) in the `holes` (expected, found nowhere)
/// are lost; those below `verified_from` (where the check starts) or in `pending` ranges are
/// not expected (counted, or skipped).
pub fn against_log(
    holes: &[[i64; 2]],
    verified_from: i64,
    pending: &[[i64; 2]],
    read: &crate::audit::LogRead,
) -> crate::audit::LogCheck {
    let mut check = crate::audit::LogCheck {
        log_from: read.low,
        records: 0,
        not_landed: Vec::new(),
        not_landed_offsets: 0,
        before_first: 0,
    };
    let mut h = 0;
    for &o in &read.offsets {
        if pending.iter().any(|[a, b]| *a <= o && o <= *b) {
            continue;
        }
        check.records += 1;
        if o < verified_from {
            check.before_first += 1;
            continue;
        }
        while h < holes.len() && holes[h][1] < o {
            h += 1;
        }
        if h < holes.len() && holes[h][0] <= o {
            check.not_landed_offsets += 1;
            let full = check.not_landed.len() >= crate::audit::MAX_LISTED;
            match check.not_landed.last_mut() {
                Some(last) if last[1] + 1 == o => last[1] = o,
                _ if full => {}
                _ => check.not_landed.push([o, o]),
            }
        }
    }
    check
}

/// Sorts `holes` (sorted, disjoint) by what the ledger says of them, and the batches the event
/// source gave up on (`given_up`).
fn classify(
    holes: &[[i64; 2]],
    ledger: &Ledger,
    from: Option<i64>,
    given_up: &[[i64; 2]],
) -> Verdict {
    // The ledger's entries in order: whole ranges, and sparse entries by index.
    let sparse: Vec<Delivered> = ledger.sparse().copied().collect();
    let mut segments: Vec<([i64; 2], Option<usize>)> = ledger
        .whole()
        .iter()
        .map(|r| (*r, None))
        .chain(
            sparse
                .iter()
                .enumerate()
                .map(|(i, d)| ([d.first, d.last], Some(i))),
        )
        .collect();
    segments.sort_unstable();
    let start = ledger.start();
    let mut v = Verdict::default();
    let mut sparse_holes: Vec<Vec<[i64; 2]>> = vec![Vec::new(); sparse.len()];
    for &[a, b] in holes {
        let mut x = a;
        while x <= b {
            // The piece x..=end and, if it lies in a sparse entry, which.
            let (end, in_sparse) = match start {
                Some(s) if x >= s => {
                    let at = segments.partition_point(|(r, _)| r[1] < x);
                    match segments.get(at) {
                        Some(([s0, e0], kind)) if *s0 <= x => (b.min(*e0), *kind),
                        // Covered by no entry: a batch that never reached a snapshot.
                        next => (next.map_or(b, |([s0, _], _)| b.min(s0 - 1)), None),
                    }
                }
                Some(s) => (b.min(s - 1), None),
                None => (b, None),
            };
            match in_sparse {
                Some(i) => sparse_holes[i].push([x, end]),
                None => match v.missing.last_mut() {
                    Some(last) if last[1] + 1 == x => last[1] = end,
                    _ => v.missing.push([x, end]),
                },
            }
            x = end + 1;
        }
    }
    v.missing_offsets = v
        .missing
        .iter()
        .copied()
        .fold(0i64, |n, h| n.saturating_add(len(h)));
    for (d, holes) in sparse.iter().zip(sparse_holes) {
        let empty: i64 = holes
            .iter()
            .copied()
            .fold(0i64, |n, h| n.saturating_add(len(h)));
        if from.is_some_and(|f| d.first < f) {
            // Partly before the audit's start: its offsets found there are not known.
            for h in holes {
                v.not_delivered_offsets = v.not_delivered_offsets.saturating_add(len(h));
                v.not_delivered.push(h);
            }
            continue;
        }
        let found = u64::try_from(len([d.first, d.last]).saturating_sub(empty)).unwrap_or(0);
        // What replays landed here were records the event source skipped (adding to what the
        // entry holds) or delivered and lost (not adding): either is honest.
        let (least, most) = (
            d.count,
            d.count
                .saturating_add(ledger.replayed_within(d.first, d.last)),
        );
        if (least..=most).contains(&found) {
            for h in holes {
                // Offsets no landed batch took: Kafka's gaps, but where the event source says
                // it gave up on a batch that held them.
                let (skipped, not_delivered) = split(h, given_up);
                for h in not_delivered {
                    v.not_delivered_offsets = v.not_delivered_offsets.saturating_add(len(h));
                    v.not_delivered.push(h);
                }
                for h in skipped {
                    v.skipped_offsets = v.skipped_offsets.saturating_add(len(h));
                    v.missing_offsets = v.missing_offsets.saturating_add(len(h));
                    v.skipped.push(h);
                }
            }
            continue;
        }
        let m = Miscount {
            first: d.first,
            last: d.last,
            delivered: d.count,
            found,
            holes: holes.into_iter().take(MAX_LISTED_GAPS).collect(),
        };
        if found < least {
            v.missing_offsets = v
                .missing_offsets
                .saturating_add(i64::try_from(least - found).unwrap_or(i64::MAX));
            v.short.push(m);
        } else {
            v.surplus.push(m);
        }
    }
    v
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
    use super::*;

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

    fn entries(list: &[(i64, i64, u64)]) -> Vec<Delivered> {
        list.iter()
            .map(|&(first, last, count)| Delivered { first, last, count })
            .collect()
    }

    /// A partition whose batches never saw a gap inside.
    fn ledger(list: &[(i64, i64, u64)]) -> Ledger {
        Ledger::new(entries(list))
    }

    /// A partition whose batches saw gaps inside (transactions, compaction).
    fn gappy(list: &[(i64, i64, u64)]) -> Ledger {
        Ledger::from_fold(&crate::ledger::Fold {
            gaps_inside: true,
            entries: entries(list),
            replayed: Vec::new(),
        })
    }

    fn found(first: i64, last: i64, gaps: &[[i64; 2]]) -> Shape {
        Shape {
            first: Some(first),
            last: Some(last),
            gaps: gaps.to_vec(),
        }
    }

    #[test]
    fn kafka_gaps_are_told_from_losses_by_the_ledger() {
        // Delivered: 0..=9 whole; from checkpoint 10, 7 records up to 19 (10..=11 not
        // delivered, a transaction marker at 15); from 20, 5 records up to 29.
        let l = gappy(&[(0, 9, 10), (10, 19, 7), (20, 29, 5)]);
        let v = judge(
            &found(0, 29, &[[10, 11], [15, 15], [20, 24]]),
            30,
            &[],
            &l,
            None,
        );
        assert_eq!(v.missing_offsets, 0, "{v:?}");
        assert_eq!(v.not_delivered, [[10, 11], [15, 15], [20, 24]]);
        assert_eq!(v.not_delivered_offsets, 8);
        assert!(v.short.is_empty() && v.surplus.is_empty());
        // 3 lost in the whole entry, one in the sparse one: named and counted.
        let v = judge(
            &found(0, 29, &[[3, 5], [10, 11], [14, 15], [20, 24]]),
            30,
            &[],
            &l,
            None,
        );
        assert_eq!(v.missing, [[3, 5]]);
        assert_eq!(v.missing_offsets, 4);
        assert_eq!(v.short.len(), 1);
        assert_eq!(
            (
                v.short[0].delivered,
                v.short[0].found,
                v.short[0].holes.clone()
            ),
            (7, 6, vec![[10, 11], [14, 15]])
        );
        // Rows at offsets the sparse entry says were not delivered: a surplus.
        let v = judge(&found(0, 29, &[[20, 24]]), 30, &[], &l, None);
        assert_eq!(v.surplus.len(), 1, "{v:?}");
        assert_eq!(v.missing_offsets, 0);
    }

    #[test]
    fn a_batch_lost_before_its_commit_is_covered_by_no_entry() {
        let l = ledger(&[(0, 9, 10), (20, 29, 10)]);
        let v = judge(&found(0, 29, &[[10, 19]]), 30, &[], &l, None);
        assert_eq!((v.missing, v.missing_offsets), (vec![[10, 19]], 10));
        // The same at the tail, below the checkpoint, but not a pending batch.
        let v = judge(&found(0, 29, &[[10, 19]]), 40, &[[35, 39]], &l, None);
        assert_eq!(v.missing, [[10, 19], [30, 34]]);
    }

    /// The partition's audit with the event source's given-up batches `given_up`.
    fn judge_given_up(found: &Shape, next: i64, l: &Ledger, given_up: &[[i64; 2]]) -> Verdict {
        judge_with(
            found,
            &Expected {
                next_offset: next,
                pending: &[],
                ledger: l,
                from: None,
                first: None,
                given_up,
            },
        )
    }

    #[test]
    fn offsets_between_batches_are_missing_where_the_event_source_gave_up_on_them() {
        // From checkpoint 10, the next batch that landed started at 20.
        let l = ledger(&[(0, 9, 10), (10, 29, 10)]);
        // The event source says it gave up on 10..=19: skipped, missing.
        let v = judge_given_up(&found(0, 29, &[[10, 19]]), 30, &l, &[[10, 19]]);
        assert_eq!((v.skipped, v.missing_offsets), (vec![[10, 19]], 10));
        // It says nothing of them: Kafka's (aborted records between two transactions), listed.
        let v = judge_given_up(&found(0, 29, &[[10, 19]]), 30, &l, &[]);
        assert_eq!((v.missing_offsets, v.not_delivered_offsets), (0, 10));
        // Whether other batches saw gaps inside changes neither verdict.
        let g = gappy(&[(0, 9, 10), (10, 29, 10)]);
        let v = judge_given_up(&found(0, 29, &[[10, 19]]), 30, &g, &[[10, 19]]);
        assert_eq!((v.skipped, v.missing_offsets), (vec![[10, 19]], 10));
        let v = judge_given_up(&found(0, 29, &[[10, 19]]), 30, &g, &[]);
        assert_eq!((v.missing_offsets, v.not_delivered_offsets), (0, 10));
        // Part of a hole given up on, part Kafka's.
        let v = judge_given_up(&found(0, 29, &[[10, 19]]), 30, &l, &[[12, 14]]);
        assert_eq!((v.skipped.clone(), v.missing_offsets), (vec![[12, 14]], 3));
        assert_eq!(v.not_delivered, [[10, 11], [15, 19]]);
        // A replay landed them: folded into the ledger, all accounted for.
        let mut fold = crate::ledger::Fold::default();
        fold.add(&entries(&[(0, 9, 10), (10, 29, 10)]), &[], false);
        fold.add(&[], &entries(&[(10, 19, 10)]), false);
        let v = judge(&found(0, 29, &[]), 30, &[], &Ledger::from_fold(&fold), None);
        assert_eq!(v.missing_offsets, 0, "{v:?}");
        assert_eq!(v.not_delivered_offsets, 0);
    }

    #[test]
    fn a_first_batch_lost_before_its_commit_is_missing_from_the_checkpoints_first_offset() {
        // The partition started at 0 (its checkpoint says); the ledger starts at 10: the
        // first batch never reached a snapshot.
        let l = ledger(&[(10, 19, 10)]);
        let e = Expected {
            next_offset: 20,
            pending: &[],
            ledger: &l,
            from: None,
            first: Some(0),
            given_up: &[],
        };
        let v = judge_with(&found(10, 19, &[]), &e);
        assert_eq!((v.missing, v.missing_offsets), (vec![[0, 9]], 10));
        // Without it, the ledger's start is where the partition is known to start.
        let v = judge(&found(10, 19, &[]), 20, &[], &l, None);
        assert_eq!(v.missing_offsets, 0);
    }

    #[test]
    fn history_older_than_the_ledger_expects_every_offset() {
        // The ledger starts at 20 (an upgrade); below it every offset is expected.
        let l = ledger(&[(20, 29, 10)]);
        let v = judge(&found(0, 29, &[[5, 6]]), 30, &[], &l, None);
        assert_eq!(v.missing, [[5, 6]]);
        // No ledger at all: as before.
        let v = judge(&found(0, 29, &[[5, 6]]), 35, &[], &Ledger::default(), None);
        assert_eq!(v.missing, [[5, 6], [30, 34]]);
    }

    #[test]
    fn a_delivered_range_lost_whole_is_missing_even_below_what_was_found() {
        // Nothing of 0..=9 landed; found from 10.
        let l = ledger(&[(0, 9, 10), (10, 19, 10)]);
        let v = judge(&found(10, 19, &[]), 20, &[], &l, None);
        assert_eq!(v.missing, [[0, 9]]);
        // Nothing found at all.
        let v = judge(&Shape::default(), 20, &[], &l, None);
        assert_eq!(v.missing, [[0, 19]]);
        // A pending batch is not expected yet.
        let v = judge(&Shape::default(), 30, &[[20, 29]], &l, None);
        assert_eq!(v.missing, [[0, 19]]);
    }

    #[test]
    fn the_log_tells_lost_records_from_kafka_gaps() {
        // Expected and found nowhere: 10..=14 (not delivered, says the ledger) and 20..=21.
        let holes = [[10, 14], [20, 21]];
        // The log has 12 and 13 (the event source skipped them), not 10, 11, 14 (aborted, a
        // marker), and 20 (pending: skipped); 3 lies below where the check starts.
        let read = crate::audit::LogRead {
            low: 0,
            offsets: vec![3, 5, 6, 7, 8, 9, 12, 13, 15, 20],
        };
        let c = against_log(&holes, 5, &[[20, 21]], &read);
        assert_eq!(c.not_landed, [[12, 13]]);
        assert_eq!((c.not_landed_offsets, c.before_first, c.records), (2, 1, 9));
    }

    #[test]
    fn ranges_split_into_the_pieces_inside_and_outside() {
        assert_eq!(split([0, 9], &[]), (vec![], vec![[0, 9]]));
        assert_eq!(
            split([0, 9], &[[2, 3], [6, 20]]),
            (vec![[2, 3], [6, 9]], vec![[0, 1], [4, 5]])
        );
        assert_eq!(split([5, 5], &[[0, 4]]), (vec![], vec![[5, 5]]));
        assert_eq!(split([0, 9], &[[0, 9]]), (vec![[0, 9]], vec![]));
    }

    #[test]
    fn single_offsets_between_batches_may_be_markers_and_replays_may_fill_losses() {
        // One transaction per batch: a commit marker between batches (5, 10), no gap inside.
        let l = ledger(&[(0, 4, 5), (5, 9, 4), (10, 13, 3)]);
        let v = judge(&found(0, 13, &[[5, 5], [10, 10]]), 14, &[], &l, None);
        assert_eq!(
            (v.missing_offsets, v.not_delivered_offsets),
            (0, 2),
            "{v:?}"
        );
        // A row lost in a sparse entry, then landed again by a replay: not short.
        let mut fold = crate::ledger::Fold::default();
        fold.add(&entries(&[(0, 19, 18)]), &[], true);
        fold.add(&[], &entries(&[(12, 12, 1)]), false);
        let v = judge(
            &found(0, 19, &[[5, 5], [15, 15]]),
            20,
            &[],
            &Ledger::from_fold(&fold),
            None,
        );
        assert_eq!(v.missing_offsets, 0, "{v:?}");
        assert!(v.short.is_empty() && v.surplus.is_empty());
    }
}
