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
pub(crate) fn first_occurrences(
    dedup: &Dedup,
    key_columns: &[usize],
    rows: &RecordBatch,
    times: &[Option<i64>],
    watermark_after: Option<i64>,
    seen: &mut Vec<(Vec<Cell>, i64)>,
) -> Vec<bool> {
    let within = dedup.within_ms.saturating_mul(1000);
    let mut index: foldhash::HashMap<Vec<Cell>, i64> = std::mem::take(seen).into_iter().collect();
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
        match index.get(&key) {
            Some(first) if t.abs_diff(*first) <= within.unsigned_abs() => keep.push(false),
            _ => {
                index.insert(key, t);
                keep.push(true);
            }
        }
    }
    let horizon = watermark_after.unwrap_or(i64::MIN);
    // In no particular order: the state is read back into a map.
    *seen = index
        .into_iter()
        .filter(|(_, first)| first.saturating_add(within) >= horizon)
        .collect();
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
}
