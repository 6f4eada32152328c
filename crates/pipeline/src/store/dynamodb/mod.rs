//! Checkpoints and pending batches in DynamoDB.
//!
//! One table with a string partition key `pk` and sort key `sk`:
//!
//! | item | pk | sk | attributes |
//! |---|---|---|---|
//! | checkpoints of 96 partitions | `checkpoints#{topic}#{partition / 96}` | `checkpoint` | `next` (map: partition → next offset) |
//! | checkpoint before 0.3 | `source#{topic}#{partition}` | `checkpoint` | `next_offset`, `version`, `updated_at_ms` |
//! | pending batch | `pending#{shard}` | [`BatchKey::sort_key`] | `topic`, `partition`, `first_offset`, `last_offset`, `created_at_ms`, `body` (binary, see [`body`]; in mirror mode `files`, JSON, and `more`), `files_location` |
//! | commit intent | `commit` | `intent` | `id`, `created_at_ms`, `batches` (JSON) |
//! | layout | `meta` | `layout` | `version`, `since_ms`, `synced`, `bodies` ([`BODY_LAYOUT`]) |
//! | states of 16 partitions | `state#{topic}#b{partition / 16:06}` | `state` | per partition `q{p}` (seq) and `s{p}` (binary: next offset, bytes, written at, and the state file's hash or a small inline section); `d{id}` (a directory of state files) |
//! | partition state before | `state#{topic}#{partition}` | `state` | `next`, `seq`, `body` (zstd, `process::partition_state`'s layout) or `location`, `bytes`, `updated_at_ms`; a marker of a newer layout once the bucket holds the state |
//!
//! Pending batches live in [`PENDING_SHARDS`] partitions (`shard` = a hash of the topic-partition,
//! two digits), sorted by age: the commit stage reads the oldest ones with one strongly
//! consistent `Query` per shard and a `Limit`, never a scan. Releases before 0.2 kept them under
//! the checkpoint's `pk`; [`DynamoStateStore::upgrade`] moves such items (for an hour after the
//! upgrade, so that invocations of the old release still in flight are caught too).
//!
//! The advance is one `TransactWriteItems`: an update of each checkpoint bucket the batch
//! touches, conditioned on the entries of its partitions (see [`checkpoints`]), and a put of
//! the pending batch conditioned on its absence. No client request token
//! is set: two invocations of the same batch would share it, and DynamoDB would answer the
//! second "success" without applying it. An SDK retry of a transaction that did commit instead
//! fails its condition and the partition is re-planned (everything is then already seen).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Put, TransactWriteItem};

use crate::aws::SdkFault;
use crate::checkpoint::{
    Advance, BatchKey, Checkpoint, PendingBatch, PendingPage, SourceAdvance, SourcePartition,
    StoredState, decode_ranges, encode_ranges,
};
use crate::error::{Error, Result};
use crate::ledger::Delivery;
use crate::store::{CheckpointStore, CommitIntent};

mod body;
mod buckets;
mod checkpoints;
mod intents_and_locks;
mod partition_state;
mod upgrade;

pub use buckets::BUCKET_PARTITIONS;

/// DynamoDB state store.
#[derive(Debug, Clone)]
pub struct DynamoStateStore {
    client: Client,
    table: String,
    /// The checkpoint layout in force, and when it was read.
    /// The layout item's `bodies` this store's [`StateStore::upgrade`] sets, which says what
    /// ingest may write (`STREAMTABLE_PENDING_BODIES`; see [`BODY_LAYOUT`] and
    /// [`CARRIED_ROWS_LAYOUT`]).
    body_layout: i64,
    layout: Arc<Mutex<Option<(Instant, checkpoints::Mode, i64)>>>,
    /// Partitions whose last read found no entry in their state bucket: their next write
    /// creates the entry and replaces their item of the layout before (see
    /// [`partition_state`]).
    fresh: Arc<Mutex<std::collections::HashSet<SourcePartition>>>,
}

/// Most items of one `TransactWriteItems`.
pub const MAX_TRANSACTION_ITEMS: usize = 100;

