//! The key index of an upsert table: for each primary key (a 128-bit hash), where its live row
//! is (data file, position) and which Kafka record wrote it.
//!
//! It is stored as **runs**: immutable objects under the table's `metadata/` directory, each
//! written by one commit and named by the snapshots that use it. A commit writes one run holding
//! what it changed (keys given a new live row, keys whose row was deleted); now and then — when
//! the runs would number more than [`MAX_RUNS`], or the changes since the base would outweigh
//! it — it writes the whole index as a new base instead, so that a round costs what the round
//! changed (amortized: every entry is rewritten a bounded number of times), never the whole
//! index. The snapshot's summary names the newest run (`streamtable.key-index`) and all of them,
//! oldest first, with their entry counts (`streamtable.key-index.runs`), so the index moves with
//! the snapshot in the one atomic pointer swap: a run a lost or crashed commit wrote is an
//! orphan no snapshot names. A warm process keeps the index it committed last and uses it again
//! when the table's snapshot still names that run (runs never change, so the copy is exact).
//!
//! Each run lists the data files the index covers as of that run; the commit reconciles it with
//! the snapshot it builds on (files a compaction or anyone else removed or added), so it is never
//! trusted beyond what it saw. An entry of an older run naming a file the newest run does not
//! list is a removal.
//!
//! A key a tombstone deleted keeps an entry without a row (its file [`GONE`]) holding the
//! tombstone's Kafka position, so that an older record of the key landing later (a replay) is
//! still seen as older.
//!
//! How runs are stored: [`super::run`].

use std::collections::{HashMap, HashSet};

use crate::error::Result;

pub use super::run::{GONE, MAX_RUNS, Run, RunRef, named_runs};

/// Where a key's live row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Index into the file table.
    pub file: u32,
    /// Position of the row in the file.
    pub pos: u64,
    /// `kafka_partition` of the record that wrote it.
    pub partition: i32,
    /// `kafka_offset` of that record.
    pub offset: i64,
    /// `kafka_timestamp` of that record (µs).
    pub timestamp: i64,
}

/// The index: files covered and key → location.
#[derive(Debug, Clone, Default)]
pub struct KeyIndex {
    /// How the keys were hashed (hash, encoding, the key's field ids): an index of another
    /// definition is never used (the key changed, or the encoding did with a release).
    definition: String,
    files: Vec<String>,
    file_ids: HashMap<String, u32>,
    entries: HashMap<u128, Location>,
    /// Keys given a row or removed since the index was read or last written.
    changed: HashSet<u128>,
    /// The stored runs it is made of, oldest first (none: not stored yet).
    runs: Vec<RunRef>,
}

impl KeyIndex {
    /// An empty index of keys hashed as `definition` says.
    pub fn new(definition: &str) -> KeyIndex {
        KeyIndex {
            definition: definition.to_string(),
            ..KeyIndex::default()
        }
    }

    /// The index stored as `runs` (oldest first, each with the name the summary gives it); the
    /// newest run's file list is the files covered. An error says why it cannot be used (then
    /// the commit rebuilds it from the table's files).
    pub fn from_runs(
        definition: &str,
        runs: Vec<(RunRef, Run)>,
    ) -> std::result::Result<KeyIndex, String> {
        let mut index = KeyIndex::new(definition);
        let Some((_, newest)) = runs.last() else {
            return Ok(index);
        };
        for f in &newest.files {
            index.file_id(f);
        }
        for (n, (at, run)) in runs.iter().enumerate() {
            if run.base != (n == 0) {
                return Err(format!(
                    "run {} is {} but is named {} of {}",
                    at.name,
                    if run.base {
                        "a base"
                    } else {
                        "a run of changes"
                    },
                    if n == 0 { "first" } else { "after another" },
                    runs.len()
                ));
            }
            if run.definition != definition {
                return Err(format!(
                    "run {} was made for another key ({})",
                    at.name, run.definition
                ));
            }
        }
        let mut refs = Vec::with_capacity(runs.len());
        for (mut at, run) in runs {
            let decoded = run.entries.len();
            // The run's file ids, in the index's numbering (None: a file no longer covered).
            let ids: Vec<Option<u32>> = run
                .files
                .iter()
                .map(|p| index.file_ids.get(p).copied())
                .collect();
            for (key, l) in run.entries {
                let file = |l: &Location| {
                    if l.file == GONE {
                        Some(GONE)
                    } else {
                        ids.get(l.file as usize).copied()?
                    }
                };
                match l.and_then(|l| Some((file(&l)?, l))) {
                    Some((file, l)) => {
                        index.entries.insert(key, Location { file, ..l });
                    }
                    None => {
                        index.entries.remove(&key);
                    }
                }
            }
            at.entries = run_len(at.entries, decoded);
            refs.push(at);
        }
        index.runs = refs;
        Ok(index)
    }

