//! The pre-0.2 layout of pending batches (under the checkpoint's `pk`), moved to the sharded
//! one: for an hour after an upgrade, so that invocations of the old release still in flight
//! are caught too.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

use super::{
    DynamoStateStore, LAYOUT_VERSION, LEGACY_WINDOW_MS, get_n, get_s, n, pending_item_key, s,
    state_error,
};
use crate::aws::SdkFault;
use crate::checkpoint::{BatchKey, SourcePartition};
use crate::error::{Error, Result};
use crate::store::{CommitLog, StateStore};

impl DynamoStateStore {
    /// The layout item's `bodies` this store's upgrade keeps.
    fn body_layout(&self) -> i64 {
        self.body_layout
    }

    async fn write_layout(&self, since_ms: i64, synced: bool) -> Result<()> {
        self.client
            .put_item()
            .table_name(&self.table)
            .item("pk", s("meta"))
            .item("sk", s("layout"))
            .item("version", n(LAYOUT_VERSION))
            .item("since_ms", n(since_ms))
            .item("synced", AttributeValue::Bool(synced))
            .item("bodies", n(self.body_layout()))
            .send()
            .await
            .map_err(|e| state_error("write layout", &self.table, SdkFault::from_sdk(&e)))?;
        Ok(())
    }

    /// The per-partition checkpoints of releases before 0.3: (source, next offset); only
    /// whether there is one when `first_only`.
    async fn legacy_checkpoints_scan(
        &self,
        first_only: bool,
    ) -> Result<Vec<(SourcePartition, i64)>> {
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .filter_expression("begins_with(pk, :src) AND sk = :cp")
                .expression_attribute_values(":src", s("source#"))
                .expression_attribute_values(":cp", s("checkpoint"))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| state_error("upgrade layout", &self.table, SdkFault::from_sdk(&e)))?;
            for item in page.items() {
                let Some(rest) = get_s(item, "pk").and_then(|pk| pk.strip_prefix("source#")) else {
                    continue;
                };
                let Some((topic, partition)) = rest.rsplit_once('#') else {
                    continue;
                };
                let Ok(partition) = partition.parse::<i32>() else {
                    continue;
                };
                found.push((
                    SourcePartition::new(topic, partition),
                    get_n(item, "next_offset").unwrap_or(0),
                ));
                if first_only {
                    return Ok(found);
                }
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(found),
            }
        }
    }

    /// Copies every per-partition checkpoint into its bucket where the bucket is behind.
    async fn copy_legacy_checkpoints(&self) -> Result<u64> {
        let mut copied = 0;
        for (source, next) in self.legacy_checkpoints_scan(false).await? {
            self.create_buckets(&[super::buckets::bucket_key(&source)])
                .await?;
            if self.raise_entry(&source, next).await? {
                copied += 1;
            }
        }
        Ok(copied)
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
    async fn put_status(&self, key: &str, json: &str) -> Result<()> {
        self.client
            .put_item()
            .table_name(&self.table)
            .item("pk", s("status"))
            .item("sk", s(key))
            .item("value", s(json))
            .send()
            .await
            .map_err(|e| state_error("write status", &self.table, SdkFault::from_sdk(&e)))?;
        Ok(())
    }

    async fn status(&self, key: &str) -> Result<Option<String>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s("status"))
            .key("sk", s(key))
            .send()
            .await
            .map_err(|e| state_error("read status", &self.table, SdkFault::from_sdk(&e)))?;
        Ok(out
            .item()
            .and_then(|i| get_s(i, "value"))
            .map(str::to_string))
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
        let (since, synced) = match out.item() {
            Some(item) if get_n::<i64>(item, "version").unwrap_or(0) >= LAYOUT_VERSION => {
                if get_n::<i64>(item, "bodies").unwrap_or(0) != self.body_layout() {
                    // This release's commit stage is running: ingest may write bodies it reads
                    // (or, before a rollback, must not).
                    self.client
                        .update_item()
                        .table_name(&self.table)
                        .key("pk", s("meta"))
                        .key("sk", s("layout"))
                        .update_expression("SET bodies = :b")
                        .expression_attribute_values(":b", n(self.body_layout()))
                        .send()
                        .await
                        .map_err(|e| {
                            state_error("write layout", &self.table, SdkFault::from_sdk(&e))
                        })?;
                }
                (
                    get_n::<i64>(item, "since_ms").unwrap_or(0),
                    item.get("synced").and_then(|v| v.as_bool().ok()).copied() == Some(true),
                )
            }
            _ => {
                // Per-partition checkpoints of an earlier release stay the authority until no
                // invocation of that release can run any more; a table without any is in the
                // bucket layout at once.
                let synced = self.legacy_checkpoints_scan(true).await?.is_empty();
                self.write_layout(now_ms, synced).await?;
                (now_ms, synced)
            }
        };
        let mut changed = 0;
        if !synced && now_ms - since > LEGACY_WINDOW_MS {
            changed += self.copy_legacy_checkpoints().await?;
            self.write_layout(since, true).await?;
            tracing::info!(
                copied = changed,
                "checkpoints of the previous layout copied into buckets"
            );
        }
        if now_ms - since > LEGACY_WINDOW_MS {
            return Ok(changed);
        }
        let moved = self.move_legacy_pending().await?;
        if moved > 0 {
            tracing::info!(moved, "moved pending batches of the previous layout");
        }
        Ok(changed + moved)
    }
}