/// Partitions the pending batches are spread over.
pub const PENDING_SHARDS: u64 = 16;
/// How long after an upgrade items in the old layout are still looked for.
pub const LEGACY_WINDOW_MS: i64 = 3_600_000;
/// The layout this release writes (3: checkpoints in buckets).
const LAYOUT_VERSION: i64 = 3;
/// The layout item's `bodies` once the commit stage reads pending bodies compressed against
/// the dictionary ([`body`]): its release's scheduled stage sets it on its first run, and ingest
/// writes such bodies only then, so that a commit stage of the release before (during a
/// rolling deploy) never meets one.
pub const BODY_LAYOUT: i64 = 1;
/// The layout item's `bodies` once the commit stage also reads rows carried in state files
/// ([`crate::checkpoint::CarriedRows`]): ingest carries small derived files only then (a
/// commit stage of a release before would keep such a batch pending, refused).
pub const CARRIED_ROWS_LAYOUT: i64 = 2;

fn pending_pk(s: &SourcePartition) -> String {
    let shard = xxhash_rust::xxh3::xxh3_64(s.to_string().as_bytes()) % PENDING_SHARDS;
    format!("pending#{shard:02}")
}

fn pending_item_key(k: &BatchKey) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("pk".to_string(), s(pending_pk(&k.source))),
        ("sk".to_string(), s(k.sort_key())),
    ])
}