    /// How its keys were hashed.
    pub fn definition(&self) -> &str {
        &self.definition
    }

    /// The data files the index has read.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(String::as_str)
    }

    /// The number of keys with a live row.
    pub fn len(&self) -> usize {
        self.entries.values().filter(|l| l.file != GONE).count()
    }

    /// Whether no key has a live row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records that a tombstone at `at` (its file ignored) deleted `key`: no live row, the
    /// tombstone's Kafka position kept.
    pub fn delete(&mut self, key: u128, at: Location) {
        self.insert(
            key,
            Location {
                file: GONE,
                pos: 0,
                ..at
            },
        );
    }

    /// The stored runs it is made of, oldest first.
    pub fn runs(&self) -> &[RunRef] {
        &self.runs
    }

    /// Entries it holds: the keys with a live row and the keys a tombstone deleted (kept with
    /// the tombstone's Kafka position); what its memory and its bases grow with.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Keys changed since it was read or last written.
    pub fn changed(&self) -> usize {
        self.changed.len()
    }

    /// The file table's path of `id`.
    pub fn path(&self, id: u32) -> Option<&str> {
        self.files.get(id as usize).map(String::as_str)
    }

    /// The id of `path` in the file table, added if new.
    pub fn file_id(&mut self, path: &str) -> u32 {
        if let Some(id) = self.file_ids.get(path) {
            return *id;
        }
        let id = self.files.len() as u32;
        self.files.push(path.to_string());
        self.file_ids.insert(path.to_string(), id);
        id
    }

    /// The live row of `key`.
    pub fn get(&self, key: u128) -> Option<Location> {
        self.entries.get(&key).copied()
    }

    /// Sets the live row of `key`.
    pub fn insert(&mut self, key: u128, at: Location) {
        self.entries.insert(key, at);
        self.changed.insert(key);
    }

    /// Forgets `key` (its row was deleted).
    pub fn remove(&mut self, key: u128) -> Option<Location> {
        let was = self.entries.remove(&key);
        if was.is_some() {
            self.changed.insert(key);
        }
        was
    }

    /// Forgets the files in `removed` and the keys whose row was in one of them (the stored
    /// runs need no entry for them: a run's entry naming a file the newest run does not list
    /// is read as a removal).
    pub fn remove_files(&mut self, removed: &HashSet<String>) {
        if removed.is_empty() {
            return;
        }
        let gone: HashSet<u32> = removed
            .iter()
            .filter_map(|p| self.file_ids.get(p).copied())
            .collect();
        self.entries.retain(|_, l| !gone.contains(&l.file));
        // Renumber the file table without the removed files.
        let old = std::mem::take(&mut self.files);
        self.file_ids.clear();
        let mut map = vec![u32::MAX; old.len()];
        for (i, p) in old.into_iter().enumerate() {
            if !removed.contains(&p) {
                map[i] = self.file_id(&p);
            }
        }
        for l in self.entries.values_mut().filter(|l| l.file != GONE) {
            l.file = map.get(l.file as usize).copied().unwrap_or(GONE);
        }
    }

    /// Whether the next write is a whole base rather than a run of the changes: when there is
    /// no stored run yet, when one more would pass [`MAX_RUNS`], or when the changes since the
    /// base would outweigh it.
    pub fn next_is_base(&self) -> bool {
        let Some((base, deltas)) = self.runs.split_first() else {
            return true;
        };
        let since = deltas.iter().fold(self.changed.len() as u64, |n, r| {
            n.saturating_add(r.entries)
        });
        self.runs.len() + 1 > MAX_RUNS || since > base.entries
    }

    /// The next run as stored, and its entry count: the whole index when `base`, else the
    /// changed keys (a deleted key as a removal).
    pub fn encode_run(&self, base: bool) -> Result<(Vec<u8>, u64)> {
        let mut keys: Vec<(u128, Option<&Location>)> = if base {
            self.entries.iter().map(|(k, l)| (*k, Some(l))).collect()
        } else {
            self.changed
                .iter()
                .map(|k| (*k, self.entries.get(k)))
                .collect()
        };
        keys.sort_unstable_by_key(|(k, _)| *k);
        let bytes = super::run::encode(base, &self.definition, &self.files, &keys)?;
        Ok((bytes, keys.len() as u64))
    }

    /// The runs the snapshot names once `written` (the run [`KeyIndex::encode_run`] made, a
    /// base or not) is committed.
    pub fn runs_after(&self, written: RunRef, base: bool) -> Vec<RunRef> {
        let mut runs = if base { Vec::new() } else { self.runs.clone() };
        runs.push(written);
        runs
    }

    /// Records that the snapshot naming `runs` is committed: the index is now what they hold.
    pub fn committed(&mut self, runs: Vec<RunRef>) {
        self.runs = runs;
        self.changed.clear();
    }
}

