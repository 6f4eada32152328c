//! Commit intents and lock leases in DynamoDB.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{DeleteRequest, WriteRequest};

use super::{DynamoStateStore, get_n, get_s, n, pending_item_key, s, state_error};
use crate::aws::SdkFault;
use crate::error::{Error, Result};
use crate::store::{CommitIntent, CommitLog, Locks};

#[async_trait]
impl CommitLog for DynamoStateStore {
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

#[async_trait]
impl Locks for DynamoStateStore {
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
}
