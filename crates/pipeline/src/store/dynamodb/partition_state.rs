//! The state of a partition's stateful derived tables, in buckets: one item holds the states of
//! [`STATE_BUCKET_PARTITIONS`] consecutive partitions of a topic (`state#{topic}#b{partition /
//! 16:06}`, sk `state`). Per partition, `q{p}` (the state's `seq`, which every write is
//! conditioned on) and `s{p}` (the rest, binary: see [`encode_entry`]); per directory of state
//! files, `d{id}` (the directory, once, so that an entry names its file by a 16-byte hash).
//! Written in the advance's transaction, one update per bucket touched.
//!
//! DynamoDB bills a transaction 2 units per kilobyte of each item it writes, so the layout is
//! about bytes: an entry is about 45 bytes, a bucket of 16 stays under 1 KB, and a batch of 64
//! stateful partitions writes 4 such items (8 units) where one item per partition cost 128.
//! Sections are kept in the item only up to [`MAX_INLINE_STATE_BYTES`]; others go to the
//! batch's state file (one PUT for all of a batch's partitions of a topic: cheaper than the
//! kilobytes 16 inline sections would add to every write of the item, except on a topic of
//! one partition without dedup, whose window section used to stay in its item).
//!
//! Before, each partition had an item of its own (`state#{topic}#{partition}`: `next`, `seq`,
//! `body` or `location`). It is read while the bucket has no entry for the partition; the
//! first write in the bucket replaces it, in the same transaction and conditioned on its
//! `seq`, with a marker of a newer layout, which a release before refuses ("deploy that
//! release"): an invocation of that release still in flight cannot advance from the old
//! state, nor start a partition's state afresh beside the bucket's.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use prost::encoding::{decode_varint, encode_varint};

use super::{DynamoStateStore, get_n, get_s, n, s};
use crate::checkpoint::{SourceAdvance, SourcePartition, StoredState};
use crate::error::{Error, Result};

/// Partitions per state bucket: 16 entries of ~45 bytes keep an item under 1 KB.
pub const STATE_BUCKET_PARTITIONS: i32 = 16;
/// The largest encoded section a bucket entry holds itself (a watermark and little else); a
/// larger one goes to the batch's state file, whatever the ingest option says: 16 entries of
/// this size still keep an item near 2 KB.
pub const MAX_INLINE_STATE_BYTES: usize = 64;

/// The body of the per-partition item once its state has moved to the bucket: a layout no
/// release before reads.
const MOVED_MARKER: &[u8] = br#"{"v": 100, "moved_to": "the state bucket of its partition"}"#;

/// Whether `body` is the moved marker.
fn is_marker(body: &[u8]) -> bool {
    zstd::bulk::decompress(body, MOVED_MARKER.len()).is_ok_and(|b| b == MOVED_MARKER)
}

/// The largest inline section an entry takes whatever the caller asks: 16 of them stay far
/// below DynamoDB's 400 KB item.
const MAX_ENTRY_BODY_BYTES: usize = 16 * 1024;

/// The key of the state bucket holding `source`.
pub(super) fn bucket_pk(source: &SourcePartition) -> String {
    format!(
        "state#{}#b{:06}",
        source.topic,
        source.partition.div_euclid(STATE_BUCKET_PARTITIONS)
    )
}

/// The per-partition item of the layout before.
fn legacy_pk(source: &SourcePartition) -> String {
    format!("state#{}#{}", source.topic, source.partition)
}

fn key(pk: String) -> HashMap<String, AttributeValue> {
    HashMap::from([("pk".to_string(), s(pk)), ("sk".to_string(), s("state"))])
}

/// The 32-bit id of a directory of state files (a hash of it).
fn dir_id(dir: &str) -> u32 {
    xxhash_rust::xxh3::xxh3_64(dir.as_bytes()) as u32
}

/// The attribute holding the directory of id `id`.
fn dir_attr(id: u32) -> String {
    format!("d{id:08x}")
}