/// A run's entry count: the summary's, or the decoded one when the summary did not say.
fn run_len(named: u64, decoded: usize) -> u64 {
    if named == 0 { decoded as u64 } else { named }
}

#[cfg(test)]
mod tests {
    use super::super::run::WHOLE;
    use super::*;

    fn at(file: u32, pos: u64) -> Location {
        Location {
            file,
            pos,
            partition: 1,
            offset: pos as i64,
            timestamp: 7,
        }
    }

    fn stored(i: &KeyIndex, name: &str, base: bool) -> (RunRef, Run) {
        let (bytes, entries) = i.encode_run(base).unwrap();
        let run = Run::decode(&bytes, name).unwrap();
        assert_eq!(run.len() as u64, entries);
        (
            RunRef {
                name: name.to_string(),
                entries,
            },
            run,
        )
    }

    fn same(a: &KeyIndex, b: &KeyIndex) {
        assert_eq!(a.len(), b.len());
        for (k, l) in &a.entries {
            let m = b.get(*k).unwrap_or_else(|| panic!("key {k} missing"));
            assert_eq!(a.path(l.file), b.path(m.file), "key {k}");
            assert_eq!((l.pos, l.offset), (m.pos, m.offset), "key {k}");
        }
    }

    #[test]
    fn an_index_reads_back_as_written() {
        let mut i = KeyIndex::new("xxh3-128/test");
        let a = i.file_id("s3://w/t/data/a.parquet");
        let b = i.file_id("s3://w/t/data/b.parquet");
        i.insert(1, at(a, 0));
        i.insert(u128::MAX, at(b, 5));
        let back = KeyIndex::from_runs("xxh3-128/test", vec![stored(&i, "r1", true)]).unwrap();
        assert_eq!(
            back.files().collect::<Vec<_>>(),
            i.files().collect::<Vec<_>>()
        );
        assert_eq!(back.get(1), Some(at(a, 0)));
        assert_eq!(back.get(u128::MAX), Some(at(b, 5)));
        assert_eq!(back.len(), 2);
        assert_eq!(back.definition(), "xxh3-128/test");
        assert_eq!(back.changed(), 0);
        assert!(KeyIndex::from_runs("another key", vec![stored(&i, "r1", true)]).is_err());
    }

    #[test]
    fn runs_of_changes_read_back_as_the_whole_index() {
        let mut i = KeyIndex::new("d");
        let a = i.file_id("a");
        for k in 0..100u128 {
            i.insert(k, at(a, k as u64));
        }
        let base = stored(&i, "base", true);
        i.committed(i.runs_after(base.0.clone(), true));
        assert_eq!(i.changed(), 0);
        // A round: some keys move to b, one is deleted.
        let b = i.file_id("b");
        for k in 0..10u128 {
            i.insert(k, at(b, k as u64));
        }
        i.remove(50);
        assert_eq!(i.changed(), 11);
        assert!(!i.next_is_base());
        let delta = stored(&i, "d1", false);
        assert_eq!(delta.0.entries, 11);
        i.committed(i.runs_after(delta.0.clone(), false));
        // Compaction removed a; c holds its live rows now (indexed as unseen).
        i.remove_files(&HashSet::from(["a".to_string()]));
        let c = i.file_id("c");
        for k in 10..50u128 {
            i.insert(k, at(c, k as u64));
        }
        let d2 = stored(&i, "d2", false);
        i.committed(i.runs_after(d2.0.clone(), false));
        assert_eq!(
            i.runs().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["base", "d1", "d2"]
        );
        let back = KeyIndex::from_runs("d", vec![base, delta, d2]).unwrap();
        same(&i, &back);
        // Keys 51..100 were in a, which the newest run does not list: gone.
        assert_eq!(back.len(), 50);
        assert_eq!(back.get(50), None);
        assert_eq!(back.get(70), None);
        assert_eq!(back.path(back.get(3).unwrap().file), Some("b"));
        assert_eq!(back.path(back.get(30).unwrap().file), Some("c"));
    }