fn state_error(op: &'static str, table: &str, f: SdkFault) -> Error {
    Error::State {
        op,
        message: format!("DynamoDB table {table}: {}", f.message),
        retryable: f.retryable,
    }
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn get_n<T: std::str::FromStr>(item: &HashMap<String, AttributeValue>, name: &str) -> Option<T> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

fn get_s<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

impl DynamoStateStore {
    /// A store on `table`, with an SDK client built once by the caller.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoStateStore {
            client,
            table: table.into(),
            layout: Arc::new(Mutex::new(None)),
            body_layout: CARRIED_ROWS_LAYOUT,
            fresh: Arc::new(Mutex::new(std::collections::HashSet::new())),
        }
    }

    /// This store, whose [`StateStore::upgrade`] (the scheduled stage's) lets ingest write
    /// pending bodies against the dictionary when `allow`, and otherwise takes that back: ingest
    /// returns to the first layout within a minute (the layout is cached that long), which every
    /// release reads — the way to prepare a rollback below the release that introduced it.
    pub fn with_dictionary_bodies(self, allow: bool) -> Self {
        self.with_body_layout(if allow { CARRIED_ROWS_LAYOUT } else { 0 })
    }

    /// This store, whose [`StateStore::upgrade`] sets the layout item's `bodies` to `layout`:
    /// 0 the first layout, [`BODY_LAYOUT`] bodies against the dictionary,
    /// [`CARRIED_ROWS_LAYOUT`] those and rows carried in state files. Ingest follows within a
    /// minute; a lower value prepares a rollback below the release that introduced the higher.
    pub fn with_body_layout(mut self, layout: i64) -> Self {
        self.body_layout = layout;
        self
    }

    fn corrupt(&self, what: String) -> Error {
        Error::State {
            op: "read pending",
            message: format!("DynamoDB table {}: {what}", self.table),
            retryable: false,
        }
    }

    /// The conditional put of a pending batch's item. In the bucket layout the file list and
    /// the other partitions' ranges travel as one zstd-compressed `body` (DynamoDB bills writes
    /// by the kilobyte); in mirror mode as the plain attributes an
    /// earlier release's commit stage reads.
    async fn pending_put(
        &self,
        batch: &PendingBatch,
    ) -> Result<aws_sdk_dynamodb::types::builders::PutBuilder> {
        let mut put = Put::builder()
            .table_name(&self.table)
            .item("pk", s(pending_pk(&batch.source)))
            .item("sk", s(batch.key().sort_key()))
            .item("topic", s(&batch.source.topic))
            .item("partition", n(batch.source.partition))
            .item("first_offset", n(batch.first_offset))
            .item("last_offset", n(batch.last_offset))
            .item("created_at_ms", n(batch.created_at_ms))
            .condition_expression("attribute_not_exists(pk)");
        if let Some(location) = &batch.files_location {
            put = put.item("files_location", s(location));
        }
        // An attribute of its own: a release that does not know the ledger ignores it.
        if let Some(delivered) = batch.delivery.encode() {
            put = put.item("delivered", s(delivered));
        }
        let (mode, bodies) = self.layout().await?;
        if mode == checkpoints::Mode::Buckets {
            let body = if bodies >= BODY_LAYOUT {
                body::encode(&batch.files, &batch.more)?
            } else {
                body::encode_first_layout(&batch.files, &batch.more)?
            };
            return Ok(put.item("body", AttributeValue::B(body.into())));
        }
        let files = serde_json::to_string(&batch.files)
            .map_err(|e| Error::Internal(format!("serialize pending files: {e}")))?;
        put = put.item("files", s(files));
        if !batch.more.is_empty() {
            put = put.item("more", s(encode_ranges(&batch.more)));
        }
        Ok(put)
    }

    /// Reads one pending item into `page` (as a batch, or as unreadable with the reason).
    fn read_item(&self, item: &HashMap<String, AttributeValue>, page: &mut PendingPage) {
        let (Some(topic), Some(partition)) = (get_s(item, "topic"), get_n(item, "partition"))
        else {
            let what = get_s(item, "sk").unwrap_or("?").to_string();
            page.unreadable.push((
                BatchKey {
                    source: SourcePartition::new("?", -1),
                    first_offset: -1,
                    created_at_ms: 0,
                },
                format!(
                    "DynamoDB table {}: pending item {what} has no topic or partition",
                    self.table
                ),
            ));
            return;
        };
        let key = BatchKey {
            source: SourcePartition::new(topic, partition),
            first_offset: get_n(item, "first_offset").unwrap_or(0),
            created_at_ms: get_n(item, "created_at_ms").unwrap_or(0),
        };
        let files_location = get_s(item, "files_location").map(str::to_string);
        let last_offset = get_n(item, "last_offset").unwrap_or(key.first_offset);
        // The counts only feed the audit: unreadable ones must not hold the batch's rows back.
        let delivery = Delivery::decode(get_s(item, "delivered")).unwrap_or_else(|why| {
            tracing::warn!(source = %key.source, first_offset = key.first_offset, %why,
                "pending batch's delivered counts unreadable; taken as whole");
            Delivery::default()
        });
        let decoded = match item.get("body").map(AttributeValue::as_b) {
            Some(Ok(b)) => body::decode(b.as_ref()),
            Some(Err(_)) => Err("pending item body is not binary".to_string()),
            None => get_s(item, "more")
                .map(decode_ranges)
                .transpose()
                .map(Option::unwrap_or_default)
                .and_then(|more| {
                    serde_json::from_str(get_s(item, "files").unwrap_or("[]"))
                        .map(|files| (files, more))
                        .map_err(|e| format!("file list is corrupt: {e}"))
                }),
        };
        match decoded {
            Ok((files, more)) => page.batches.push(PendingBatch {
                more,
                last_offset,
                source: key.source,
                first_offset: key.first_offset,
                created_at_ms: key.created_at_ms,
                files,
                files_location,
                delivery,
            }),
            Err(why) => page
                .unreadable
                .push((key, format!("DynamoDB table {}: {why}", self.table))),
        }
    }

    /// Up to `limit` pending items of one shard with a sort key after `after`, and whether the
    /// shard holds more.
    async fn query_shard(
        &self,
        shard: u64,
        after: &str,
        limit: usize,
    ) -> Result<(Vec<HashMap<String, AttributeValue>>, bool)> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .expression_attribute_values(":pk", s(format!("pending#{shard:02}")));
            query = if after.is_empty() {
                query.key_condition_expression("pk = :pk")
            } else {
                query
                    .key_condition_expression("pk = :pk AND sk > :after")
                    .expression_attribute_values(":after", s(after))
            };
            let page = query
                .limit(i32::try_from(limit - items.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| state_error("read pending", &self.table, SdkFault::from_sdk(&e)))?;
            items.extend(page.items().iter().cloned());
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => {
                    if items.len() >= limit {
                        return Ok((items, true));
                    }
                    start = Some(k.clone());
                }
                _ => return Ok((items, false)),
            }
        }
    }

    async fn put_intent(&self, intent: &CommitIntent, condition: &str) -> Result<bool> {
        let batches = serde_json::to_string(&intent.batches)
            .map_err(|e| Error::Internal(format!("serialize commit intent: {e}")))?;
        let mut req = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s("commit"))
            .item("sk", s("intent"))
            .item("id", s(&intent.id))
            .item("created_at_ms", n(intent.created_at_ms))
            .item("batches", s(batches))
            .condition_expression(condition);
        if condition.contains(":id") {
            req = req.expression_attribute_values(":id", s(&intent.id));
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.code.as_deref() == Some("ConditionalCheckFailedException") {
                    Ok(false)
                } else {
                    Err(state_error("write commit intent", &self.table, f))
                }
            }
        }
    }
}

