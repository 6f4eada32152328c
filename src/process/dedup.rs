//! Dedup by key within a time bound, per Kafka partition: the first occurrence of a key wins;
//! a later record with the same key whose event time is within the bound of the first's is
//! dropped (and counted). Keys are forgotten once the partition's watermark passed their first
//! event time plus the bound, so the state stays bounded. Whether a key is still remembered
//! when a record arrives is judged by the watermark before that record (computed from the
//! records before it), never by where a batch ended: the same records give the same rows
//! however the event source mapping cut them.
//!
//! Producers that retry without idempotence re-send an event under the same Kafka key, so the
//! copies land in the same partition: exactly-once delivery cannot remove them, this can. A
//! record whose key or event time is NULL is never a duplicate.

use std::cmp::Ordering;

use arrow_array::RecordBatch;

use super::cell::{Cell, CellRef};
use crate::spec::Dedup;

/// Which rows of one partition's batch are first occurrences; updates `seen`.
///
/// `seen` is sorted by key (as [`crate::process::state::PartitionState::decode`] returns it)
/// and kept so. The batch's keys are read borrowed from its columns and its rows sorted by key
/// (offset order within a key); each key is found in `seen` by galloping from the previous
/// one's place and updated in place, and the new keys are merged in at the end: a key costs an
/// allocation only when it is new, and sorted keys (with their common prefixes) also compress
/// better in the stored state.
pub(crate) fn first_occurrences(
    dedup: &Dedup,
    key_columns: &[usize],
    rows: &RecordBatch,
    times: &[Option<i64>],
    watermarks: &[Option<i64>],
    watermark_after: Option<i64>,
    seen: &mut Vec<(Vec<Cell>, i64)>,
) -> Vec<bool> {
    let within = dedup.within_ms.saturating_mul(1000).unsigned_abs();
    let n = rows.num_rows().min(times.len());
    let width = key_columns.len();
    let columns: Vec<&dyn arrow_array::Array> = key_columns
        .iter()
        .map(|&c| rows.column(c).as_ref())
        .collect();
    // Rows with a whole key and an event time (the others are never duplicates), their keys
    // flat (`width` cells per candidate), then sorted by key, offset order within a key.
    let mut keep = vec![true; rows.num_rows()];
    let mut keys: Vec<CellRef<'_>> = Vec::with_capacity(n * width);
    let mut candidates: Vec<(usize, i64)> = Vec::with_capacity(n);
    'rows: for (i, t) in times.iter().enumerate().take(n) {
        let Some(t) = *t else { continue };
        let mark = keys.len();
        for c in &columns {
            match CellRef::of(*c, i) {
                Some(CellRef::Null) | None => {
                    keys.truncate(mark);
                    continue 'rows;
                }
                Some(v) => keys.push(v),
            }
        }
        candidates.push((i, t));
    }
    let key_of = |k: usize| &keys[k * width..(k + 1) * width];
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| key_of(a).cmp(key_of(b)).then(a.cmp(&b)));

    let horizon = watermark_after.unwrap_or(i64::MIN);
    let alive = |first: i64| first.saturating_add_unsigned(within) >= horizon;
    // Whether a key first seen at `first` is still remembered for row `row`.
    let remembered = |first: i64, row: usize| {
        watermarks
            .get(row)
            .copied()
            .flatten()
            .is_none_or(|wm| first.saturating_add_unsigned(within) >= wm)
    };
    // Keys of the batch already stored are updated in place; the others collected, in order.
    let mut fresh: Vec<(Vec<Cell>, i64)> = Vec::new();
    let mut cursor = 0;
    let mut g = 0;
    while g < order.len() {
        let key = key_of(order[g]);
        let mut end = g + 1;
        while end < order.len() && key_of(order[end]) == key {
            end += 1;
        }
        // Where the key is (or would be) among the stored ones, found by galloping from the
        // previous key's place: a batch whose keys come after every stored one compares a few
        // stored keys, not all of them.
        cursor += gallop(&seen[cursor..], |o| stored_cmp(&o.0, key) == Ordering::Less);
        let stored = seen
            .get_mut(cursor)
            .filter(|o| stored_cmp(&o.0, key) == Ordering::Equal);
        let mut first = stored.as_ref().map(|o| o.1);
        for &k in &order[g..end] {
            let (row, t) = candidates[k];
            match first {
                Some(f) if remembered(f, row) && t.abs_diff(f) <= within => keep[row] = false,
                _ => first = Some(t),
            }
        }
        match (stored, first) {
            (Some(o), Some(f)) => o.1 = f,
            (None, Some(f)) if alive(f) => {
                fresh.push((key.iter().map(|c| c.to_cell()).collect(), f));
            }
            _ => {}
        }
        g = end;
    }
    seen.retain(|o| alive(o.1));
    merge_sorted(seen, fresh);
    keep
}

