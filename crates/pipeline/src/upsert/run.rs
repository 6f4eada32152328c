//! The stored form of the key index ([`super::index`]): runs, immutable objects under the
//! table's `metadata/` directory, and how a snapshot's summary names them.
//!
//! Layout: `STKI`, a layout byte (4: a base, 5: a run of changes; 1: a whole index of an earlier
//! release, read as a base), the body's size (u64), then zstd of: the definition (u32 length,
//! UTF-8: the hash and the key's field ids), the file count (u32), each file's path (u32 length,
//! UTF-8), the entry count (u64), and the entries sorted by key (key u128, file u32, position
//! u64, partition i32, offset i64, timestamp i64; little endian: 48 bytes). A file of `u32::MAX`
//! (runs of changes only) marks a key forgotten; `u32::MAX - 1` a key deleted by a tombstone.
//! The first run a snapshot names must be a base and every later one a run of changes: a run of
//! changes alone is never taken for the whole index.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::index::Location;
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"STKI";
/// Layout of a base: the whole index (an earlier release refuses it and rebuilds the index).
/// Layout 2 was written by a development build for both kinds: it is refused, and the index
/// rebuilt.
const BASE: u8 = 4;
/// Layout of a run of changes.
const CHANGES: u8 = 5;
/// Layout of earlier releases: one object, the whole index (read as a base).
pub(super) const WHOLE: u8 = 1;
const ENTRY_BYTES: usize = 16 + 4 + 8 + 4 + 8 + 8;
/// An entry's file when the key was forgotten (runs of changes only).
const REMOVED: u32 = u32::MAX;
/// The file of a key a tombstone deleted: no row, the tombstone's Kafka position kept.
pub const GONE: u32 = u32::MAX - 1;
/// How much larger than its stored bytes a run's body may claim to be (keys do not compress;
/// file paths do, a little): a bound on what a damaged or hostile run makes the reader hold.
const MAX_EXPANSION: u64 = 64;
/// zstd level of the index (hashes do not compress: the level matters little).
const LEVEL: i32 = 1;
/// Runs a snapshot names at most: the next commit writes a base when one more would pass it.
pub const MAX_RUNS: usize = 8;

/// A run as the snapshot's summary names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRef {
    /// The object's name in the table's `metadata/` directory.
    pub name: String,
    /// Entries it holds.
    pub entries: u64,
}

/// The runs a snapshot summary names, oldest first, from its two properties: `newest` (the path
/// of the newest run) and `runs` (JSON: every run's name and entry count). A summary without a
/// readable list (an earlier release's, or a list whose newest run is not `newest`) names one
/// run, `newest`, read as a base. `None` when a listed name is not a plain file name.
pub fn named_runs(newest: &str, runs: Option<&str>) -> Option<(String, Vec<RunRef>)> {
    let (dir, name) = newest.rsplit_once('/')?;
    let single = || {
        vec![RunRef {
            name: name.to_string(),
            entries: 0,
        }]
    };
    let list = match runs.and_then(|r| serde_json::from_str::<Vec<RunRef>>(r).ok()) {
        Some(list) if list.last().is_some_and(|r| r.name == name) => list,
        _ => single(),
    };
    let distinct: HashSet<&str> = list.iter().map(|r| r.name.as_str()).collect();
    if list.len() > MAX_RUNS
        || distinct.len() != list.len()
        || list
            .iter()
            .any(|r| r.name.is_empty() || r.name.contains('/') || r.name.contains(".."))
    {
        return None;
    }
    Some((dir.to_string(), list))
}

/// One stored run, decoded: its definition, the files it lists, and its entries (`None`: the
/// key's row was deleted); a location's `file` indexes the run's own file list.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Whether it is a whole index (else a run of changes).
    pub(super) base: bool,
    pub(super) definition: String,
    pub(super) files: Vec<String>,
    pub(super) entries: Vec<(u128, Option<Location>)>,
}

impl Run {
    /// How its keys were hashed.
    pub fn definition(&self) -> &str {
        &self.definition
    }