/// An entry's kinds (the first byte).
const NONE: u8 = 0x10;
const BODY: u8 = 0x11;
const LOCATION: u8 = 0x12;
const HASHED: u8 = 0x13;

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// `location` as (directory, 16-byte hash) when it names a state file
/// `{dir}{32 lowercase hex digits}.run`.
fn split_location(location: &str) -> Option<(&str, [u8; 16])> {
    let stem = location.strip_suffix(".run")?;
    let at = stem.len().checked_sub(32)?;
    let (dir, hex) = (stem.get(..at)?, stem.get(at..)?);
    if !dir.ends_with('/') || !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let v = u128::from_str_radix(hex, 16).ok()?;
    Some((dir, v.to_be_bytes()))
}

/// A state's entry (all but `seq`): its kind, then `next_offset` (zigzag), `bytes` and
/// `updated_at_ms` (zigzag) as LEB128 varints, then the inline body, the location, or the
/// directory's 32-bit id (big-endian) and the file's 128-bit hash. Also the directory attribute to set.
fn encode_entry(state: &StoredState) -> (Vec<u8>, Option<(String, String)>) {
    let mut out = vec![NONE];
    encode_varint(zigzag(state.next_offset), &mut out);
    encode_varint(state.bytes, &mut out);
    encode_varint(zigzag(state.updated_at_ms), &mut out);
    let mut dir = None;
    if let Some(body) = state.body.as_ref().filter(|b| !b.is_empty()) {
        out[0] = BODY;
        out.extend_from_slice(body);
    } else if let Some(location) = &state.location {
        match split_location(location) {
            Some((d, hash)) => {
                out[0] = HASHED;
                let id = dir_id(d);
                out.extend_from_slice(&id.to_be_bytes());
                out.extend_from_slice(&hash);
                dir = Some((dir_attr(id), d.to_string()));
            }
            None => {
                out[0] = LOCATION;
                out.extend_from_slice(location.as_bytes());
            }
        }
    }
    (out, dir)
}

/// The state of the entry `blob` with `seq`, its directories read from `item`; `None` when the
/// entry is damaged.
fn decode_entry(
    blob: &[u8],
    seq: u64,
    item: &HashMap<String, AttributeValue>,
) -> Option<StoredState> {
    let (&kind, mut rest) = blob.split_first()?;
    let next_offset = unzigzag(decode_varint(&mut rest).ok()?);
    let bytes = decode_varint(&mut rest).ok()?;
    let updated_at_ms = unzigzag(decode_varint(&mut rest).ok()?);
    let (body, location) = match kind {
        NONE => (None, None),
        BODY => (Some(rest.to_vec()), None),
        LOCATION => (None, Some(std::str::from_utf8(rest).ok()?.to_string())),
        HASHED => {
            let (id, hash) = rest.split_first_chunk::<4>()?;
            let hash: [u8; 16] = hash.try_into().ok()?;
            let dir = get_s(item, &dir_attr(u32::from_be_bytes(*id)))?;
            (
                None,
                Some(format!("{dir}{:032x}.run", u128::from_be_bytes(hash))),
            )
        }
        _ => return None,
    };
    Some(StoredState {
        next_offset,
        seq,
        body,
        location,
        bytes,
        updated_at_ms,
    })
}

