//! Dedup by key within a time bound, per Kafka partition: the first occurrence of a key wins;
//! a later record with the same key whose event time is within the bound of the first's is
//! dropped (and counted). Keys are forgotten once the partition's watermark passed their first
//! event time plus the bound, so the state stays bounded.
//!
//! Producers that retry without idempotence re-send an event under the same Kafka key, so the
//! copies land in the same partition: exactly-once delivery cannot remove them, this can. A
//! record whose key or event time is NULL is never a duplicate.

use arrow_array::RecordBatch;

use super::cell::Cell;
use crate::spec::Dedup;

/// Which rows of one partition's batch are first occurrences; updates `seen`.
///
/// `seen` is kept sorted by key, so a batch costs a binary search per row and one merge of its
/// new keys, not a hash of every key in the bound; sorted keys (with their common prefixes) also
/// compress better in the stored state.
pub(crate) fn first_occurrences(
    dedup: &Dedup,
    key_columns: &[usize],
    rows: &RecordBatch,
    times: &[Option<i64>],
    watermark_after: Option<i64>,
    seen: &mut Vec<(Vec<Cell>, i64)>,
) -> Vec<bool> {
    let within = dedup.within_ms.saturating_mul(1000).unsigned_abs();
    if !seen.is_sorted_by(|a, b| a.0 <= b.0) {
        // A state of an earlier layout, in no particular order.
        seen.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    }
    // Keys first seen in this batch, and where each is.
    let mut fresh: Vec<(Vec<Cell>, i64)> = Vec::new();
    let mut fresh_index: foldhash::HashMap<Vec<Cell>, usize> = Default::default();
    let mut keep = Vec::with_capacity(rows.num_rows());
    for (i, t) in times.iter().enumerate().take(rows.num_rows()) {
        let key: Option<Vec<Cell>> = key_columns
            .iter()
            .map(|&c| Cell::of(rows.column(c).as_ref(), i).filter(|v| *v != Cell::Null))
            .collect();
        let (Some(key), Some(t)) = (key, *t) else {
            keep.push(true);
            continue;
        };
        let first = match seen.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(at) => Some(&mut seen[at].1),
            Err(_) => fresh_index.get(&key).map(|&at| &mut fresh[at].1),
        };
        match first {
            Some(first) if t.abs_diff(*first) <= within => keep.push(false),
            Some(first) => {
                *first = t;
                keep.push(true);
            }
            None => {
                fresh_index.insert(key.clone(), fresh.len());
                fresh.push((key, t));
                keep.push(true);
            }
        }
    }
    let horizon = watermark_after.unwrap_or(i64::MIN);
    let alive = |(_, first): &(Vec<Cell>, i64)| first.saturating_add_unsigned(within) >= horizon;
    fresh.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let old = std::mem::take(seen);
    seen.reserve(old.len() + fresh.len());
    let (mut old, mut fresh) = (
        old.into_iter().filter(alive).peekable(),
        fresh.into_iter().filter(alive).peekable(),
    );
    loop {
        let take_old = match (old.peek(), fresh.peek()) {
            (Some(a), Some(b)) => a.0 < b.0,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        seen.extend(if take_old { old.next() } else { fresh.next() });
    }
    keep
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
        let keep = first_occurrences(&dedup, &[0], &rows, &times, Some(15_000), &mut seen);
        // The second "a" is within 10 ms of the first; NULL keys are never duplicates; the
        // last "a" is 20 ms later: a new first occurrence.
        assert_eq!(keep, vec![true, true, false, true, true, true]);
        // "b" (first at 1 ms) expired at watermark 15 ms; "a" is now first at 20 ms.
        assert_eq!(seen, vec![(vec![Cell::Str("a".into())], 20_000)]);
    }

    #[test]
    fn keys_stay_sorted_and_an_unsorted_state_is_read() {
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
        // Unsorted, as an earlier layout stored it: "x" is seen, "b" too.
        let mut seen = vec![(key("x"), 0), (key("b"), 0)];
        let times = [Some(10); 5];
        let keep = first_occurrences(&dedup, &[0], &rows, &times, None, &mut seen);
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
}
