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
//! Merging is two-level: the young runs (one per batch) are merged into one segment once the
//! watermark moved an eighth of the bound since the oldest of them was written, or once they
//! number [`MAX_YOUNG`]; segments are not merged again, they expire whole — so an entry is
//! written twice, and a partition has about a dozen runs. Past [`MAX_RUNS`] (segments that
//! stray records keep alive) everything is merged into one, the expired entries left out.
//!
//! A run expires when the newest of its entries does — or, for an entry that moved a key's first
//! occurrence *earlier* (a record more than the bound before the first), when the entry it hides
//! would have: otherwise the older entry would be found again once the run that hides it went.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::value::{Value, ValueRef};

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
    /// The dedup's horizon (watermark) when the run was written, µs: young runs are merged by
    /// how far it moved since.
    pub horizon: i64,
}

/// A stored run and its entries (`None` until loaded).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Where it is.
    pub at: RunRef,
    /// Its entries, sorted by hash; shared with the container's cache.
    pub entries: Option<Arc<Vec<Entry>>>,
    /// A filter over its hashes, built the first time the run is looked in (never stored).
    pub filter: LazyFilter,
}

/// A run's [`Filter`], built on first use; a run's entries never change, so neither does it.
/// Clones share it (the container's run cache keeps it with the entries).
#[derive(Debug, Clone, Default)]
pub struct LazyFilter(Arc<std::sync::OnceLock<Filter>>);

impl PartialEq for LazyFilter {
    /// Derived from the entries: equal runs have equal filters.
    fn eq(&self, _: &LazyFilter) -> bool {
        true
    }
}

/// A blocked Bloom filter over a run's hashes: 512-bit blocks (a cache line each), the block
/// chosen by the hash's top bits (so a batch's sorted hashes visit the blocks in order), 4 bits
/// in it from the low bits; 12–24 bits per entry (the block count is a power of two), under
/// 0.75% false positives. xxh3-128's bits are uniform, so no hashing again.
pub struct Filter {
    blocks: Vec<Block>,
    /// log2 of the number of blocks.
    bits: u32,
    /// Entries it was built from.
    entries: usize,
}

#[derive(Clone, Copy)]
#[repr(align(64))]
struct Block([u64; 8]);

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Filter({} entries, {} blocks)",
            self.entries,
            self.blocks.len()
        )
    }
}

impl Filter {
    /// Bits per entry.
    const DENSITY: usize = 12;

    /// The filter of `entries`.
    pub fn new(entries: &[Entry]) -> Filter {
        let blocks = (entries.len().saturating_mul(Self::DENSITY))
            .div_ceil(512)
            .max(1)
            .next_power_of_two();
        let mut f = Filter {
            blocks: vec![Block([0; 8]); blocks],
            bits: blocks.trailing_zeros(),
            entries: entries.len(),
        };
        for &(h, _) in entries {
            let b = f.block(h);
            let block = &mut f.blocks[b].0;
            for bit in Self::positions(h) {
                block[bit >> 6] |= 1 << (bit & 63);
            }
        }
        f
    }

    fn block(&self, h: u128) -> usize {
        if self.bits == 0 {
            0
        } else {
            (h >> (128 - self.bits)) as usize
        }
    }

    fn positions(h: u128) -> [usize; 4] {
        let low = h as u64;
        [0, 9, 18, 27].map(|s| ((low >> s) & 511) as usize)
    }

    /// False only when `h` is certainly not among the entries.
    pub fn may_contain(&self, h: u128) -> bool {
        let block = &self.blocks[self.block(h)].0;
        Self::positions(h)
            .iter()
            .all(|&bit| block[bit >> 6] & (1 << (bit & 63)) != 0)
    }
}

impl Run {
    /// The run's filter (`None` until its entries are loaded).
    fn filter(&self) -> Option<&Filter> {
        let entries = self.entries.as_ref()?;
        let filter = self.filter.0.get_or_init(|| Filter::new(entries));
        debug_assert_eq!(
            filter.entries,
            entries.len(),
            "a run's entries never change"
        );
        Some(filter)
    }
}

/// One dedup's keys in one partition.
#[derive(Debug, Clone, PartialEq)]
pub struct Keys {
    /// Stored runs, oldest first. A key's newest entry is the one that counts.
    pub runs: Vec<Run>,
    /// Keys this batch added or changed, sorted by hash, not stored yet.
    pub fresh: Vec<Entry>,
    /// `fresh` holds the keys of a state of an earlier layout: stored as a segment.
    pub migrated: bool,
    /// The latest time among the entries the fresh ones hide: the run they are stored in lives
    /// at least as long (see the module's text).
    pub hides_until: Option<i64>,
    /// The horizon the last batch expired runs by, µs (`i64::MIN` before any).
    pub horizon: i64,
}