    #[test]
    fn a_base_is_written_when_runs_would_pile_up_or_outweigh_it() {
        let mut i = KeyIndex::new("d");
        assert!(i.next_is_base(), "nothing stored yet");
        let a = i.file_id("a");
        for k in 0..100u128 {
            i.insert(k, at(a, 0));
        }
        let (_, n) = i.encode_run(true).unwrap();
        i.committed(i.runs_after(
            RunRef {
                name: "b".into(),
                entries: n,
            },
            true,
        ));
        for round in 1..MAX_RUNS {
            i.insert(round as u128, at(a, 1));
            assert!(!i.next_is_base(), "round {round}");
            let (_, n) = i.encode_run(false).unwrap();
            i.committed(i.runs_after(
                RunRef {
                    name: format!("d{round}"),
                    entries: n,
                },
                false,
            ));
        }
        i.insert(1, at(a, 2));
        assert!(i.next_is_base(), "{} runs", i.runs().len());
        // Changes outweighing the base.
        let mut j = KeyIndex::new("d");
        let a = j.file_id("a");
        j.insert(1, at(a, 0));
        j.committed(vec![RunRef {
            name: "b".into(),
            entries: 1,
        }]);
        j.insert(2, at(0, 1));
        assert!(!j.next_is_base());
        j.insert(3, at(0, 2));
        assert!(j.next_is_base());
    }

    #[test]
    fn an_earlier_release_whole_index_is_read_as_a_base() {
        let mut i = KeyIndex::new("d");
        let a = i.file_id("a");
        i.insert(4, at(a, 9));
        let (mut bytes, _) = i.encode_run(true).unwrap();
        bytes[4] = WHOLE;
        let run = Run::decode(&bytes, "old").unwrap();
        let back = KeyIndex::from_runs(
            "d",
            vec![(
                RunRef {
                    name: "old".into(),
                    entries: 0,
                },
                run,
            )],
        )
        .unwrap();
        assert_eq!(back.get(4), Some(at(a, 9)));
        assert_eq!(back.runs()[0].entries, 1, "the count is the decoded one");
    }

    #[test]
    fn the_summary_names_its_runs_or_only_the_newest() {
        let list = r#"[{"name":"a.key-index","entries":5},{"name":"b.key-index","entries":1}]"#;
        let (dir, runs) = named_runs("s3://w/t/metadata/b.key-index", Some(list)).unwrap();
        assert_eq!(dir, "s3://w/t/metadata");
        assert_eq!(runs.len(), 2);
        // A list whose newest run is not the one named (written by an earlier release, then
        // carried): the named one alone, as a base.
        let (_, runs) = named_runs("s3://w/t/metadata/c.key-index", Some(list)).unwrap();
        assert_eq!(
            runs,
            vec![RunRef {
                name: "c.key-index".into(),
                entries: 0
            }]
        );
        let (_, runs) = named_runs("s3://w/t/metadata/c.key-index", Some("not json")).unwrap();
        assert_eq!(runs.len(), 1);
        let hostile = r#"[{"name":"../../x","entries":5},{"name":"b.key-index","entries":1}]"#;
        assert!(named_runs("s3://w/t/metadata/b.key-index", Some(hostile)).is_none());
    }