impl DynamoStateStore {
    /// The stored states of `sources`, in their order: from their buckets, else from the
    /// per-partition items of the layout before.
    pub(super) async fn read_states(
        &self,
        sources: &[SourcePartition],
    ) -> Result<Vec<Option<StoredState>>> {
        let mut pks: Vec<String> = sources.iter().map(bucket_pk).collect();
        pks.sort();
        pks.dedup();
        let buckets: HashMap<String, HashMap<String, AttributeValue>> = self
            .get_items(pks.into_iter().map(key).collect(), "read partition state")
            .await?
            .into_iter()
            .filter_map(|i| Some((get_s(&i, "pk")?.to_string(), i)))
            .collect();
        let mut out = Vec::with_capacity(sources.len());
        let mut missing = Vec::new();
        for (i, src) in sources.iter().enumerate() {
            let p = src.partition;
            let entry = match buckets.get(&bucket_pk(src)) {
                Some(item) => match (item.get(&format!("q{p}")), item.get(&format!("s{p}"))) {
                    (None, None) => None,
                    (Some(seq), Some(blob)) => {
                        let seq = seq.as_n().ok().and_then(|n| n.parse::<u64>().ok());
                        let (Some(seq), Ok(blob)) = (seq, blob.as_b()) else {
                            return Err(self.damaged(src));
                        };
                        Some(
                            decode_entry(blob.as_ref(), seq, item)
                                .ok_or_else(|| self.damaged(src))?,
                        )
                    }
                    _ => return Err(self.damaged(src)),
                },
                None => None,
            };
            if entry.is_none() {
                missing.push(i);
            }
            out.push(entry);
        }
        let legacy = self
            .read_legacy_states(missing.iter().map(|&i| &sources[i]))
            .await?;
        let mut fresh = self.fresh.lock().map_err(|_| poisoned())?;
        for src in sources {
            fresh.remove(src);
        }
        for i in missing {
            let src = &sources[i];
            fresh.insert(src.clone());
            out[i] = legacy.get(&legacy_pk(src)).cloned();
        }
        Ok(out)
    }

    fn damaged(&self, src: &SourcePartition) -> Error {
        Error::State {
            op: "read partition state",
            message: format!(
                "DynamoDB table {}: the state entry of {src} in item {} is damaged",
                self.table,
                bucket_pk(src)
            ),
            retryable: false,
        }
    }

    /// The per-partition items of the layout before, by `pk`.
    async fn read_legacy_states(
        &self,
        sources: impl Iterator<Item = &SourcePartition>,
    ) -> Result<HashMap<String, StoredState>> {
        let keys: Vec<_> = sources.map(|s| key(legacy_pk(s))).collect();
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let mut by_pk = HashMap::new();
        for item in self.get_items(keys, "read partition state").await? {
            let (Some(pk), Some(next_offset), Some(seq)) = (
                get_s(&item, "pk"),
                get_n::<i64>(&item, "next"),
                get_n::<u64>(&item, "seq"),
            ) else {
                return Err(Error::Internal(format!(
                    "DynamoDB table {}: a partition state item lacks pk, next or seq",
                    self.table
                )));
            };
            let body = item
                .get("body")
                .and_then(|b| b.as_b().ok())
                .map(|b| b.as_ref().to_vec());
            if body.as_deref().is_some_and(is_marker) {
                return Err(Error::State {
                    op: "read partition state",
                    message: format!(
                        "DynamoDB table {}: the state of {pk} was moved to its state bucket \
                         item, which has no entry for it (was the item deleted?); restore the \
                         table from a backup, or delete {pk} too to start its state afresh",
                        self.table
                    ),
                    retryable: false,
                });
            }
            by_pk.insert(
                pk.to_string(),
                StoredState {
                    next_offset,
                    seq,
                    body,
                    location: get_s(&item, "location").map(str::to_string),
                    bytes: get_n(&item, "bytes").unwrap_or(0),
                    updated_at_ms: get_n(&item, "updated_at_ms").unwrap_or(0),
                },
            );
        }
        Ok(by_pk)
    }

