//! Checkpoints and pending batches in DynamoDB.
//!
//! One table with a string partition key `pk` and sort key `sk`:
//!
//! | item | pk | sk | attributes |
//! |---|---|---|---|
//! | checkpoint | `source#{topic}#{partition}` | `checkpoint` | `next_offset`, `version`, `updated_at_ms` |
//! | pending batch | `pending#{shard}` | [`BatchKey::sort_key`] | `topic`, `partition`, `first_offset`, `last_offset`, `created_at_ms`, `files` (JSON), `files_location` |
//! | commit intent | `commit` | `intent` | `id`, `created_at_ms`, `batches` (JSON) |
//! | layout | `meta` | `layout` | `version`, `since_ms` |
//!
//! Pending batches live in [`PENDING_SHARDS`] partitions (`shard` = a hash of the topic-partition,
//! two digits), sorted by age: the commit stage reads the oldest ones with one strongly
//! consistent `Query` per shard and a `Limit`, never a scan. Releases before 0.2 kept them under
//! the checkpoint's `pk`; [`DynamoStateStore::upgrade`] moves such items (for an hour after the
//! upgrade, so that invocations of the old release still in flight are caught too).
//!
//! The advance is one `TransactWriteItems`: an update of the checkpoint conditioned on its
//! version, and a put of the pending batch conditioned on its absence. No client request token
//! is set: two invocations of the same batch would share it, and DynamoDB would answer the
//! second "success" without applying it. An SDK retry of a transaction that did commit instead
//! fails its condition and the partition is re-planned (everything is then already seen).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, DeleteRequest, KeysAndAttributes, Put, TransactWriteItem,
    Update, WriteRequest,
};

use crate::aws::SdkFault;
use crate::checkpoint::{
    Advance, BatchKey, Checkpoint, CommitIntent, PendingBatch, PendingPage, SourcePartition,
    StateStore,
};
use crate::error::{Error, Result};

/// DynamoDB state store.
#[derive(Debug, Clone)]
pub struct DynamoStateStore {
    client: Client,
    table: String,
}

fn source_key(s: &SourcePartition) -> String {
    format!("source#{}#{}", s.topic, s.partition)
}