    #[test]
    fn removing_a_file_drops_its_keys_and_renumbers_the_rest() {
        let mut i = KeyIndex::default();
        let a = i.file_id("a");
        let b = i.file_id("b");
        let c = i.file_id("c");
        i.insert(1, at(a, 0));
        i.insert(2, at(b, 1));
        i.insert(3, at(c, 2));
        i.remove_files(&HashSet::from(["b".to_string()]));
        assert_eq!(i.files().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(i.get(2), None);
        let l = i.get(3).unwrap();
        assert_eq!(i.path(l.file), Some("c"));
        assert_eq!(i.path(i.get(1).unwrap().file), Some("a"));
    }

    #[test]
    fn a_damaged_run_is_an_error_not_a_panic() {
        let mut i = KeyIndex::default();
        let a = i.file_id("a");
        i.insert(9, at(a, 3));
        i.insert(10, at(a, 4));
        i.committed(vec![RunRef {
            name: "b".into(),
            entries: 2,
        }]);
        i.remove(10);
        let good = i.encode_run(false).unwrap().0;
        assert!(Run::decode(&good, "t").is_ok());
        for cut in 0..good.len() {
            assert!(Run::decode(&good[..cut], "t").is_err());
        }
        let mut flipped = good.clone();
        flipped[4] = 9;
        assert!(Run::decode(&flipped, "t").unwrap_err().contains("layout 9"));
        // A removal is not a thing layout 1 had.
        let mut old = good.clone();
        old[4] = WHOLE;
        assert!(Run::decode(&old, "t").is_err());
        let mut huge = good.clone();
        huge[5..13].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Run::decode(&huge, "t").is_err());
        assert!(Run::decode(b"nonsense bytes here", "t").is_err());
    }

    #[test]
    fn a_run_of_changes_is_never_taken_for_the_whole_index() {
        let mut i = KeyIndex::new("d");
        let a = i.file_id("a");
        i.insert(1, at(a, 0));
        let base = stored(&i, "base", true);
        i.committed(i.runs_after(base.0.clone(), true));
        i.insert(2, at(a, 1));
        let delta = stored(&i, "d1", false);
        // Named alone (the list lost, say by an earlier release's replace): refused.
        let err = KeyIndex::from_runs("d", vec![delta.clone()]).unwrap_err();
        assert!(err.contains("a run of changes"), "{err}");
        // A base named after another: refused too.
        assert!(KeyIndex::from_runs("d", vec![base.clone(), base.clone()]).is_err());
        assert_eq!(
            KeyIndex::from_runs("d", vec![base, delta]).unwrap().len(),
            2
        );
    }

    #[test]
    fn a_deleted_key_keeps_its_position_through_the_runs() {
        let mut i = KeyIndex::new("d");
        let a = i.file_id("a");
        i.insert(1, at(a, 0));
        i.insert(2, at(a, 1));
        let base = stored(&i, "base", true);
        i.committed(i.runs_after(base.0.clone(), true));
        i.delete(1, at(a, 40));
        assert_eq!(i.len(), 1);
        let delta = stored(&i, "d1", false);
        let back = KeyIndex::from_runs("d", vec![base, delta]).unwrap();
        assert_eq!(back.len(), 1);
        let gone = back.get(1).expect("the deleted key's entry");
        assert_eq!((gone.file, gone.offset), (GONE, 40));
        // Removing files leaves it alone, and a base keeps it.
        let mut back = back;
        back.remove_files(&HashSet::from(["a".to_string()]));
        assert_eq!(back.get(1).map(|l| l.file), Some(GONE));
        assert_eq!(back.len(), 0);
        let again = stored(&back, "b2", true);
        let read = KeyIndex::from_runs("d", vec![again]).unwrap();
        assert_eq!(read.get(1).map(|l| (l.file, l.offset)), Some((GONE, 40)));
    }

    #[test]
    fn a_run_claiming_a_huge_body_is_refused_before_it_is_read() {
        let mut i = KeyIndex::new("d");
        let a = i.file_id("a");
        i.insert(1, at(a, 0));
        let (mut bytes, _) = i.encode_run(true).unwrap();
        bytes[5..13].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let err = Run::decode(&bytes, "t").unwrap_err();
        assert!(err.contains("beyond the limit"), "{err}");
        let many: Vec<RunRef> = (0..=MAX_RUNS)
            .map(|n| RunRef {
                name: format!("r{n}"),
                entries: 1,
            })
            .collect();
        let list = serde_json::to_string(&many).unwrap();
        let newest = format!("s3://w/t/metadata/r{MAX_RUNS}");
        assert!(
            named_runs(&newest, Some(&list)).is_none(),
            "more runs than a snapshot names"
        );
        let twice = r#"[{"name":"b","entries":1},{"name":"b","entries":1}]"#;
        assert!(named_runs("s3://w/t/metadata/b", Some(twice)).is_none());
    }
}
