//! Checkpoints in buckets: one item holds the next offsets of [`super::BUCKET_PARTITIONS`]
//! consecutive partitions of a topic, as a map from partition to offset. An invocation that
//! lands 64 partitions of a topic updates one item, not 64: DynamoDB bills a transaction by
//! item and kilobyte, so this is what keeps the cost per GB independent of the topic's width.
//!
//! Each partition is conditioned on its own map entry (`#m.#p = :old`), so concurrent
//! invocations on different partitions of one bucket never conflict logically; DynamoDB may
//! still cancel one of two transactions touching the same item at the same instant
//! (`TransactionConflict`), which is re-planned like any lost race.
//!
//! Releases before 0.3 kept one item per partition (`source#{topic}#{partition}`). Until the
//! scheduled stage has copied those into buckets an hour after the upgrade (when no invocation
//! of the old release can still run), ingest works in *mirror* mode: the per-partition items
//! stay the authority and are updated as before, and the buckets are written alongside.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, TransactWriteItem, Update};

use super::buckets::{bucket_key, legacy_key, split};
use super::{DynamoStateStore, get_n, get_s, n, s, state_error};
use crate::aws::SdkFault;
use crate::checkpoint::{Checkpoint, SourceAdvance, SourcePartition};
use crate::error::{Error, Result};

/// How long the layout (mirror or buckets) read from the table is trusted.
const MODE_TTL: Duration = Duration::from_secs(60);
/// The map attribute of a bucket item.
const MAP: &str = "next";

/// Where checkpoints are authoritative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Per-partition items (pre-0.3) are the authority; buckets are written alongside.
    Mirror,
    /// Buckets only.
    Buckets,
}

fn item_key(pk: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("pk".to_string(), s(pk)),
        ("sk".to_string(), s("checkpoint")),
    ])
}

/// The next offset recorded for `partition` in a bucket item, if any.
fn entry(item: &HashMap<String, AttributeValue>, partition: i32) -> Option<i64> {
    item.get(MAP)?
        .as_m()
        .ok()?
        .get(&partition.to_string())?
        .as_n()
        .ok()?
        .parse()
        .ok()
}

/// The map attribute of a bucket item holding, per partition, the latest Kafka timestamp (ms)
/// it took: one entry set beside the next offset in the same clause count a map keeps (a
/// top-level attribute per partition would add a name per partition to the expression). Older
/// items lack it and are given an empty one when read ([`DynamoStateStore::read_checkpoints`]).
const STAMPS: &str = "ts";

