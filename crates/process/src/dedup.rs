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

use arrow_array::RecordBatch;

use super::partition_state::Keys;
use super::partition_state::keys::{Entry, hash_key};
use super::value::ValueRef;
use crate::spec::Dedup;

/// Which rows of one partition's batch are first occurrences; updates `keys`.
///
/// The batch's keys are hashed from its columns (nothing allocated per row) and its rows sorted
/// by hash (offset order within a key); each key is looked up in the remembered runs once, and
/// the keys this batch saw first (or again past the bound) become its fresh entries: what the
/// next write stores, and all it stores. Runs the bound has passed are dropped whole.
pub(crate) fn first_occurrences(
    dedup: &Dedup,
    key_columns: &[usize],
    rows: &RecordBatch,
    times: &[Option<i64>],
    watermarks: &[Option<i64>],
    watermark_after: Option<i64>,
    keys: &mut Keys,
) -> Vec<bool> {
    let within = dedup.within_ms.saturating_mul(1000).unsigned_abs();
    let n = rows.num_rows().min(times.len());
    let columns: Vec<&dyn arrow_array::Array> = key_columns
        .iter()
        .map(|&c| rows.column(c).as_ref())
        .collect();
    // Rows with a whole key and an event time (the others are never duplicates): (hash, row,
    // time), sorted by hash, offset order within a key.
    let mut keep = vec![true; rows.num_rows()];
    let mut scratch = Vec::with_capacity(64);
    let mut candidates: Vec<(u128, usize, i64)> = Vec::with_capacity(n);
    'rows: for (i, t) in times.iter().enumerate().take(n) {
        let Some(t) = *t else { continue };
        for c in &columns {
            if matches!(ValueRef::of(*c, i), Some(ValueRef::Null) | None) {
                continue 'rows;
            }
        }
        let hash = hash_key(
            columns.iter().filter_map(|c| ValueRef::of(*c, i)),
            &mut scratch,
        );
        candidates.push((hash, i, t));
    }
    candidates.sort_unstable_by_key(|c| (c.0, c.1));

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
    debug_assert!(keys.loaded(), "every run's entries are read before a batch");
    let mut distinct: Vec<u128> = candidates.iter().map(|c| c.0).collect();
    distinct.dedup();
    let stored_times = keys.get_sorted(&distinct);
    let mut fresh: Vec<Entry> = Vec::new();
    let mut g = 0;
    for (&hash, &stored) in distinct.iter().zip(&stored_times) {
        let mut end = g + 1;
        while end < candidates.len() && candidates[end].0 == hash {
            end += 1;
        }
        let mut first = stored;
        for &(_, row, t) in &candidates[g..end] {
            match first {
                Some(f) if remembered(f, row) && t.abs_diff(f) <= within => keep[row] = false,
                _ => first = Some(t),
            }
        }
        match (stored, first) {
            (Some(s), Some(f)) if s == f => {}
            // A changed first occurrence is written even when already past the bound: it
            // hides the older entry, and must not expire before it.
            (Some(s), Some(f)) => {
                if s > f {
                    keys.hides(s);
                }
                fresh.push((hash, f));
            }
            (None, Some(f)) if alive(f) => fresh.push((hash, f)),
            _ => {}
        }
        g = end;
    }
    keys.add(fresh);
    keys.expire(horizon, within);
    keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition_state::keys::{Run, RunRef, time_range};
    use crate::value::Value;
    use arrow_array::{ArrayRef, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;

    fn hash(id: &str) -> u128 {
        hash_key([ValueRef::Str(id)].into_iter(), &mut Vec::new())
    }

    /// `entries` as one stored run.
    fn stored(entries: &[(&str, i64)]) -> Keys {
        let mut fresh: Vec<Entry> = entries.iter().map(|(k, t)| (hash(k), *t)).collect();
        fresh.sort_unstable();
        let mut keys = Keys::default();
        if !fresh.is_empty() {
            let (min_t, max_t) = time_range(&fresh);
            keys.runs.push(Run {
                at: RunRef {
                    file: "f".into(),
                    block: 0,
                    count: fresh.len() as u64,
                    min_t,
                    max_t,
                    merged: true,
                    horizon: i64::MIN,
                },
                entries: Some(Arc::new(fresh)),
                filter: Default::default(),
            });
        }
        keys
    }

    /// What is remembered of `universe` at `horizon` within `within` µs.
    fn remembered(keys: &Keys, universe: &[&str], horizon: i64, within: u64) -> Vec<(String, i64)> {
        universe
            .iter()
            .filter_map(|k| {
                keys.get(hash(k))
                    .filter(|f| f.saturating_add_unsigned(within) >= horizon)
                    .map(|f| (k.to_string(), f))
            })
            .collect()
    }

    fn batch(ids: Vec<Option<&str>>) -> RecordBatch {
        let ids: ArrayRef = Arc::new(StringArray::from(ids));
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
            vec![ids],
        )
        .unwrap()
    }

    #[test]
    fn first_occurrence_wins_within_the_bound_and_keys_expire() {
        let rows = batch(vec![Some("a"), Some("b"), Some("a"), None, None, Some("a")]);
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
        let mut keys = Keys::default();
        let keep = first_occurrences(&dedup, &[0], &rows, &times, &[], Some(15_000), &mut keys);
        // The second "a" is within 10 ms of the first; NULL keys are never duplicates; the
        // last "a" is 20 ms later: a new first occurrence.
        assert_eq!(keep, vec![true, true, false, true, true, true]);
        // "b" (first at 1 ms) expired at watermark 15 ms; "a" is now first at 20 ms.
        assert_eq!(
            remembered(&keys, &["a", "b"], 15_000, 10_000),
            vec![("a".to_string(), 20_000)]
        );
        assert_eq!(
            keys.fresh,
            vec![(hash("a"), 20_000)],
            "b was never worth storing"
        );
    }

    /// Row by row, as the rule reads: the reference the lookups must agree with.
    fn one_by_one(
        within_us: u64,
        keys: &[Option<&str>],
        times: &[Option<i64>],
        watermarks: &[Option<i64>],
        watermark: Option<i64>,
        seen: &[(Vec<Value>, i64)],
    ) -> (Vec<bool>, Vec<(Vec<Value>, i64)>) {
        let mut map: std::collections::BTreeMap<Vec<Value>, i64> = seen.iter().cloned().collect();
        let keep = keys
            .iter()
            .zip(times)
            .zip(watermarks)
            .map(|((k, t), wm)| {
                let (Some(k), Some(t)) = (k, t) else {
                    return true;
                };
                let key = vec![Value::Str(k.to_string())];
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
        fn lookups_agree_with_row_by_row(
            rows in proptest::collection::vec(
                (proptest::option::weighted(0.9, "[a-e]"), proptest::option::weighted(0.9, 0i64..50)),
                0..40),
            stored_keys in proptest::collection::btree_map("[a-g]", 0i64..50, 0..6),
            within_ms in 0i64..20,
            prior_max in proptest::option::of(0i64..60),
            out_of_orderness_ms in 0i64..20,
        ) {
            let ids: Vec<Option<&str>> = rows.iter().map(|(k, _)| k.as_deref()).collect();
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
            let before: Vec<(&str, i64)> =
                stored_keys.iter().map(|(k, t)| (k.as_str(), t * 1000)).collect();
            let seen: Vec<(Vec<Value>, i64)> = before
                .iter()
                .map(|(k, t)| (vec![Value::Str(k.to_string())], *t))
                .collect();
            let dedup = Dedup { key: vec!["id".into()], within_ms };
            let mut keys = stored(&before);
            let keep = first_occurrences(
                &dedup, &[0], &batch(ids.clone()), &times, &watermarks, watermark, &mut keys,
            );
            let within = within_ms as u64 * 1000;
            let (want_keep, want_seen) =
                one_by_one(within, &ids, &times, &watermarks, watermark, &seen);
            proptest::prop_assert_eq!(keep, want_keep);
            let universe = ["a", "b", "c", "d", "e", "f", "g"];
            let want: Vec<(String, i64)> = want_seen
                .into_iter()
                .map(|(k, t)| match &k[0] { Value::Str(s) => (s.clone(), t), _ => unreachable!() })
                .collect();
            let horizon = watermark.unwrap_or(i64::MIN);
            proptest::prop_assert_eq!(remembered(&keys, &universe, horizon, within), want);
        }
    }

    /// Runs `rows` (key, time in ms) through `first_occurrences` in batches cut at `cuts`,
    /// sealing the state after each batch as a write does (runs, merges, expiry), with the
    /// partition's watermark carried across batches: the rows kept, and the keys' state.
    fn in_batches(
        rows: &[(Option<&str>, Option<i64>)],
        cuts: &[usize],
        within_ms: i64,
        ooo_ms: i64,
    ) -> (Vec<bool>, crate::partition_state::PartitionState) {
        let dedup = Dedup {
            key: vec!["id".into()],
            within_ms,
        };
        let mut state = crate::partition_state::PartitionState::default();
        state.tables.insert("t".into(), Default::default());
        let mut max: Option<i64> = None;
        let mut keep = Vec::new();
        let mut bounds: Vec<usize> = cuts.iter().copied().filter(|c| *c < rows.len()).collect();
        bounds.sort_unstable();
        bounds.dedup();
        bounds.push(rows.len());
        let mut from = 0;
        for (n, to) in bounds.into_iter().enumerate() {
            let part = &rows[from..to];
            from = to;
            let times: Vec<Option<i64>> = part.iter().map(|(_, t)| t.map(|t| t * 1000)).collect();
            let mut watermarks = Vec::new();
            for t in &times {
                watermarks.push(max.map(|m| m - ooo_ms * 1000));
                if let Some(t) = t {
                    max = Some(max.map_or(*t, |m| m.max(*t)));
                }
            }
            let ids: Vec<Option<&str>> = part.iter().map(|(k, _)| *k).collect();
            let keys = &mut state.tables.get_mut("t").unwrap().keys;
            keep.extend(first_occurrences(
                &dedup,
                &[0],
                &batch(ids),
                &times,
                &watermarks,
                max.map(|m| m - ooo_ms * 1000),
                keys,
            ));
            state.seal(|_| Some(within_ms as u64 * 1000)).unwrap();
            state.placed(&format!("f{n}"));
        }
        (keep, state)
    }

    proptest::proptest! {
        #[test]
        fn runs_merges_and_expiry_agree_with_row_by_row_however_batches_are_cut(
            rows in proptest::collection::vec(
                (proptest::option::weighted(0.95, "[a-e]"), proptest::option::weighted(0.95, 0i64..120)),
                0..60),
            cuts in proptest::collection::vec(0usize..60, 0..20),
            within_ms in 1i64..30,
            ooo_ms in 0i64..10,
        ) {
            let (keep, _) = in_batches(
                &rows.iter().map(|(k, t)| (k.as_deref(), *t)).collect::<Vec<_>>(),
                &cuts, within_ms, ooo_ms,
            );
            // The whole sequence at once, row by row.
            let ids: Vec<Option<&str>> = rows.iter().map(|(k, _)| k.as_deref()).collect();
            let times: Vec<Option<i64>> = rows.iter().map(|(_, t)| t.map(|t| t * 1000)).collect();
            let mut max: Option<i64> = None;
            let mut watermarks = Vec::new();
            for t in &times {
                watermarks.push(max.map(|m| m - ooo_ms * 1000));
                if let Some(t) = t {
                    max = Some(max.map_or(*t, |m| m.max(*t)));
                }
            }
            let (want, _) = one_by_one(
                within_ms as u64 * 1000, &ids, &times, &watermarks, None, &[],
            );
            proptest::prop_assert_eq!(keep, want);
        }
    }

    /// A late key in every batch (inside the bound) keeps neither more runs nor more entries
    /// than the keys inside the bound need.
    #[test]
    fn late_keys_do_not_make_the_state_grow() {
        let ids: Vec<String> = (0..2_000)
            .flat_map(|i| [format!("n{i}"), format!("l{i}")])
            .collect();
        let rows: Vec<(Option<&str>, Option<i64>)> = (0..2_000)
            .flat_map(|i| {
                let at = 100_000 + i * 100;
                [
                    (Some(ids[2 * i as usize].as_str()), Some(at)),
                    (Some(ids[2 * i as usize + 1].as_str()), Some(at - 2_000)),
                ]
            })
            .collect();
        let cuts: Vec<usize> = (1..2_000).map(|b| b * 2).collect();
        // Within 10 s at 100 ms per batch: about 200 keys of each kind are inside the bound.
        let (keep, state) = in_batches(&rows, &cuts, 10_000, 0);
        assert!(keep.iter().all(|k| *k), "every key is new");
        let keys = &state.tables["t"].keys;
        assert!(
            keys.len() <= 1_200,
            "{} entries kept for ~400 inside the bound",
            keys.len()
        );
        assert!(keys.runs.len() <= 30, "{} runs", keys.runs.len());
    }

    /// `[k@0, x@11, k@5]` with `within` 10 s: whether the second `k` is a duplicate depends on
    /// the records before it, not on whether a batch ended after `x`.
    #[test]
    fn dedup_does_not_depend_on_where_batches_end() {
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
        let mut keys = Keys::default();
        let whole = first_occurrences(
            &dedup,
            &[0],
            &batch(vec![Some("k"), Some("x"), Some("k")]),
            &times,
            &wms,
            after,
            &mut keys,
        );
        // Split after x.
        let mut keys = Keys::default();
        let (wms, after) = marks(None, &times[..2]);
        let first = first_occurrences(
            &dedup,
            &[0],
            &batch(vec![Some("k"), Some("x")]),
            &times[..2],
            &wms,
            after,
            &mut keys,
        );
        let (wms, after2) = marks(after, &times[2..]);
        let second = first_occurrences(
            &dedup,
            &[0],
            &batch(vec![Some("k")]),
            &times[2..],
            &wms,
            after2,
            &mut keys,
        );
        assert_eq!([first, second].concat(), whole);
        // k was forgotten when x moved the watermark to 11 s (past 0 s + 10 s): kept.
        assert_eq!(whole, vec![true, true, true]);
    }
}