/// Merges `fresh` (sorted, no key of it in `seen`) into `seen` (sorted), in place: appended
/// when every fresh key comes after the stored ones (keys that grow over time, as order ids
/// do), else merged from the back, moving only the stored keys after the first fresh one.
fn merge_sorted(seen: &mut Vec<(Vec<Cell>, i64)>, mut fresh: Vec<(Vec<Cell>, i64)>) {
    let after_all = match (seen.last(), fresh.first()) {
        (_, None) => return,
        (None, Some(_)) => true,
        (Some(last), Some(first)) => last.0 < first.0,
    };
    if after_all {
        seen.append(&mut fresh);
        return;
    }
    // Slots [stored, write) are free (moved out); everything from `write` on is in place.
    let mut stored = seen.len();
    seen.resize_with(stored + fresh.len(), Default::default);
    let mut write = seen.len();
    while let Some(next) = fresh.pop() {
        while stored > 0 && seen[stored - 1].0 > next.0 {
            seen.swap(stored - 1, write - 1);
            stored -= 1;
            write -= 1;
        }
        seen[write - 1] = next;
        write -= 1;
    }
}

/// How many leading elements of `slice` satisfy `before` (true, then false from some point on):
/// an exponential search, then a binary one within the last step.
fn gallop<T>(slice: &[T], before: impl Fn(&T) -> bool) -> usize {
    let mut step = 1;
    while step <= slice.len() && before(&slice[step - 1]) {
        step *= 2;
    }
    let lo = step / 2;
    lo + slice[lo..step.min(slice.len())].partition_point(before)
}