    /// Entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A run as stored: a base (`base`: every key of the index) or a run of changes, of keys
/// hashed as `definition`, listing `files` (the files the index covers), with `keys` sorted by
/// key (`None`: the key is forgotten; a location's `file` indexes `files`).
pub(super) fn encode(
    base: bool,
    definition: &str,
    files: &[String],
    keys: &[(u128, Option<&Location>)],
) -> Result<Vec<u8>> {
    let mut body = Vec::with_capacity(16 + keys.len() * ENTRY_BYTES);
    body.extend_from_slice(&(definition.len() as u32).to_le_bytes());
    body.extend_from_slice(definition.as_bytes());
    body.extend_from_slice(&(files.len() as u32).to_le_bytes());
    for f in files {
        body.extend_from_slice(&(f.len() as u32).to_le_bytes());
        body.extend_from_slice(f.as_bytes());
    }
    body.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    let removed = Location {
        file: REMOVED,
        pos: 0,
        partition: 0,
        offset: 0,
        timestamp: 0,
    };
    for (k, l) in keys {
        let l = l.copied().unwrap_or(removed);
        body.extend_from_slice(&k.to_le_bytes());
        body.extend_from_slice(&l.file.to_le_bytes());
        body.extend_from_slice(&l.pos.to_le_bytes());
        body.extend_from_slice(&l.partition.to_le_bytes());
        body.extend_from_slice(&l.offset.to_le_bytes());
        body.extend_from_slice(&l.timestamp.to_le_bytes());
    }
    let mut out = Vec::with_capacity(body.len() / 2 + 8);
    out.extend_from_slice(MAGIC);
    out.push(if base { BASE } else { CHANGES });
    let compressed = zstd::bulk::compress(&body, LEVEL)
        .map_err(|e| Error::Internal(format!("compress the key index: {e}")))?;
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&compressed);
    Ok(out)
}

impl Run {
    /// Reads a stored run; `what` names it in errors. A damaged or unknown run is an error,
    /// never a panic (the commit then rebuilds the index from the table's files).
    pub fn decode(bytes: &[u8], what: &str) -> std::result::Result<Run, String> {
        let bad = |why: &str| format!("key index {what}: {why}");
        if bytes.len() < 13 || &bytes[..4] != MAGIC {
            return Err(bad("not a key index"));
        }
        let version = bytes[4];
        if ![WHOLE, BASE, CHANGES].contains(&version) {
            return Err(bad(&format!("layout {version} is unknown to this release")));
        }
        let raw_len = u64::from_le_bytes(bytes[5..13].try_into().map_err(|_| bad("truncated"))?);
        // The entries and file names are bounded by what a table can hold (2^32 keys at most)
        // and by what its stored bytes can expand to.
        let stored = (bytes.len() - 13) as u64;
        if raw_len > (ENTRY_BYTES as u64) << 32
            || raw_len > stored.saturating_mul(MAX_EXPANSION).saturating_add(1 << 20)
        {
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
        let mut run = Run {
            base: version != CHANGES,
            ..Run::default()
        };
        let len = r.u32().ok_or_else(|| bad("truncated"))? as usize;
        let definition = r.take(len).ok_or_else(|| bad("truncated"))?;
        run.definition = std::str::from_utf8(definition)
            .map_err(|_| bad("its definition is not UTF-8"))?
            .to_string();
        let files = r.u32().ok_or_else(|| bad("truncated file table"))?;
        let mut seen = HashSet::new();
        for _ in 0..files {
            let len = r.u32().ok_or_else(|| bad("truncated file table"))? as usize;
            let path = r.take(len).ok_or_else(|| bad("truncated file table"))?;
            let path = std::str::from_utf8(path).map_err(|_| bad("a file path is not UTF-8"))?;
            if !seen.insert(path) {
                return Err(bad("a file is listed twice"));
            }
            run.files.push(path.to_string());
        }
        let n = r.u64().ok_or_else(|| bad("truncated"))?;
        if n.saturating_mul(ENTRY_BYTES as u64) != (body.len() - r.at) as u64 {
            return Err(bad("entry count does not match its size"));
        }
        run.entries.reserve(n as usize);
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
            if l.file == REMOVED && version == CHANGES {
                run.entries.push((key, None));
                continue;
            }
            if l.file == GONE && version != WHOLE {
                run.entries.push((key, Some(l)));
                continue;
            }
            if l.file as usize >= run.files.len() {
                return Err(bad("an entry names a file the table does not list"));
            }
            run.entries.push((key, Some(l)));
        }
        Ok(run)
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
