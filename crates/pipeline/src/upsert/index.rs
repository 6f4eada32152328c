//! The key index of an upsert table: for each primary key (a 128-bit hash), where its live row
//! is (data file, position) and which Kafka record wrote it.
//!
//! It is one object per commit, content-named under the table's `metadata/` directory and named
//! by the snapshot's summary (`streamtable.key-index`), so it moves with the snapshot in the one
//! atomic pointer swap: an index a lost or crashed commit wrote is an orphan no snapshot names.
//! It also lists the data files it covers; the commit reconciles it with the snapshot it builds
//! on (files a compaction or anyone else removed or added), so it is never trusted beyond what
//! it saw.
//!
//! Layout: `STKI`, a version byte (1), the body's size (u64), then zstd of: the definition
//! (u32 length + UTF-8: the hash and the key's field ids), the file count (u32), each file's path
//! (u32 length + UTF-8), the entry count (u64), and the entries sorted by key (key u128, file
//! u32, position u64, partition i32, offset i64, timestamp i64; little endian: 48 bytes).

use std::collections::{HashMap, HashSet};

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"STKI";
const VERSION: u8 = 1;
const ENTRY_BYTES: usize = 16 + 4 + 8 + 4 + 8 + 8;
/// zstd level of the index (hashes do not compress: the level matters little).
const LEVEL: i32 = 1;

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
}

impl KeyIndex {
    /// An empty index of keys hashed as `definition` says.
    pub fn new(definition: &str) -> KeyIndex {
        KeyIndex {
            definition: definition.to_string(),
            ..KeyIndex::default()
        }
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
        self.entries.len()
    }

