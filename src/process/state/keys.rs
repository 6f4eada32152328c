//! A dedup's remembered keys in one partition, as immutable runs: each run is the keys one
//! batch first saw (or saw again past the bound), or several such runs merged, sorted by the
//! key's 128-bit hash. A batch adds one run and rewrites nothing it did not change; since keys
//! arrive roughly in event-time order, whole runs fall out of the bound and are dropped without
//! being read. Runs never change once written, so a warm container keeps them decoded by name.
//!
//! Keys are stored as xxh3-128 hashes of their cells: fixed width whatever the key, and two
//! distinct keys collide with odds of about n² / 2¹²⁹ (1e-26 for a million keys an hour) — a
//! collision would drop a record as a duplicate. A 64-bit hash would not be safe (1e-8).
//!
//! Merging is two-level, so that every entry is written at most twice: the young runs (one per
//! batch) are merged into one segment once they span an eighth of the bound or number
//! [`MAX_YOUNG`]; segments are never merged again, they expire whole.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::process::cell::{Cell, CellRef};

/// A remembered key: its hash and its first event time (µs).
pub type Entry = (u128, i64);

/// Young runs merged into a segment once there are this many.
pub const MAX_YOUNG: usize = 16;

/// Runs of one partition's dedup past this count (segments a stray record keeps alive) are all
/// merged into one, so that a partition's state stays small to list.
pub const MAX_RUNS: usize = 48;

/// Where a run is stored: a block of a partition's section in a state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRef {
    /// The state file's warehouse location (empty while the run is written with the section
    /// that names it: the same file).
    pub file: String,
    /// Which block of the partition's section in that file.
    pub block: u32,
    /// Entries.
    pub count: u64,
    /// The least and greatest first event time among its entries, µs.
    pub min_t: i64,
    /// See `min_t`.
    pub max_t: i64,
    /// A segment (merged runs, never merged again) or one batch's run.
    pub merged: bool,
}

/// A stored run and its entries (`None` until loaded).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Where it is.
    pub at: RunRef,
    /// Its entries, sorted by hash; shared with the container's cache.
    pub entries: Option<Arc<Vec<Entry>>>,
}

/// One dedup's keys in one partition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Keys {
    /// Stored runs, oldest first. A key's newest entry is the one that counts.
    pub runs: Vec<Run>,
    /// Keys this batch added or changed, sorted by hash, not stored yet.
    pub fresh: Vec<Entry>,
    /// `fresh` holds the keys of a state of an earlier layout: stored as a segment.
    pub migrated: bool,
}

/// The hash a key is remembered by.
pub fn hash_key<'a>(cells: impl Iterator<Item = CellRef<'a>>, scratch: &mut Vec<u8>) -> u128 {
    scratch.clear();
    for c in cells {
        match c {
            CellRef::Null => scratch.push(0),
            CellRef::Bool(b) => scratch.extend([1, u8::from(b)]),
            CellRef::Int(v) => {
                scratch.push(2);
                scratch.extend(v.to_le_bytes());
            }
            CellRef::Float(bits) => {
                scratch.push(3);
                scratch.extend(bits.to_le_bytes());
            }
            CellRef::Str(s) => {
                scratch.push(4);
                scratch.extend((s.len() as u64).to_le_bytes());
                scratch.extend(s.as_bytes());
            }
            CellRef::Dec(v) => {
                scratch.push(5);
                scratch.extend(v.to_le_bytes());
            }
        }
    }
    xxhash_rust::xxh3::xxh3_128(scratch)
}

impl Keys {
    /// Keys of an earlier layout (owned cells), to be stored as a segment by the next write.
    pub fn migrate(seen: &[(Vec<Cell>, i64)]) -> Keys {
        let mut scratch = Vec::new();
        let mut fresh: Vec<Entry> = seen
            .iter()
            .map(|(k, t)| (hash_key(k.iter().map(Cell::borrowed), &mut scratch), *t))
            .collect();
        fresh.sort_unstable_by_key(|e| e.0);
        fresh.dedup_by_key(|e| e.0);
        Keys {
            runs: Vec::new(),
            migrated: !fresh.is_empty(),
            fresh,
        }
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.fresh.is_empty()
    }