#[async_trait]
impl CheckpointStore for DynamoStateStore {
    async fn checkpoint(&self, source: &SourcePartition) -> Result<Checkpoint> {
        let all = self.read_checkpoints(std::slice::from_ref(source)).await?;
        Ok(all.first().copied().unwrap_or(Checkpoint::INITIAL))
    }
    async fn checkpoints(&self, sources: &[SourcePartition]) -> Result<Vec<Checkpoint>> {
        self.read_checkpoints(sources).await
    }
    async fn partitions(&self, topic: &str) -> Result<Vec<i32>> {
        self.topic_partitions(topic).await
    }
    async fn partition_states(
        &self,
        sources: &[SourcePartition],
    ) -> Result<Vec<Option<StoredState>>> {
        self.read_states(sources).await
    }
    async fn reads_carried_rows(&self) -> Result<bool> {
        Ok(self.layout().await?.1 >= CARRIED_ROWS_LAYOUT)
    }
    fn max_inline_state_bytes(&self) -> usize {
        partition_state::MAX_INLINE_STATE_BYTES
    }
    async fn groups(&self, sources: &[SourcePartition], stateful: &[bool]) -> Result<Vec<usize>> {
        self.group_sizes(sources, stateful).await
    }

    async fn advance(&self, advances: &[SourceAdvance], batch: &PendingBatch) -> Result<Advance> {
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::Internal(format!("DynamoDB request: {e}"))
        };
        let mut items = self.advance_items(advances, batch.created_at_ms).await?;
        items.extend(self.state_items(advances)?);
        items.push(
            TransactWriteItem::builder()
                .put(self.pending_put(batch).await?.build().map_err(build)?)
                .build(),
        );
        if items.len() > MAX_TRANSACTION_ITEMS {
            return Err(Error::Internal(format!(
                "{} items in one advance; a DynamoDB transaction holds {MAX_TRANSACTION_ITEMS}",
                items.len()
            )));
        }
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        match result {
            Ok(_) => {
                self.states_written(advances);
                self.record_first_offsets(advances).await;
                Ok(Advance::Advanced)
            }
            Err(e) => {
                if let Some(TransactWriteItemsError::TransactionCanceledException(c)) =
                    e.as_service_error()
                    && Self::is_lost_race(c)
                {
                    return Ok(Advance::Conflict);
                }
                Err(state_error(
                    "advance checkpoints",
                    &self.table,
                    SdkFault::from_sdk(&e),
                ))
            }
        }
    }

    async fn pending_page(&self, after: Option<&str>, limit: usize) -> Result<PendingPage> {
        let limit = limit.max(1);
        let after = after.unwrap_or("");
        let shards = futures::future::try_join_all(
            (0..PENDING_SHARDS).map(|shard| self.query_shard(shard, after, limit)),
        )
        .await?;
        let mut more = shards.iter().any(|(_, more)| *more);
        let mut items: Vec<HashMap<String, AttributeValue>> =
            shards.into_iter().flat_map(|(items, _)| items).collect();
        items.sort_by(|a, b| get_s(a, "sk").cmp(&get_s(b, "sk")));
        if items.len() > limit {
            items.truncate(limit);
            more = true;
        }
        let mut page = PendingPage::default();
        for item in &items {
            self.read_item(item, &mut page);
        }
        if more {
            page.next = items
                .last()
                .and_then(|i| get_s(i, "sk"))
                .map(str::to_string);
        }
        Ok(page)
    }
    async fn batches(&self, keys: &[BatchKey]) -> Result<PendingPage> {
        let mut page = PendingPage::default();
        let items = self
            .get_items(keys.iter().map(pending_item_key).collect(), "read pending")
            .await?;
        for item in &items {
            self.read_item(item, &mut page);
        }
        page.batches.sort_by_key(|b| b.key().sort_key());
        Ok(page)
    }
    async fn add_pending(&self, batch: &PendingBatch, lock: &str, holder: &str) -> Result<bool> {
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::Internal(format!("DynamoDB request: {e}"))
        };
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .key("pk", s(format!("lock#{lock}")))
            .key("sk", s("lock"))
            .condition_expression("holder = :holder")
            .expression_attribute_values(":holder", s(holder))
            .build()
            .map_err(build)?;
        let put = self.pending_put(batch).await?.build().map_err(build)?;
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().condition_check(check).build())
            .transact_items(TransactWriteItem::builder().put(put).build())
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) => {
                if let Some(TransactWriteItemsError::TransactionCanceledException(_)) =
                    e.as_service_error()
                {
                    return Ok(false);
                }
                Err(state_error(
                    "record replayed batch",
                    &self.table,
                    SdkFault::from_sdk(&e),
                ))
            }
        }
    }
}