    /// Whether no key has a live row.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
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
    }

    /// Forgets `key` (its row was deleted).
    pub fn remove(&mut self, key: u128) -> Option<Location> {
        self.entries.remove(&key)
    }

    /// Forgets the files in `removed` and the keys whose row was in one of them.
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
        for l in self.entries.values_mut() {
            l.file = map[l.file as usize];
        }
    }

    /// The index as stored.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut body = Vec::with_capacity(16 + self.entries.len() * ENTRY_BYTES);
        body.extend_from_slice(&(self.definition.len() as u32).to_le_bytes());
        body.extend_from_slice(self.definition.as_bytes());
        body.extend_from_slice(&(self.files.len() as u32).to_le_bytes());
        for f in &self.files {
            body.extend_from_slice(&(f.len() as u32).to_le_bytes());
            body.extend_from_slice(f.as_bytes());
        }
        let mut keys: Vec<(&u128, &Location)> = self.entries.iter().collect();
        keys.sort_unstable_by_key(|(k, _)| **k);
        body.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for (k, l) in keys {
            body.extend_from_slice(&k.to_le_bytes());
            body.extend_from_slice(&l.file.to_le_bytes());
            body.extend_from_slice(&l.pos.to_le_bytes());
            body.extend_from_slice(&l.partition.to_le_bytes());
            body.extend_from_slice(&l.offset.to_le_bytes());
            body.extend_from_slice(&l.timestamp.to_le_bytes());
        }
        let mut out = Vec::with_capacity(body.len() / 2 + 8);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        let compressed = zstd::bulk::compress(&body, LEVEL)
            .map_err(|e| Error::Internal(format!("compress the key index: {e}")))?;
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&compressed);
        Ok(out)
    }

    /// Reads a stored index; `what` names it in errors. A damaged or unknown index is an
    /// error, never a panic (the commit then rebuilds the index from the table's files).
    pub fn decode(bytes: &[u8], what: &str) -> std::result::Result<KeyIndex, String> {
        let bad = |why: &str| format!("key index {what}: {why}");
        if bytes.len() < 13 || &bytes[..4] != MAGIC {
            return Err(bad("not a key index"));
        }
        if bytes[4] != VERSION {
            return Err(bad(&format!(
                "layout {} is unknown to this release",
                bytes[4]
            )));
        }
        let raw_len = u64::from_le_bytes(bytes[5..13].try_into().map_err(|_| bad("truncated"))?);
        // The entries and file names are bounded by what a table can hold: 2^32 keys at most.
        if raw_len > (ENTRY_BYTES as u64) << 32 {
            return Err(bad("declared size beyond the limit"));
        }
        // Streamed: memory follows the bytes really there, not the size the header claims.
        let mut body = Vec::new();
        {
            use std::io::Read;
            let decoder = zstd::stream::read::Decoder::new(&bytes[13..])
                .map_err(|e| bad(&format!("damaged: {e}")))?;
            decoder
                .take(raw_len.saturating_add(1))
                .read_to_end(&mut body)
                .map_err(|e| bad(&format!("damaged: {e}")))?;
        }
        if body.len() as u64 != raw_len {
            return Err(bad("its size does not match its header"));
        }
        let mut r = Reader { b: &body, at: 0 };
        let mut index = KeyIndex::default();
        let len = r.u32().ok_or_else(|| bad("truncated"))? as usize;
        let definition = r.take(len).ok_or_else(|| bad("truncated"))?;
        index.definition = std::str::from_utf8(definition)
            .map_err(|_| bad("its definition is not UTF-8"))?
            .to_string();
        let files = r.u32().ok_or_else(|| bad("truncated file table"))?;
        for _ in 0..files {
            let len = r.u32().ok_or_else(|| bad("truncated file table"))? as usize;
            let path = r.take(len).ok_or_else(|| bad("truncated file table"))?;
            let path = std::str::from_utf8(path).map_err(|_| bad("a file path is not UTF-8"))?;
            if index.file_ids.contains_key(path) {
                return Err(bad("a file is listed twice"));
            }
            index.file_id(path);
        }
        let n = r.u64().ok_or_else(|| bad("truncated"))?;
        if n.saturating_mul(ENTRY_BYTES as u64) != (body.len() - r.at) as u64 {
            return Err(bad("entry count does not match its size"));
        }
        index.entries.reserve(n as usize);
        for _ in 0..n {
            let e = r
                .take(ENTRY_BYTES)
                .ok_or_else(|| bad("truncated entries"))?;
            let key = u128::from_le_bytes(e[0..16].try_into().map_err(|_| bad("entry"))?);
            let l = Location {
                file: u32::from_le_bytes(e[16..20].try_into().map_err(|_| bad("entry"))?),
                pos: u64::from_le_bytes(e[20..28].try_into().map_err(|_| bad("entry"))?),
                partition: i32::from_le_bytes(e[28..32].try_into().map_err(|_| bad("entry"))?),
                offset: i64::from_le_bytes(e[32..40].try_into().map_err(|_| bad("entry"))?),
                timestamp: i64::from_le_bytes(e[40..48].try_into().map_err(|_| bad("entry"))?),
            };
            if l.file as usize >= index.files.len() {
                return Err(bad("an entry names a file the table does not list"));
            }
            index.entries.insert(key, l);
        }
        Ok(index)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn an_index_reads_back_as_written() {
        let mut i = KeyIndex::new("xxh3-128/test");
        let a = i.file_id("s3://w/t/data/a.parquet");
        let b = i.file_id("s3://w/t/data/b.parquet");
        i.insert(1, at(a, 0));
        i.insert(u128::MAX, at(b, 5));
        let back = KeyIndex::decode(&i.encode().unwrap(), "t").unwrap();
        assert_eq!(
            back.files().collect::<Vec<_>>(),
            i.files().collect::<Vec<_>>()
        );
        assert_eq!(back.get(1), Some(at(a, 0)));
        assert_eq!(back.get(u128::MAX), Some(at(b, 5)));
        assert_eq!(back.len(), 2);
        assert_eq!(back.definition(), "xxh3-128/test");
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
    fn a_damaged_index_is_an_error_not_a_panic() {
        let mut i = KeyIndex::default();
        let a = i.file_id("a");
        i.insert(9, at(a, 3));
        let good = i.encode().unwrap();
        for cut in 0..good.len() {
            assert!(KeyIndex::decode(&good[..cut], "t").is_err());
        }
        let mut flipped = good.clone();
        flipped[4] = 9;
        assert!(
            KeyIndex::decode(&flipped, "t")
                .unwrap_err()
                .contains("layout 9")
        );
        let mut huge = good.clone();
        huge[5..13].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(KeyIndex::decode(&huge, "t").is_err());
        assert!(KeyIndex::decode(b"nonsense bytes here", "t").is_err());
    }
}