/// Partitions the pending batches are spread over.
pub const PENDING_SHARDS: u64 = 16;
/// How long after an upgrade items in the old layout are still looked for.
pub const LEGACY_WINDOW_MS: i64 = 3_600_000;
/// The layout this release writes.
const LAYOUT_VERSION: i64 = 2;

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
        }
    }

    fn corrupt(&self, what: String) -> Error {
        Error::State {
            op: "read pending",
            message: format!("DynamoDB table {}: {what}", self.table),
            retryable: false,
        }
    }

    /// The conditional put of a pending batch's item.
    fn pending_put(
        &self,
        batch: &PendingBatch,
    ) -> Result<aws_sdk_dynamodb::types::builders::PutBuilder> {
        let files = serde_json::to_string(&batch.files)
            .map_err(|e| Error::Internal(format!("serialize pending files: {e}")))?;
        let mut put = Put::builder()
            .table_name(&self.table)
            .item("pk", s(pending_pk(&batch.source)))
            .item("sk", s(batch.key().sort_key()))
            .item("topic", s(&batch.source.topic))
            .item("partition", n(batch.source.partition))
            .item("first_offset", n(batch.first_offset))
            .item("last_offset", n(batch.last_offset))
            .item("created_at_ms", n(batch.created_at_ms))
            .item("files", s(files))
            .condition_expression("attribute_not_exists(pk)");
        if let Some(location) = &batch.files_location {
            put = put.item("files_location", s(location));
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
        match serde_json::from_str(get_s(item, "files").unwrap_or("[]")) {
            Ok(files) => page.batches.push(PendingBatch {
                last_offset: get_n(item, "last_offset").unwrap_or(key.first_offset),
                source: key.source,
                first_offset: key.first_offset,
                created_at_ms: key.created_at_ms,
                files,
                files_location: get_s(item, "files_location").map(str::to_string),
            }),
            Err(e) => page.unreadable.push((
                key,
                format!("DynamoDB table {}: file list is corrupt: {e}", self.table),
            )),
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

    /// Moves pending items of the pre-0.2 layout (under the checkpoint's `pk`) to the sharded
    /// layout, and rewrites a commit intent naming them. Returns the items moved.
    async fn move_legacy_pending(&self) -> Result<u64> {
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::Internal(format!("DynamoDB request: {e}"))
        };
        let mut moved: HashMap<(SourcePartition, i64), i64> = HashMap::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .filter_expression("begins_with(pk, :src) AND begins_with(sk, :p)")
                .expression_attribute_values(":src", s("source#"))
                .expression_attribute_values(":p", s("pending#"))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| state_error("upgrade layout", &self.table, SdkFault::from_sdk(&e)))?;
            for item in page.items() {
                let (Some(topic), Some(partition)) =
                    (get_s(item, "topic"), get_n(item, "partition"))
                else {
                    continue;
                };
                let key = BatchKey {
                    source: SourcePartition::new(topic, partition),
                    first_offset: get_n(item, "first_offset").unwrap_or(0),
                    created_at_ms: get_n(item, "created_at_ms").unwrap_or(0),
                };
                let mut new_item = item.clone();
                new_item.extend(pending_item_key(&key));
                let put = Put::builder()
                    .table_name(&self.table)
                    .set_item(Some(new_item))
                    .condition_expression("attribute_not_exists(pk)")
                    .build()
                    .map_err(build)?;
                if let Err(e) = self
                    .client
                    .transact_write_items()
                    .transact_items(TransactWriteItem::builder().put(put).build())
                    .send()
                    .await
                {
                    let canceled = matches!(
                        e.as_service_error(),
                        Some(TransactWriteItemsError::TransactionCanceledException(_))
                    );
                    if !canceled {
                        return Err(state_error(
                            "upgrade layout",
                            &self.table,
                            SdkFault::from_sdk(&e),
                        ));
                    }
                }
                let mut old_key = HashMap::new();
                for k in ["pk", "sk"] {
                    if let Some(v) = item.get(k) {
                        old_key.insert(k.to_string(), v.clone());
                    }
                }
                self.client
                    .delete_item()
                    .table_name(&self.table)
                    .set_key(Some(old_key))
                    .send()
                    .await
                    .map_err(|e| {
                        state_error("upgrade layout", &self.table, SdkFault::from_sdk(&e))
                    })?;
                moved.insert((key.source.clone(), key.first_offset), key.created_at_ms);
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        if let Some(mut intent) = self.commit_intent().await? {
            let mut changed = false;
            for b in &mut intent.batches {
                if b.created_at_ms == 0
                    && let Some(at) = moved.get(&(b.source.clone(), b.first_offset))
                {
                    b.created_at_ms = *at;
                    changed = true;
                }
            }
            if changed {
                self.put_intent(&intent, "id = :id").await?;
            }
        }
        Ok(moved.len() as u64)
    }
}

#[async_trait]
impl StateStore for DynamoStateStore {
    async fn checkpoint(&self, source: &SourcePartition) -> Result<Checkpoint> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(source_key(source)))
            .key("sk", s("checkpoint"))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| state_error("read checkpoint", &self.table, SdkFault::from_sdk(&e)))?;
        Ok(match out.item() {
            None => Checkpoint::INITIAL,
            Some(item) => Checkpoint {
                next_offset: get_n(item, "next_offset").unwrap_or(0),
                version: get_n(item, "version").unwrap_or(0),
            },
        })
    }

    async fn advance(
        &self,
        source: &SourcePartition,
        from: Checkpoint,
        to_next_offset: i64,
        batch: &PendingBatch,
    ) -> Result<Advance> {
        let pk = source_key(source);
        let next = Checkpoint {
            next_offset: to_next_offset,
            version: from.version + 1,
        };
        let mut update = Update::builder()
            .table_name(&self.table)
            .key("pk", s(&pk))
            .key("sk", s("checkpoint"))
            .update_expression(
                "SET next_offset = :next, version = :new, updated_at_ms = :now, topic = :topic, #p = :partition",
            )
            .expression_attribute_names("#p", "partition")
            .expression_attribute_values(":next", n(next.next_offset))
            .expression_attribute_values(":new", n(next.version))
            .expression_attribute_values(":now", n(batch.created_at_ms))
            .expression_attribute_values(":topic", s(&source.topic))
            .expression_attribute_values(":partition", n(source.partition));
        update = if from.version == 0 {
            update.condition_expression("attribute_not_exists(pk)")
        } else {
            update
                .condition_expression("version = :old")
                .expression_attribute_values(":old", n(from.version))
        };
        let put = self.pending_put(batch)?;
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::Internal(format!("DynamoDB request: {e}"))
        };
        let result = self
            .client
            .transact_write_items()
            .transact_items(
                TransactWriteItem::builder()
                    .update(update.build().map_err(build)?)
                    .build(),
            )
            .transact_items(
                TransactWriteItem::builder()
                    .put(put.build().map_err(build)?)
                    .build(),
            )
            .send()
            .await;
        match result {
            Ok(_) => Ok(Advance::Advanced(next)),
            Err(e) => {
                if let Some(TransactWriteItemsError::TransactionCanceledException(c)) =
                    e.as_service_error()
                {
                    let lost_race = c.cancellation_reasons().iter().any(|r| {
                        matches!(
                            r.code(),
                            Some("ConditionalCheckFailed" | "TransactionConflict")
                        )
                    });
                    if lost_race {
                        return Ok(Advance::Conflict);
                    }
                }
                Err(state_error(
                    "advance checkpoint",
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
        for chunk in keys.chunks(100) {
            let mut todo: Vec<HashMap<String, AttributeValue>> =
                chunk.iter().map(pending_item_key).collect();
            for attempt in 0..8u32 {
                if todo.is_empty() {
                    break;
                }
                if attempt > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(50 << attempt)).await;
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
                    .map_err(|e| {
                        state_error("read pending", &self.table, SdkFault::from_sdk(&e))
                    })?;
                for item in out
                    .responses()
                    .and_then(|r| r.get(&self.table))
                    .into_iter()
                    .flatten()
                {
                    self.read_item(item, &mut page);
                }
                todo = out
                    .unprocessed_keys()
                    .and_then(|m| m.get(&self.table))
                    .map(|k| k.keys().to_vec())
                    .unwrap_or_default();
            }
            if !todo.is_empty() {
                return Err(Error::State {
                    op: "read pending",
                    message: format!(
                        "DynamoDB table {}: {} reads stayed unprocessed",
                        self.table,
                        todo.len()
                    ),
                    retryable: true,
                });
            }
        }
        page.batches.sort_by_key(|b| b.key().sort_key());
        Ok(page)
    }

    async fn upgrade(&self, now_ms: i64) -> Result<u64> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s("meta"))
            .key("sk", s("layout"))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| state_error("read layout", &self.table, SdkFault::from_sdk(&e)))?;
        let since = match out.item() {
            Some(item) if get_n::<i64>(item, "version").unwrap_or(0) >= LAYOUT_VERSION => {
                get_n::<i64>(item, "since_ms").unwrap_or(0)
            }
            _ => {
                self.client
                    .put_item()
                    .table_name(&self.table)
                    .item("pk", s("meta"))
                    .item("sk", s("layout"))
                    .item("version", n(LAYOUT_VERSION))
                    .item("since_ms", n(now_ms))
                    .send()
                    .await
                    .map_err(|e| {
                        state_error("write layout", &self.table, SdkFault::from_sdk(&e))
                    })?;
                now_ms
            }
        };
        if now_ms - since > LEGACY_WINDOW_MS {
            return Ok(0);
        }
        let moved = self.move_legacy_pending().await?;
        if moved > 0 {
            tracing::info!(moved, "moved pending batches of the previous layout");
        }
        Ok(moved)
    }

    async fn try_lock(
        &self,
        name: &str,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool> {
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(format!("lock#{name}")))
            .item("sk", s("lock"))
            .item("holder", s(holder))
            .item("expires_at_ms", n(expires_at_ms))
            // DynamoDB's TTL removes forgotten locks eventually (seconds).
            .item("expires_at", n(expires_at_ms / 1000 + 86_400))
            .condition_expression(
                "attribute_not_exists(pk) OR expires_at_ms < :now OR holder = :holder",
            )
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":holder", s(holder))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.code.as_deref() == Some("ConditionalCheckFailedException") {
                    Ok(false)
                } else {
                    Err(state_error("take lock", &self.table, f))
                }
            }
        }
    }

    async fn unlock(&self, name: &str, holder: &str) -> Result<()> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(format!("lock#{name}")))
            .key("sk", s("lock"))
            .condition_expression("holder = :holder")
            .expression_attribute_values(":holder", s(holder))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.code.as_deref() == Some("ConditionalCheckFailedException") {
                    Ok(()) // taken over after expiry, or already released
                } else {
                    Err(state_error("release lock", &self.table, f))
                }
            }
        }
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
        let put = self.pending_put(batch)?.build().map_err(build)?;
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

    async fn commit_intent(&self) -> Result<Option<CommitIntent>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s("commit"))
            .key("sk", s("intent"))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| state_error("read commit intent", &self.table, SdkFault::from_sdk(&e)))?;
        let Some(item) = out.item() else {
            return Ok(None);
        };
        let id = get_s(item, "id").unwrap_or_default().to_string();
        let batches = serde_json::from_str(get_s(item, "batches").unwrap_or("[]"))
            .map_err(|e| self.corrupt(format!("commit intent {id} is corrupt: {e}")))?;
        Ok(Some(CommitIntent {
            id,
            created_at_ms: get_n(item, "created_at_ms").unwrap_or(0),
            batches,
        }))
    }

    async fn begin_commit(&self, intent: &CommitIntent) -> Result<bool> {
        self.put_intent(intent, "attribute_not_exists(pk)").await
    }

    async fn finish_commit(&self, intent: &CommitIntent) -> Result<()> {
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::Internal(format!("DynamoDB request: {e}"))
        };
        let mut requests = Vec::with_capacity(intent.batches.len());
        for b in &intent.batches {
            let delete = DeleteRequest::builder()
                .set_key(Some(pending_item_key(b)))
                .build()
                .map_err(build)?;
            requests.push(WriteRequest::builder().delete_request(delete).build());
        }
        for chunk in requests.chunks(25) {
            let mut todo = chunk.to_vec();
            for attempt in 0..8u32 {
                if todo.is_empty() {
                    break;
                }
                if attempt > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(50 << attempt)).await;
                }
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, todo.clone())
                    .send()
                    .await
                    .map_err(|e| {
                        state_error(
                            "remove pending batches",
                            &self.table,
                            SdkFault::from_sdk(&e),
                        )
                    })?;
                todo = out
                    .unprocessed_items()
                    .and_then(|m| m.get(&self.table))
                    .cloned()
                    .unwrap_or_default();
            }
            if !todo.is_empty() {
                return Err(Error::State {
                    op: "remove pending batches",
                    message: format!(
                        "DynamoDB table {}: {} deletes stayed unprocessed",
                        self.table,
                        todo.len()
                    ),
                    retryable: true,
                });
            }
        }
        let removed = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s("commit"))
            .key("sk", s("intent"))
            .condition_expression("id = :id")
            .expression_attribute_values(":id", s(&intent.id))
            .send()
            .await;
        match removed {
            Ok(_) => Ok(()),
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                // The SDK's repeat of a delete that succeeded: the intent is gone either way.
                if f.code.as_deref() == Some("ConditionalCheckFailedException")
                    && self
                        .commit_intent()
                        .await?
                        .is_none_or(|i| i.id != intent.id)
                {
                    Ok(())
                } else {
                    Err(state_error("remove commit intent", &self.table, f))
                }
            }
        }
    }
}