    /// Entries stored and fresh (a key written twice counts twice).
    pub fn len(&self) -> u64 {
        self.runs.iter().map(|r| r.at.count).sum::<u64>() + self.fresh.len() as u64
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        *self = Keys::default();
    }

    /// Whether every run's entries are in memory.
    pub fn loaded(&self) -> bool {
        self.runs.iter().all(|r| r.entries.is_some())
    }

    /// The first event time remembered for `hash`: the newest entry's.
    pub fn get(&self, hash: u128) -> Option<i64> {
        if let Ok(i) = self.fresh.binary_search_by_key(&hash, |e| e.0) {
            return Some(self.fresh[i].1);
        }
        self.runs.iter().rev().find_map(|r| {
            let entries = r.entries.as_ref()?;
            entries
                .binary_search_by_key(&hash, |e| e.0)
                .ok()
                .map(|i| entries[i].1)
        })
    }

    /// Adds `new` (sorted by hash, distinct) to the fresh entries, replacing equal hashes.
    pub fn add(&mut self, new: Vec<Entry>) {
        if new.is_empty() {
            return;
        }
        if self.fresh.is_empty() {
            self.fresh = new;
            return;
        }
        let old = std::mem::take(&mut self.fresh);
        self.fresh = merge_newest(&[&old, &new]);
    }

    /// Drops the runs whose every key the bound has passed at `horizon` (µs): a key is
    /// remembered while its first event time plus `within_us` is at least the horizon.
    pub fn expire(&mut self, horizon: i64, within_us: u64) {
        self.runs
            .retain(|r| r.at.max_t.saturating_add_unsigned(within_us) >= horizon);
    }

    /// The runs a write merges into one segment with the fresh entries (indices into `runs`,
    /// consecutive, the youngest ones), or `None` to store the fresh entries as a run of their
    /// own. Young runs are merged once they span an eighth of the bound (`within_us`) or
    /// number [`MAX_YOUNG`]; every run once they number [`MAX_RUNS`].
    pub fn merge_plan(&self, within_us: u64) -> Option<std::ops::Range<usize>> {
        if self.runs.len() + 1 > MAX_RUNS {
            return Some(0..self.runs.len());
        }
        let young = self.runs.iter().rev().take_while(|r| !r.at.merged).count();
        if young == 0 {
            return None;
        }
        let from = self.runs.len() - young;
        let young_runs = &self.runs[from..];
        let fresh_range = self.fresh.iter().map(|e| e.1);
        let min = young_runs
            .iter()
            .map(|r| r.at.min_t)
            .chain(fresh_range.clone())
            .min()?;
        let max = young_runs
            .iter()
            .map(|r| r.at.max_t)
            .chain(fresh_range)
            .max()?;
        let slice = (within_us / 8).max(1);
        if young + 1 >= MAX_YOUNG || max.abs_diff(min) >= slice {
            Some(from..self.runs.len())
        } else {
            None
        }
    }

    /// The entries of `runs[range]` and the fresh ones, a key's newest entry kept; `None` when
    /// a run is not loaded.
    pub fn merged(&self, range: std::ops::Range<usize>) -> Option<Vec<Entry>> {
        let mut parts: Vec<&[Entry]> = Vec::with_capacity(range.len() + 1);
        for r in &self.runs[range] {
            parts.push(r.entries.as_ref()?.as_slice());
        }
        parts.push(&self.fresh);
        Some(merge_newest(&parts))
    }
}