/// A stored key against a batch's borrowed key, in `Cell` order.
fn stored_cmp(stored: &[Cell], key: &[CellRef<'_>]) -> Ordering {
    stored.iter().map(Cell::borrowed).cmp(key.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;

    #[test]
    fn first_occurrence_wins_within_the_bound_and_keys_expire() {
        let ids: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a"),
            Some("b"),
            Some("a"),
            None,
            None,
            Some("a"),
        ]));
        let rows = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
            vec![ids],
        )
        .unwrap();
        let dedup = Dedup {
            key: vec!["id".into()],
            within_ms: 10,
        };
        let times = [
            Some(0),
            Some(1_000),
            Some(5_000),
            Some(1),
            Some(1),
            Some(20_000),
        ];
        let mut seen = Vec::new();
        let keep = first_occurrences(&dedup, &[0], &rows, &times, &[], Some(15_000), &mut seen);
        // The second "a" is within 10 ms of the first; NULL keys are never duplicates; the
        // last "a" is 20 ms later: a new first occurrence.
        assert_eq!(keep, vec![true, true, false, true, true, true]);
        // "b" (first at 1 ms) expired at watermark 15 ms; "a" is now first at 20 ms.
        assert_eq!(seen, vec![(vec![Cell::Str("a".into())], 20_000)]);
    }

    /// Row by row, as the rule reads: the reference the merge must agree with.
    fn one_by_one(
        within_us: u64,
        keys: &[Option<&str>],
        times: &[Option<i64>],
        watermarks: &[Option<i64>],
        watermark: Option<i64>,
        seen: &[(Vec<Cell>, i64)],
    ) -> (Vec<bool>, Vec<(Vec<Cell>, i64)>) {
        let mut map: std::collections::BTreeMap<Vec<Cell>, i64> = seen.iter().cloned().collect();
        let keep = keys
            .iter()
            .zip(times)
            .zip(watermarks)
            .map(|((k, t), wm)| {
                let (Some(k), Some(t)) = (k, t) else {
                    return true;
                };
                let key = vec![Cell::Str(k.to_string())];
                let remembered =
                    |f: i64| wm.is_none_or(|wm| f.saturating_add_unsigned(within_us) >= wm);
                match map.get(&key) {
                    Some(f) if remembered(*f) && t.abs_diff(*f) <= within_us => false,
                    _ => {
                        map.insert(key, *t);
                        true
                    }
                }
            })
            .collect();
        let horizon = watermark.unwrap_or(i64::MIN);
        map.retain(|_, f| f.saturating_add_unsigned(within_us) >= horizon);
        (keep, map.into_iter().collect())
    }

    proptest::proptest! {
        #[test]
        fn merge_agrees_with_row_by_row(
            rows in proptest::collection::vec(
                (proptest::option::weighted(0.9, "[a-e]"), proptest::option::weighted(0.9, 0i64..50)),
                0..40),
            stored in proptest::collection::btree_map("[a-g]", 0i64..50, 0..6),
            within_ms in 0i64..20,
            prior_max in proptest::option::of(0i64..60),
            out_of_orderness_ms in 0i64..20,
        ) {
            let keys: Vec<Option<&str>> = rows.iter().map(|(k, _)| k.as_deref()).collect();
            // Times in ms of the strategy, µs in the state.
            let times: Vec<Option<i64>> = rows.iter().map(|(_, t)| t.map(|t| t * 1000)).collect();
            // The watermark before each row and after the batch, as the partition computes them.
            let ooo = out_of_orderness_ms * 1000;
            let mut max = prior_max.map(|m| m * 1000);
            let mut watermarks = Vec::new();
            for t in &times {
                watermarks.push(max.map(|m| m - ooo));
                if let Some(t) = t {
                    max = Some(max.map_or(*t, |m| m.max(*t)));
                }
            }
            let watermark = max.map(|m| m - ooo);
            let seen: Vec<(Vec<Cell>, i64)> = stored
                .into_iter()
                .map(|(k, t)| (vec![Cell::Str(k)], t * 1000))
                .collect();
            let ids: ArrayRef = Arc::new(StringArray::from(keys.clone()));
            let batch = RecordBatch::try_new(
                Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
                vec![ids],
            )
            .unwrap();
            let dedup = Dedup { key: vec!["id".into()], within_ms };
            let mut merged = seen.clone();
            let keep = first_occurrences(
                &dedup, &[0], &batch, &times, &watermarks, watermark, &mut merged,
            );
            let (want_keep, want_seen) = one_by_one(
                within_ms as u64 * 1000, &keys, &times, &watermarks, watermark, &seen,
            );
            proptest::prop_assert_eq!(keep, want_keep);
            proptest::prop_assert_eq!(merged, want_seen);
        }
    }

    #[test]
    fn galloping_finds_where_a_predicate_turns() {
        for len in 0..40 {
            let v: Vec<usize> = (0..len).collect();
            for turn in 0..=len {
                assert_eq!(gallop(&v, |x| *x < turn), turn, "{len} {turn}");
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn merging_in_place_keeps_every_key_in_order(
            stored in proptest::collection::btree_set(0i64..60, 0..20),
            fresh in proptest::collection::btree_set(0i64..60, 0..20),
        ) {
            let key = |v: i64| (vec![Cell::Int(v)], v);
            let mut seen: Vec<_> = stored.iter().map(|v| key(*v)).collect();
            let fresh: Vec<_> = fresh.difference(&stored).map(|v| key(*v)).collect();
            let mut want: Vec<_> = seen.iter().cloned().chain(fresh.iter().cloned()).collect();
            want.sort();
            merge_sorted(&mut seen, fresh);
            proptest::prop_assert_eq!(seen, want);
        }
    }

    #[test]
    fn keys_stay_sorted() {
        let ids: ArrayRef = Arc::new(StringArray::from(vec!["m", "c", "x", "c", "a"]));
        let rows = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
            vec![ids],
        )
        .unwrap();
        let dedup = Dedup {
            key: vec!["id".into()],
            within_ms: 1_000,
        };
        let key = |s: &str| vec![Cell::Str(s.into())];
        // "b" and "x" are seen.
        let mut seen = vec![(key("b"), 0), (key("x"), 0)];
        let times = [Some(10); 5];
        let keep = first_occurrences(&dedup, &[0], &rows, &times, &[], None, &mut seen);
        assert_eq!(keep, vec![true, true, false, false, true]);
        assert_eq!(
            seen,
            vec![
                (key("a"), 10),
                (key("b"), 0),
                (key("c"), 10),
                (key("m"), 10),
                (key("x"), 0)
            ]
        );
    }

    /// `[k@0, x@11, k@5]` with `within` 10 s: whether the second `k` is a duplicate depends on
    /// the records before it, not on whether a batch ended after `x`.
    #[test]
    fn dedup_does_not_depend_on_where_batches_end() {
        let batch = |ids: &[&str]| {
            let ids: ArrayRef = Arc::new(StringArray::from(ids.to_vec()));
            RecordBatch::try_new(
                Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
                vec![ids],
            )
            .unwrap()
        };
        let dedup = Dedup {
            key: vec!["id".into()],
            within_ms: 10_000,
        };
        let s = |v: i64| v * 1_000_000;
        // The partition's watermark (no out-of-orderness): the highest event time before.
        let marks = |prior: Option<i64>, times: &[Option<i64>]| {
            let mut max = prior;
            let mut out = Vec::new();
            for t in times {
                out.push(max);
                max = max.max(*t);
            }
            (out, max)
        };
        // One batch.
        let times = [Some(s(0)), Some(s(11)), Some(s(5))];
        let (wms, after) = marks(None, &times);
        let mut seen = Vec::new();
        let whole = first_occurrences(
            &dedup,
            &[0],
            &batch(&["k", "x", "k"]),
            &times,
            &wms,
            after,
            &mut seen,
        );
        // Split after x.
        let mut seen = Vec::new();
        let (wms, after) = marks(None, &times[..2]);
        let first = first_occurrences(
            &dedup,
            &[0],
            &batch(&["k", "x"]),
            &times[..2],
            &wms,
            after,
            &mut seen,
        );
        let (wms, after2) = marks(after, &times[2..]);
        let second = first_occurrences(
            &dedup,
            &[0],
            &batch(&["k"]),
            &times[2..],
            &wms,
            after2,
            &mut seen,
        );
        assert_eq!([first, second].concat(), whole);
        // k was forgotten when x moved the watermark to 11 s (past 0 s + 10 s): kept.
        assert_eq!(whole, vec![true, true, true]);
    }
}