    /// The transaction items writing the states of `advances`: one update per state bucket,
    /// each partition conditioned on its entry's `seq` (or its absence), and for a partition
    /// whose entry is new, the put of the marker over its item of the layout before,
    /// conditioned on the `seq` read there (or its absence).
    pub(super) fn state_items(&self, advances: &[SourceAdvance]) -> Result<Vec<TransactWriteItem>> {
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::Internal(format!("DynamoDB request: {e}"))
        };
        let fresh = self.fresh.lock().map_err(|_| poisoned())?;
        let mut by_bucket: BTreeMap<String, Vec<(&SourcePartition, &StoredState)>> =
            BTreeMap::new();
        for a in advances {
            if let Some(state) = &a.state {
                by_bucket
                    .entry(bucket_pk(&a.source))
                    .or_default()
                    .push((&a.source, state));
            }
        }
        let mut items = Vec::new();
        for (pk, group) in by_bucket {
            let mut update = Update::builder()
                .table_name(&self.table)
                .set_key(Some(key(pk)));
            let (mut set, mut cond) = (Vec::new(), Vec::new());
            let mut dirs: BTreeMap<String, String> = BTreeMap::new();
            for (i, (source, state)) in group.into_iter().enumerate() {
                let p = source.partition;
                if let Some(b) = state
                    .body
                    .as_ref()
                    .filter(|b| b.len() > MAX_ENTRY_BODY_BYTES)
                {
                    return Err(Error::Internal(format!(
                        "the state of {source} is {} bytes inline; a state bucket entry holds at \
                         most {MAX_ENTRY_BODY_BYTES} (larger states go to a state file)",
                        b.len()
                    )));
                }
                let (blob, dir) = encode_entry(state);
                dirs.extend(dir);
                update = update
                    .expression_attribute_names(format!("#q{i}"), format!("q{p}"))
                    .expression_attribute_names(format!("#s{i}"), format!("s{p}"))
                    .expression_attribute_values(format!(":q{i}"), n(state.seq))
                    .expression_attribute_values(
                        format!(":s{i}"),
                        AttributeValue::B(Blob::new(blob)),
                    );
                set.push(format!("#q{i}=:q{i}"));
                set.push(format!("#s{i}=:s{i}"));
                if fresh.contains(source) || state.seq <= 1 {
                    cond.push(format!("attribute_not_exists(#q{i})"));
                    items.push(self.marker_put(source, state)?);
                } else {
                    update = update.expression_attribute_values(format!(":o{i}"), n(state.seq - 1));
                    cond.push(format!("#q{i}=:o{i}"));
                }
            }
            for (j, (attr, dir)) in dirs.into_iter().enumerate() {
                update = update
                    .expression_attribute_names(format!("#d{j}"), attr)
                    .expression_attribute_values(format!(":d{j}"), s(dir));
                set.push(format!("#d{j}=:d{j}"));
                // Two directories of one id would point entries at the wrong files.
                cond.push(format!("(attribute_not_exists(#d{j}) OR #d{j}=:d{j})"));
            }
            update = update
                .update_expression(format!("SET {}", set.join(",")))
                .condition_expression(cond.join(" AND "));
            items.push(
                TransactWriteItem::builder()
                    .update(update.build().map_err(build)?)
                    .build(),
            );
        }
        Ok(items)
    }

    /// The put of the moved marker over `source`'s item of the layout before, if that item is
    /// still the state `state` follows (`seq - 1`; absent for a first state).
    fn marker_put(
        &self,
        source: &SourcePartition,
        state: &StoredState,
    ) -> Result<TransactWriteItem> {
        let body = zstd::bulk::compress(MOVED_MARKER, 1)
            .map_err(|e| Error::Internal(format!("compress state marker: {e}")))?;
        let mut put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(key(legacy_pk(source))))
            .item("next", n(state.next_offset))
            .item("seq", n(state.seq))
            .item("bytes", n(0))
            .item("updated_at_ms", n(state.updated_at_ms))
            .item("body", AttributeValue::B(Blob::new(body)));
        put = if state.seq <= 1 {
            put.condition_expression("attribute_not_exists(pk)")
        } else {
            put.condition_expression("seq = :old")
                .expression_attribute_values(":old", n(state.seq - 1))
        };
        Ok(TransactWriteItem::builder()
            .put(
                put.build()
                    .map_err(|e| Error::Internal(format!("DynamoDB request: {e}")))?,
            )
            .build())
    }

    /// After an advance landed: its partitions' entries exist.
    pub(super) fn states_written(&self, advances: &[SourceAdvance]) {
        if let Ok(mut fresh) = self.fresh.lock() {
            for a in advances.iter().filter(|a| a.state.is_some()) {
                fresh.remove(&a.source);
            }
        }
    }
}