/// The latest Kafka timestamp recorded for `partition` in a bucket item, -1 if none.
fn stamp(item: &HashMap<String, AttributeValue>, partition: i32) -> i64 {
    item.get(STAMPS)
        .and_then(|m| m.as_m().ok())
        .and_then(|m| m.get(&partition.to_string()))
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// The attribute of a bucket item holding the first offset `partition` took.
fn first_attribute(partition: i32) -> String {
    format!("f{partition}")
}

/// A number attribute of a bucket item, -1 if none.
fn number(item: &HashMap<String, AttributeValue>, attribute: &str) -> i64 {
    item.get(attribute)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// Whether `code` (a transaction cancellation reason) means another writer got there first.
fn lost_race(code: Option<&str>) -> bool {
    matches!(code, Some("ConditionalCheckFailed" | "TransactionConflict"))
}

impl DynamoStateStore {
    /// Mirror or buckets, from the table's layout item (cached for a minute).
    pub(super) async fn mode(&self) -> Result<Mode> {
        Ok(self.layout().await?.0)
    }

    /// The mode, and the layout item's `bodies`: what the commit stage reads of pending bodies
    /// (its release marked the layout item so: see [`super::BODY_LAYOUT`]; until then ingest
    /// writes the first layout, which every release reads), from the table's layout item
    /// (cached for a minute).
    pub(super) async fn layout(&self) -> Result<(Mode, i64)> {
        if let Some((at, mode, bodies)) = *self.layout.lock().map_err(|_| poisoned())?
            && at.elapsed() < MODE_TTL
        {
            return Ok((mode, bodies));
        }
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s("meta"))
            .key("sk", s("layout"))
            .send()
            .await
            .map_err(|e| state_error("read layout", &self.table, SdkFault::from_sdk(&e)))?;
        let buckets = out.item().is_some_and(|i| {
            get_n::<i64>(i, "version").unwrap_or(0) >= super::LAYOUT_VERSION
                && i.get("synced").and_then(|v| v.as_bool().ok()).copied() == Some(true)
        });
        let bodies = out
            .item()
            .map_or(0, |i| get_n::<i64>(i, "bodies").unwrap_or(0));
        let mode = if buckets { Mode::Buckets } else { Mode::Mirror };
        *self.layout.lock().map_err(|_| poisoned())? = Some((Instant::now(), mode, bodies));
        Ok((mode, bodies))
    }

    /// Items by `pk`, read with strongly consistent `BatchGetItem`s (a stale checkpoint would
    /// only cost a lost transaction, which is dearer than the consistent read).
    pub(super) async fn get_items(
        &self,
        keys: Vec<HashMap<String, AttributeValue>>,
        op: &'static str,
    ) -> Result<Vec<HashMap<String, AttributeValue>>> {
        let mut found = Vec::new();
        for chunk in keys.chunks(100) {
            let mut todo = chunk.to_vec();
            for attempt in 0..8u32 {
                if todo.is_empty() {
                    break;
                }
                if attempt > 0 {
                    tokio::time::sleep(crate::clock::jitter(50 << attempt)).await;
                }
                let wanted = KeysAndAttributes::builder()
                    .set_keys(Some(todo.clone()))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| Error::Internal(format!("DynamoDB request: {e}")))?;
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, wanted)
                    .send()
                    .await
                    .map_err(|e| state_error(op, &self.table, SdkFault::from_sdk(&e)))?;
                if let Some(items) = out.responses().and_then(|r| r.get(&self.table)) {
                    found.extend(items.iter().cloned());
                }
                todo = out
                    .unprocessed_keys()
                    .and_then(|m| m.get(&self.table))
                    .map(|k| k.keys().to_vec())
                    .unwrap_or_default();
            }
            if !todo.is_empty() {
                return Err(Error::State {
                    op,
                    message: format!(
                        "DynamoDB table {}: {} reads stayed unprocessed",
                        self.table,
                        todo.len()
                    ),
                    retryable: true,
                });
            }
        }
        Ok(found)
    }

    /// The partitions of `topic` in its bucket items (buckets 0, 1, … until one is missing;
    /// buckets are written in both layouts).
    pub(super) async fn topic_partitions(&self, topic: &str) -> Result<Vec<i32>> {
        let mut out = Vec::new();
        for first in (0..).step_by(10) {
            let keys: Vec<String> = (first..first + 10)
                .map(|b| format!("checkpoints#{topic}#{b:06}"))
                .collect();
            let items = self
                .get_items(keys.into_iter().map(item_key).collect(), "list partitions")
                .await?;
            for i in &items {
                if let Some(m) = i.get(MAP).and_then(|m| m.as_m().ok()) {
                    out.extend(m.keys().filter_map(|k| k.parse::<i32>().ok()));
                }
            }
            if items.len() < 10 {
                break;
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The pre-0.3 per-partition checkpoints of `sources`, by item key.
    async fn legacy_checkpoints(
        &self,
        sources: &[&SourcePartition],
    ) -> Result<HashMap<String, Checkpoint>> {
        let mut keys: Vec<String> = sources.iter().map(|s| legacy_key(s)).collect();
        keys.sort();
        keys.dedup();
        let items = self
            .get_items(keys.into_iter().map(item_key).collect(), "read checkpoints")
            .await?;
        Ok(items
            .iter()
            .filter_map(|i| {
                Some((
                    get_s(i, "pk")?.to_string(),
                    Checkpoint {
                        next_offset: get_n(i, "next_offset").unwrap_or(0),
                        version: get_n(i, "version").unwrap_or(0),
                        newest_ms: get_n(i, "newest_ms").unwrap_or(-1),
                        first_offset: get_n(i, "first_offset").unwrap_or(-1),
                    },
                ))
            })
            .collect())
    }

    /// Bucket items by `pk`.
    async fn buckets(
        &self,
        sources: &[SourcePartition],
    ) -> Result<HashMap<String, HashMap<String, AttributeValue>>> {
        let mut keys: Vec<String> = sources.iter().map(bucket_key).collect();
        keys.sort();
        keys.dedup();
        let items = self
            .get_items(keys.into_iter().map(item_key).collect(), "read checkpoints")
            .await?;
        Ok(items
            .into_iter()
            .filter_map(|i| Some((get_s(&i, "pk")?.to_string(), i.clone())))
            .collect())
    }

    /// Creates the bucket items of `keys` that do not exist yet (empty).
    pub(super) async fn create_buckets(&self, keys: &[String]) -> Result<()> {
        for key in keys {
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item_key(key.clone())))
                .item(MAP, AttributeValue::M(HashMap::new()))
                .item(STAMPS, AttributeValue::M(HashMap::new()))
                .condition_expression("attribute_not_exists(pk)")
                .send()
                .await;
            if let Err(e) = put {
                let f = SdkFault::from_sdk(&e);
                if f.code.as_deref() != Some("ConditionalCheckFailedException") {
                    return Err(state_error("create checkpoint bucket", &self.table, f));
                }
            }
        }
        Ok(())
    }

    /// Gives bucket item `key` an empty map of stamps if it has none.
    async fn add_stamps(&self, key: &str) -> Result<()> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item_key(key.to_string())))
            .update_expression("SET #s = :empty")
            .condition_expression("attribute_exists(pk) AND attribute_not_exists(#s)")
            .expression_attribute_names("#s", STAMPS)
            .expression_attribute_values(":empty", AttributeValue::M(HashMap::new()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.code.as_deref() == Some("ConditionalCheckFailedException") {
                    Ok(())
                } else {
                    Err(state_error(
                        "add stamps to a checkpoint bucket",
                        &self.table,
                        f,
                    ))
                }
            }
        }
    }

    /// Records the first offset of each partition of `advances` that had no checkpoint before
    /// (an attribute `f{partition}` of its bucket, set if absent). After the transaction, not in
    /// it: a bucket's transaction already names each partition twice, and a first offset not
    /// recorded (a crash in between) is only not known, as for an earlier release's partition.
    pub(super) async fn record_first_offsets(&self, advances: &[SourceAdvance]) {
        let mut by_bucket: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
        for a in advances {
            let first = a.to().first_offset;
            if a.from.version == 0 && first >= 0 {
                by_bucket
                    .entry(bucket_key(&a.source))
                    .or_default()
                    .push((a.source.partition, first));
            }
        }
        for (key, firsts) in by_bucket {
            let mut update = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(item_key(key)));
            let mut set = Vec::new();
            for (i, (p, first)) in firsts.iter().enumerate() {
                update = update
                    .expression_attribute_names(format!("#f{i}"), first_attribute(*p))
                    .expression_attribute_values(format!(":f{i}"), n(*first));
                set.push(format!("#f{i}=if_not_exists(#f{i},:f{i})"));
            }
            if let Err(e) = update
                .update_expression(format!("SET {}", set.join(",")))
                .send()
                .await
            {
                tracing::warn!(error = %SdkFault::from_sdk(&e).message,
                    "the first offsets of new partitions were not recorded; the audit starts them at their ledger");
            }
        }
    }

    /// Sets the entry of `source` to `next_offset` if it has none (copies a frozen pre-0.3
    /// checkpoint, or records a new partition at 0). Returns whether it did.
    pub(super) async fn init_entry(
        &self,
        source: &SourcePartition,
        next_offset: i64,
    ) -> Result<bool> {
        self.set_entry_if(
            source,
            next_offset,
            "attribute_exists(pk) AND attribute_not_exists(#m.#p)",
            "record checkpoint",
        )
        .await
    }

    /// Raises the entry of `source` to `next_offset` unless it is there already or beyond.
    /// Returns whether it changed.
    pub(super) async fn raise_entry(
        &self,
        source: &SourcePartition,
        next_offset: i64,
    ) -> Result<bool> {
        self.set_entry_if(
            source,
            next_offset,
            "attribute_not_exists(#m.#p) OR #m.#p < :v",
            "copy checkpoint",
        )
        .await
    }

    /// Sets the entry of `source` to `next_offset` (`:v`) if `condition` holds; `Ok(false)`
    /// when it does not.
    async fn set_entry_if(
        &self,
        source: &SourcePartition,
        next_offset: i64,
        condition: &str,
        op: &'static str,
    ) -> Result<bool> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item_key(bucket_key(source))))
            .update_expression("SET #m.#p = :v")
            .condition_expression(condition)
            .expression_attribute_names("#m", MAP)
            .expression_attribute_names("#p", source.partition.to_string())
            .expression_attribute_values(":v", n(next_offset))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.code.as_deref() == Some("ConditionalCheckFailedException") {
                    Ok(false)
                } else {
                    Err(state_error(op, &self.table, f))
                }
            }
        }
    }

    /// The checkpoints of `sources`, in their order.
    pub(super) async fn read_checkpoints(
        &self,
        sources: &[SourcePartition],
    ) -> Result<Vec<Checkpoint>> {
        if self.mode().await? == Mode::Mirror {
            let refs: Vec<&SourcePartition> = sources.iter().collect();
            let legacy = self.legacy_checkpoints(&refs).await?;
            return Ok(sources
                .iter()
                .map(|s| {
                    legacy
                        .get(&legacy_key(s))
                        .copied()
                        .unwrap_or(Checkpoint::INITIAL)
                })
                .collect());
        }
        let mut buckets = self.buckets(sources).await?;
        // Buckets an earlier release created have no map of stamps: given an empty one, so
        // that a transaction can set an entry in it.
        let unstamped: Vec<String> = buckets
            .iter()
            .filter(|(_, b)| !b.contains_key(STAMPS))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &unstamped {
            self.add_stamps(key).await?;
        }
        if !unstamped.is_empty() {
            buckets = self.buckets(sources).await?;
        }
        let missing: Vec<&SourcePartition> = sources
            .iter()
            .filter(|s| {
                buckets
                    .get(&bucket_key(s))
                    .and_then(|b| entry(b, s.partition))
                    .is_none()
            })
            .collect();
        if !missing.is_empty() {
            // First sight of these partitions in the bucket layout: copy the frozen pre-0.3
            // checkpoint if there is one, else start at 0; then read again.
            let mut absent: Vec<String> = missing
                .iter()
                .map(|s| bucket_key(s))
                .filter(|k| !buckets.contains_key(k))
                .collect();
            absent.sort();
            absent.dedup();
            self.create_buckets(&absent).await?;
            let legacy = self.legacy_checkpoints(&missing).await?;
            for s in &missing {
                let from = legacy.get(&legacy_key(s)).map_or(0, |c| c.next_offset);
                self.init_entry(s, from).await?;
            }
            buckets = self.buckets(sources).await?;
        }
        sources
            .iter()
            .map(|s| {
                let bucket = buckets.get(&bucket_key(s));
                let next =
                    bucket
                        .and_then(|b| entry(b, s.partition))
                        .ok_or_else(|| Error::State {
                            op: "read checkpoints",
                            message: format!(
                                "DynamoDB table {}: no checkpoint entry for {s} after recording it",
                                self.table
                            ),
                            retryable: true,
                        })?;
                Ok(Checkpoint {
                    next_offset: next,
                    version: u64::from(next > 0),
                    newest_ms: bucket.map_or(-1, |b| stamp(b, s.partition)),
                    first_offset: bucket.map_or(-1, |b| number(b, &first_attribute(s.partition))),
                })
            })
            .collect()
    }

    /// How many consecutive `sources` each transaction takes (see [`split`]).
    pub(super) async fn group_sizes(
        &self,
        sources: &[SourcePartition],
        stateful: &[bool],
    ) -> Result<Vec<usize>> {
        let per_partition = usize::from(self.mode().await? == Mode::Mirror);
        Ok(split(sources, per_partition, stateful))
    }

    /// The transaction items that move the checkpoints of `advances`.
    pub(super) async fn advance_items(
        &self,
        advances: &[SourceAdvance],
        now_ms: i64,
    ) -> Result<Vec<TransactWriteItem>> {
        let mode = self.mode().await?;
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::Internal(format!("DynamoDB request: {e}"))
        };
        let mut by_bucket: BTreeMap<String, Vec<&SourceAdvance>> = BTreeMap::new();
        for a in advances {
            by_bucket.entry(bucket_key(&a.source)).or_default().push(a);
        }
        let mut items = Vec::new();
        if mode == Mode::Mirror {
            let keys: Vec<String> = by_bucket.keys().cloned().collect();
            self.create_buckets(&keys).await?;
            for a in advances {
                let next = a.to();
                let mut update = Update::builder()
                    .table_name(&self.table)
                    .set_key(Some(item_key(legacy_key(&a.source))))
                    .update_expression(
                        "SET next_offset = :next, version = :new, updated_at_ms = :now, newest_ms = :ts, first_offset = if_not_exists(first_offset, :first)",
                    )
                    .expression_attribute_values(":first", n(next.first_offset))
                    .expression_attribute_values(":next", n(next.next_offset))
                    .expression_attribute_values(":new", n(next.version))
                    .expression_attribute_values(":now", n(now_ms))
                    .expression_attribute_values(":ts", n(next.newest_ms));
                update = if a.from.version == 0 {
                    update.condition_expression("attribute_not_exists(pk)")
                } else {
                    update
                        .condition_expression("version = :old")
                        .expression_attribute_values(":old", n(a.from.version))
                };
                items.push(
                    TransactWriteItem::builder()
                        .update(update.build().map_err(build)?)
                        .build(),
                );
            }
        }
        for (key, group) in by_bucket {
            let mut set = Vec::new();
            let mut cond = Vec::new();
            let mut update = Update::builder()
                .table_name(&self.table)
                .set_key(Some(item_key(key)))
                .expression_attribute_names("#m", MAP);
            for (i, a) in group.iter().enumerate() {
                update = update
                    .expression_attribute_names(format!("#{i}"), a.source.partition.to_string())
                    .expression_attribute_values(format!(":n{i}"), n(a.to_next_offset))
                    .expression_attribute_values(format!(":o{i}"), n(a.from.next_offset));
                set.push(format!("#m.#{i}=:n{i}"));
                let newest = a.to().newest_ms;
                if newest >= 0 && mode == Mode::Buckets {
                    update = update.expression_attribute_values(format!(":t{i}"), n(newest));
                    set.push(format!("#s.#{i}=:t{i}"));
                }
                cond.push(match mode {
                    Mode::Buckets => format!("#m.#{i}=:o{i}"),
                    // The per-partition item decides; the bucket only must not be ahead.
                    Mode::Mirror => format!("(attribute_not_exists(#m.#{i}) OR #m.#{i}<=:o{i})"),
                });
            }
            if set.iter().any(|c| c.starts_with("#s.")) {
                update = update.expression_attribute_names("#s", STAMPS);
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

    /// Whether a cancelled transaction lost a race (rather than failed).
    pub(super) fn is_lost_race(
        c: &aws_sdk_dynamodb::types::error::TransactionCanceledException,
    ) -> bool {
        c.cancellation_reasons().iter().any(|r| lost_race(r.code()))
    }
}

fn poisoned() -> Error {
    Error::Internal("checkpoint layout cache poisoned".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_from_the_map() {
        let item = HashMap::from([(
            MAP.to_string(),
            AttributeValue::M(HashMap::from([("7".to_string(), n(120))])),
        )]);
        assert_eq!(entry(&item, 7), Some(120));
        assert_eq!(entry(&item, 8), None);
    }
}