/// The union of sorted, distinct-hash `parts` (oldest first): for a hash in several, the
/// entry of the latest part.
pub fn merge_newest(parts: &[&[Entry]]) -> Vec<Entry> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut all: Vec<(u128, usize, i64)> = Vec::with_capacity(total);
    for (age, p) in parts.iter().enumerate() {
        all.extend(p.iter().map(|&(h, t)| (h, age, t)));
    }
    // Sorted by hash, the newest part last within a hash.
    all.sort_unstable_by_key(|e| (e.0, e.1));
    let mut out: Vec<Entry> = Vec::with_capacity(total);
    for (h, _, t) in all {
        match out.last_mut() {
            Some(last) if last.0 == h => last.1 = t,
            _ => out.push((h, t)),
        }
    }
    out
}

/// The time range of `entries`.
pub fn time_range(entries: &[Entry]) -> (i64, i64) {
    entries.iter().fold((i64::MAX, i64::MIN), |(lo, hi), e| {
        (lo.min(e.1), hi.max(e.1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(entries: Vec<Entry>, merged: bool) -> Run {
        let (min_t, max_t) = time_range(&entries);
        Run {
            at: RunRef {
                file: "f".into(),
                block: 0,
                count: entries.len() as u64,
                min_t,
                max_t,
                merged,
            },
            entries: Some(Arc::new(entries)),
        }
    }

    #[test]
    fn the_newest_entry_of_a_key_counts_and_whole_runs_expire() {
        let mut keys = Keys {
            runs: vec![
                run(vec![(1, 10), (2, 20)], true),
                run(vec![(2, 500)], false),
            ],
            ..Default::default()
        };
        keys.add(vec![(3, 600)]);
        assert_eq!(keys.get(1), Some(10));
        assert_eq!(keys.get(2), Some(500), "the newer run's entry");
        assert_eq!(keys.get(3), Some(600));
        assert_eq!(keys.get(4), None);
        keys.add(vec![(1, 700), (5, 1)]);
        assert_eq!(keys.get(1), Some(700), "fresh entries are the newest");
        assert_eq!(keys.fresh, vec![(1, 700), (3, 600), (5, 1)]);
        // At horizon 100 with a bound of 50, the first run (max 20) is past; the second not.
        keys.expire(100, 50);
        assert_eq!(keys.runs.len(), 1);
        assert_eq!(keys.get(2), Some(500));
    }

    #[test]
    fn young_runs_merge_into_a_segment_by_span_or_count() {
        let within = 8_000;
        let mut keys = Keys::default();
        for i in 0..3 {
            keys.runs.push(run(vec![(i, i as i64 * 100)], false));
        }
        keys.fresh = vec![(9, 300)];
        assert_eq!(keys.merge_plan(within), None, "300 µs < an eighth of 8 ms");
        keys.fresh = vec![(9, 1_000)];
        assert_eq!(keys.merge_plan(within), Some(0..3));
        let merged = keys.merged(0..3).unwrap();
        assert_eq!(merged, vec![(0, 0), (1, 100), (2, 200), (9, 1_000)]);
        // A segment is never merged again; young ones after it are, by count.
        keys.runs = vec![run(vec![(0, 0)], true)];
        for i in 1..MAX_YOUNG as u128 {
            keys.runs.push(run(vec![(i, 1)], false));
        }
        keys.fresh = vec![(99, 1)];
        assert_eq!(keys.merge_plan(within), Some(1..MAX_YOUNG));
    }

    #[test]
    fn keys_hash_by_value_and_type() {
        let mut s = Vec::new();
        let a = hash_key([CellRef::Str("ab"), CellRef::Str("c")].into_iter(), &mut s);
        let b = hash_key([CellRef::Str("a"), CellRef::Str("bc")].into_iter(), &mut s);
        let c = hash_key([CellRef::Int(1)].into_iter(), &mut s);
        let d = hash_key([CellRef::Dec(1)].into_iter(), &mut s);
        assert_ne!(a, b, "lengths are part of the hash");
        assert_ne!(c, d, "types are part of the hash");
        let owned = [Cell::Str("ab".into()), Cell::Str("c".into())];
        assert_eq!(a, hash_key(owned.iter().map(Cell::borrowed), &mut s));
    }
}