fn poisoned() -> Error {
    Error::Internal("partition state cache poisoned".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(body: Option<&[u8]>, location: Option<&str>) -> StoredState {
        StoredState {
            next_offset: 1_234_567_890,
            seq: 77,
            body: body.map(<[u8]>::to_vec),
            location: location.map(str::to_string),
            bytes: 3_600_000,
            updated_at_ms: 1_764_633_600_123,
        }
    }

    #[test]
    fn entries_round_trip_and_name_their_file_by_its_hash() {
        let file = "s3://b/wh/_state/partitions/orders/runs/0123456789abcdef0123456789abcdef.run";
        let cases = [
            state(None, None),
            state(Some(b"\x28\xb5\x2f\xfd inline"), None),
            state(None, Some(file)),
            // Not a state file's name: kept as it is.
            state(
                None,
                Some("s3://b/wh/_state/partitions/orders/0/state-9.zst"),
            ),
            state(None, Some("s3://b/x/0123456789ABCDEF0123456789ABCDEF.run")),
            state(None, Some("0123456789abcdef0123456789abcdef.run")),
        ];
        for st in cases {
            let (blob, dir) = encode_entry(&st);
            let mut item = HashMap::new();
            if let Some((attr, d)) = dir {
                item.insert(attr, s(d));
            }
            assert_eq!(decode_entry(&blob, 77, &item), Some(st.clone()));
        }
        let (blob, dir) = encode_entry(&state(None, Some(file)));
        assert!(blob.len() <= 40, "{} bytes", blob.len());
        assert_eq!(
            dir.map(|d| d.1).as_deref(),
            Some("s3://b/wh/_state/partitions/orders/runs/")
        );
        // Negative and extreme values survive the varints.
        let mut st = state(None, None);
        (st.next_offset, st.bytes, st.updated_at_ms) = (i64::MIN, u64::MAX, -1);
        assert_eq!(
            decode_entry(&encode_entry(&st).0, 77, &HashMap::new()),
            Some(st)
        );
    }

    #[test]
    fn damaged_entries_are_none_never_a_panic() {
        let (blob, _) = encode_entry(&state(
            None,
            Some("s3://b/wh/runs/0123456789abcdef0123456789abcdef.run"),
        ));
        // Its directory is not in the item.
        assert_eq!(decode_entry(&blob, 1, &HashMap::new()), None);
        for cut in 0..blob.len() {
            let _ = decode_entry(&blob[..cut], 1, &HashMap::new());
        }
        assert_eq!(decode_entry(&[], 1, &HashMap::new()), None);
        assert_eq!(decode_entry(&[0x99, 0, 0, 0], 1, &HashMap::new()), None);
        assert_eq!(
            decode_entry(&[NONE, 0xff, 0xff, 0xff], 1, &HashMap::new()),
            None
        );
        let mut long = vec![NONE];
        long.extend([0x80; 12]);
        assert_eq!(decode_entry(&long, 1, &HashMap::new()), None);
        assert_eq!(
            decode_entry(&[LOCATION, 0, 0, 0, 0xff], 1, &HashMap::new()),
            None
        );
    }

    #[test]
    fn sixteen_partitions_share_a_bucket_under_a_kilobyte() {
        let b = |p| bucket_pk(&SourcePartition::new("orders", p));
        assert_eq!(b(0), "state#orders#b000000");
        assert_eq!(b(15), b(0));
        assert_eq!(b(16), "state#orders#b000001");
        // Never an item of the layout before (whose last part is a number).
        assert_ne!(b(0), legacy_pk(&SourcePartition::new("orders", 0)));
        let file = "s3://a-bucket-of-63-characters/a-warehouse/_state/partitions/orders-v2/runs/\
                    0123456789abcdef0123456789abcdef.run";
        let mut bytes = "pk".len() + b(0).len() + "sk".len() + "state".len();
        let (_, dir) = encode_entry(&state(None, Some(file)));
        let (attr, dir) = dir.unwrap();
        bytes += attr.len() + dir.len();
        for p in 0..STATE_BUCKET_PARTITIONS {
            let (blob, _) = encode_entry(&state(None, Some(file)));
            // Name, then a number: about one byte per two digits, plus one.
            bytes += format!("q{p}").len() + 4 + format!("s{p}").len() + blob.len();
        }
        assert!(bytes < 1024, "{bytes} bytes");
    }
}