impl Default for Keys {
    fn default() -> Keys {
        Keys {
            runs: Vec::new(),
            fresh: Vec::new(),
            migrated: false,
            hides_until: None,
            horizon: i64::MIN,
        }
    }
}

/// The hash a key is remembered by.
pub fn hash_key<'a>(cells: impl Iterator<Item = ValueRef<'a>>, scratch: &mut Vec<u8>) -> u128 {
    scratch.clear();
    for c in cells {
        match c {
            ValueRef::Null => scratch.push(0),
            ValueRef::Bool(b) => scratch.extend([1, u8::from(b)]),
            ValueRef::Int(v) => {
                scratch.push(2);
                scratch.extend(v.to_le_bytes());
            }
            ValueRef::Float(bits) => {
                scratch.push(3);
                scratch.extend(bits.to_le_bytes());
            }
            ValueRef::Str(s) => {
                scratch.push(4);
                scratch.extend((s.len() as u64).to_le_bytes());
                scratch.extend(s.as_bytes());
            }
            ValueRef::Dec(v) => {
                scratch.push(5);
                scratch.extend(v.to_le_bytes());
            }
        }
    }
    xxhash_rust::xxh3::xxh3_128(scratch)
}

impl Keys {
    /// Keys of an earlier layout (owned cells), to be stored as a segment by the next write.
    pub fn migrate(seen: &[(Vec<Value>, i64)]) -> Keys {
        let mut scratch = Vec::new();
        let mut fresh: Vec<Entry> = seen
            .iter()
            .map(|(k, t)| (hash_key(k.iter().map(Value::borrowed), &mut scratch), *t))
            .collect();
        fresh.sort_unstable_by_key(|e| e.0);
        fresh.dedup_by_key(|e| e.0);
        Keys {
            migrated: !fresh.is_empty(),
            fresh,
            ..Keys::default()
        }
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.fresh.is_empty()
    }

    /// Entries stored and fresh (a key written twice counts twice).
    pub fn len(&self) -> u64 {
        self.runs
            .iter()
            .fold(self.fresh.len() as u64, |n, r| n.saturating_add(r.at.count))
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

    /// The first event time remembered for each of `hashes` (sorted, distinct), as [`Keys::get`]
    /// gives it one by one: each run is walked once, forward, galloping from where the last
    /// hash was — a batch's m keys cost about m·log(n/m) steps per run of n entries, in the
    /// run's order (what caches and prefetchers serve), instead of m binary searches over it.
    pub fn get_sorted(&self, hashes: &[u128]) -> Vec<Option<i64>> {
        debug_assert!(hashes.windows(2).all(|w| w[0] < w[1]), "sorted, distinct");
        let mut out = vec![None; hashes.len()];
        // Oldest first, the fresh entries last: a newer entry overwrites an older one. A run's
        // filter turns away most hashes (a batch's keys are mostly new) before the walk.
        for r in &self.runs {
            if let (Some(entries), Some(filter)) = (r.entries.as_deref(), r.filter()) {
                walk(
                    entries,
                    hashes,
                    |h| filter.may_contain(h),
                    |i, t| out[i] = Some(t),
                );
            }
        }
        walk(&self.fresh, hashes, |_| true, |i, t| out[i] = Some(t));
        out
    }

    /// Records that a fresh entry hides an older one first seen at `time`.
    pub fn hides(&mut self, time: i64) {
        self.hides_until = Some(self.hides_until.map_or(time, |t| t.max(time)));
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
        self.horizon = self.horizon.max(horizon);
        self.runs
            .retain(|r| r.at.max_t.saturating_add_unsigned(within_us) >= horizon);
    }

    /// The runs a write merges into one segment with the fresh entries (indices into `runs`,
    /// consecutive), or `None` to store the fresh entries as a run of their own: the young runs
    /// once the horizon moved an eighth of the bound (`within_us`) since the oldest of them was
    /// written, or once they number [`MAX_YOUNG`]; every run once they number [`MAX_RUNS`].
    pub fn merge_plan(&self, within_us: u64) -> Option<std::ops::Range<usize>> {
        if self.runs.len() + 1 > MAX_RUNS {
            return Some(0..self.runs.len());
        }
        let young = self.runs.iter().rev().take_while(|r| !r.at.merged).count();
        if young == 0 {
            return None;
        }
        let from = self.runs.len() - young;
        let oldest = self.runs[from].at.horizon;
        let slice = (within_us / 8).max(1);
        let moved = if self.horizon > oldest {
            self.horizon.abs_diff(oldest)
        } else {
            0
        };
        if young + 1 >= MAX_YOUNG || moved >= slice {
            Some(from..self.runs.len())
        } else {
            None
        }
    }

    /// The entries of `runs[range]` and the fresh ones, a key's newest entry kept, with the
    /// time the merged run lives until; `None` when a run is not loaded. A merge of the oldest
    /// runs leaves out the entries the bound passed (nothing older is left for them to hide).
    pub fn merged(
        &self,
        range: std::ops::Range<usize>,
        within_us: u64,
    ) -> Option<(Vec<Entry>, Option<i64>)> {
        let mut parts: Vec<&[Entry]> = Vec::with_capacity(range.len() + 1);
        let mut until = self.hides_until;
        for r in &self.runs[range.clone()] {
            parts.push(r.entries.as_ref()?.as_slice());
            until = Some(until.map_or(r.at.max_t, |u| u.max(r.at.max_t)));
        }
        parts.push(&self.fresh);
        let mut out = merge_newest(&parts);
        if range.start == 0 {
            let horizon = self.horizon;
            out.retain(|e| e.1.saturating_add_unsigned(within_us) >= horizon);
            until = None;
        }
        Some((out, until))
    }
}

/// Calls `found(i, time)` for each `hashes[i]` (sorted, distinct) that `entries` (sorted by
/// hash, distinct) holds: one forward pass, each hash that `maybe` lets through found by
/// galloping from the previous one.
fn walk(
    entries: &[Entry],
    hashes: &[u128],
    maybe: impl Fn(u128) -> bool,
    mut found: impl FnMut(usize, i64),
) {
    let mut lo = 0;
    for (i, &h) in hashes.iter().enumerate() {
        if !maybe(h) {
            continue;
        }
        let rest = &entries[lo..];
        if rest.is_empty() {
            return;
        }
        // Doubling `end` until rest[end] is not below h: the first entry ≥ h is in
        // (end / 2, end], or past the last doubling's start when the run ends first.
        let mut end = 1;
        while end < rest.len() && rest[end].0 < h {
            end = end.saturating_mul(2);
        }
        let start = end / 2;
        let stop = end.saturating_add(1).min(rest.len());
        let at = start + rest[start..stop].partition_point(|e| e.0 < h);
        if let Some(&(hash, t)) = rest.get(at)
            && hash == h
        {
            found(i, t);
        }
        lo += at;
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
                horizon: 0,
            },
            entries: Some(Arc::new(entries)),
            filter: LazyFilter::default(),
        }
    }

    #[test]
    fn a_filter_never_turns_away_an_entry_and_rarely_lets_others_through() {
        let mut rng = crate::generate::Rng::new(3);
        let mut hash = || (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
        for n in [0usize, 1, 7, 1_000, 40_000] {
            let entries: Vec<Entry> = (0..n).map(|_| (hash(), 0)).collect();
            let f = Filter::new(&entries);
            assert!(entries.iter().all(|e| f.may_contain(e.0)), "n = {n}");
            let others = 20_000;
            let through = (0..others).filter(|_| f.may_contain(hash())).count();
            if n >= 1_000 {
                assert!(
                    through < others / 25,
                    "n = {n}: {through} of {others} let through"
                );
            }
        }
        assert!(Filter::new(&[(0, 0), (u128::MAX, 0)]).may_contain(u128::MAX));
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
    fn young_runs_merge_into_a_segment_by_horizon_or_count() {
        let within = 8_000;
        let mut keys = Keys::default();
        for i in 0..3 {
            keys.runs.push(run(vec![(i, i as i64 * 100)], false));
        }
        keys.fresh = vec![(9, 300)];
        keys.horizon = 900;
        assert_eq!(keys.merge_plan(within), None, "900 µs < an eighth of 8 ms");
        keys.horizon = 1_000;
        assert_eq!(keys.merge_plan(within), Some(0..3));
        let (merged, until) = keys.merged(0..3, within).unwrap();
        assert_eq!(merged, vec![(0, 0), (1, 100), (2, 200), (9, 300)]);
        assert_eq!(until, None);
        // A segment is never merged again; young ones after it are, by count.
        keys.runs = vec![run(vec![(0, 0)], true)];
        for i in 1..MAX_YOUNG as u128 {
            keys.runs.push(run(vec![(i, 1)], false));
        }
        keys.fresh = vec![(99, 1)];
        keys.horizon = 0;
        assert_eq!(keys.merge_plan(within), Some(1..MAX_YOUNG));
        // Young runs after a segment keep their expired entries (they may hide older ones)
        // and the merged run lives as long as they did.
        let (merged, until) = keys.merged(1..3, within).unwrap();
        assert_eq!(merged.len(), 3);
        assert_eq!(until, Some(1));
    }

    #[test]
    fn a_merge_of_the_oldest_runs_leaves_out_what_the_bound_passed() {
        let within = 10;
        let mut keys = Keys {
            runs: vec![run(vec![(1, 0), (2, 50)], true), run(vec![(3, 60)], false)],
            fresh: vec![(4, 70)],
            ..Default::default()
        };
        keys.horizon = 45;
        let (merged, _) = keys.merged(0..2, within).unwrap();
        assert_eq!(
            merged,
            vec![(2, 50), (3, 60), (4, 70)],
            "key 1 (0 + 10 < 45) left out"
        );
        // Past MAX_RUNS everything is merged.
        keys.runs = (0..MAX_RUNS as u128)
            .map(|i| run(vec![(i, 100)], true))
            .collect();
        assert_eq!(keys.merge_plan(within), Some(0..MAX_RUNS));
    }

    #[test]
    fn a_run_that_hides_an_older_entry_lives_as_long_as_it_would_have() {
        // k first at 100 (a segment), then again at 50 — more than the bound before: the new
        // first occurrence is stored, and hides the one at 100 until that one would expire.
        let mut keys = Keys {
            runs: vec![run(vec![(7, 100)], true)],
            ..Default::default()
        };
        keys.add(vec![(7, 50)]);
        keys.hides(100);
        assert_eq!(keys.hides_until, Some(100));
        assert_eq!(keys.get(7), Some(50));
    }

    proptest::proptest! {
        /// The galloping walk finds what one binary search per key finds, newest entry first.
        #[test]
        fn sorted_lookups_find_what_single_lookups_find(
            runs in proptest::collection::vec(
                proptest::collection::btree_map(0u128..400, 0i64..1_000, 0..120), 0..6),
            fresh in proptest::collection::btree_map(0u128..400, 0i64..1_000, 0..40),
            probe in proptest::collection::btree_set(0u128..420, 0..200),
        ) {
            let keys = Keys {
                runs: runs.into_iter().map(|m| run(m.into_iter().collect(), false)).collect(),
                fresh: fresh.into_iter().collect(),
                ..Default::default()
            };
            let probe: Vec<u128> = probe.into_iter().collect();
            let one_by_one: Vec<Option<i64>> = probe.iter().map(|&h| keys.get(h)).collect();
            proptest::prop_assert_eq!(keys.get_sorted(&probe), one_by_one);
        }

        /// The same over hashes spread across the whole range (runs of many filter blocks),
        /// probing every stored hash and as many others.
        #[test]
        fn sorted_lookups_agree_over_filters_of_many_blocks(
            runs in proptest::collection::vec(
                proptest::collection::btree_map(proptest::num::u128::ANY, 0i64..1_000, 0..600), 1..5),
            others in proptest::collection::btree_set(proptest::num::u128::ANY, 0..600),
        ) {
            let mut probe: std::collections::BTreeSet<u128> = others;
            for m in &runs {
                probe.extend(m.keys().step_by(2));
            }
            let keys = Keys {
                runs: runs.into_iter().map(|m| run(m.into_iter().collect(), true)).collect(),
                ..Default::default()
            };
            let probe: Vec<u128> = probe.into_iter().collect();
            let one_by_one: Vec<Option<i64>> = probe.iter().map(|&h| keys.get(h)).collect();
            proptest::prop_assert_eq!(keys.get_sorted(&probe), one_by_one);
        }
    }

    #[test]
    fn keys_hash_by_value_and_type() {
        let mut s = Vec::new();
        let a = hash_key(
            [ValueRef::Str("ab"), ValueRef::Str("c")].into_iter(),
            &mut s,
        );
        let b = hash_key(
            [ValueRef::Str("a"), ValueRef::Str("bc")].into_iter(),
            &mut s,
        );
        let c = hash_key([ValueRef::Int(1)].into_iter(), &mut s);
        let d = hash_key([ValueRef::Dec(1)].into_iter(), &mut s);
        assert_ne!(a, b, "lengths are part of the hash");
        assert_ne!(c, d, "types are part of the hash");
        let owned = [Value::Str("ab".into()), Value::Str("c".into())];
        assert_eq!(a, hash_key(owned.iter().map(Value::borrowed), &mut s));
    }
}
