//! Checkpoints and pending batches in DynamoDB.
//!
//! One table with a string partition key `pk` and sort key `sk`:
//!
//! | item | pk | sk | attributes |
//! |---|---|---|---|
//! | checkpoint | `source#{topic}#{partition}` | `checkpoint` | `next_offset`, `version`, `updated_at_ms` |
//! | pending batch | `source#{topic}#{partition}` | `pending#{first offset, 20 digits}` | `first_offset`, `last_offset`, `created_at_ms`, `files` (JSON) |
//! | commit intent | `commit` | `intent` | `id`, `created_at_ms`, `batches` (JSON) |
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
    AttributeValue, DeleteRequest, Put, TransactWriteItem, Update, WriteRequest,
};

use crate::aws::SdkFault;
use crate::checkpoint::{
    Advance, Checkpoint, CommitIntent, PendingBatch, SourcePartition, StateStore,
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
        let files = serde_json::to_string(&batch.files)
            .map_err(|e| Error::Internal(format!("serialize pending files: {e}")))?;
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
        let mut put = Put::builder()
            .table_name(&self.table)
            .item("pk", s(&pk))
            .item("sk", s(format!("pending#{:020}", batch.first_offset)))
            .item("topic", s(&source.topic))
            .item("partition", n(source.partition))
            .item("first_offset", n(batch.first_offset))
            .item("last_offset", n(batch.last_offset))
            .item("created_at_ms", n(batch.created_at_ms))
            .item("files", s(files))
            .condition_expression("attribute_not_exists(pk)");
        if let Some(location) = &batch.files_location {
            put = put.item("files_location", s(location));
        }
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

    async fn pending(&self) -> Result<Vec<PendingBatch>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .filter_expression("begins_with(sk, :p)")
                .expression_attribute_values(":p", s("pending#"))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| state_error("read pending", &self.table, SdkFault::from_sdk(&e)))?;
            for item in page.items() {
                let topic = get_s(item, "topic")
                    .ok_or_else(|| self.corrupt("pending item without topic".into()))?;
                let partition = get_n(item, "partition")
                    .ok_or_else(|| self.corrupt("pending item without partition".into()))?;
                let source = SourcePartition::new(topic, partition);
                let first_offset = get_n(item, "first_offset").unwrap_or(0);
                let files = get_s(item, "files").unwrap_or("[]");
                let files = serde_json::from_str(files).map_err(|e| {
                    self.corrupt(format!(
                        "pending batch {source}@{first_offset} is corrupt: {e}"
                    ))
                })?;
                out.push(PendingBatch {
                    source,
                    first_offset,
                    last_offset: get_n(item, "last_offset").unwrap_or(first_offset),
                    created_at_ms: get_n(item, "created_at_ms").unwrap_or(0),
                    files,
                    files_location: get_s(item, "files_location").map(str::to_string),
                });
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        out.sort_by(|a, b| (&a.source, a.first_offset).cmp(&(&b.source, b.first_offset)));
        Ok(out)
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
        let batches = serde_json::to_string(&intent.batches)
            .map_err(|e| Error::Internal(format!("serialize commit intent: {e}")))?;
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s("commit"))
            .item("sk", s("intent"))
            .item("id", s(&intent.id))
            .item("created_at_ms", n(intent.created_at_ms))
            .item("batches", s(batches))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match result {
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

    async fn finish_commit(&self, intent: &CommitIntent) -> Result<()> {
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::Internal(format!("DynamoDB request: {e}"))
        };
        let mut requests = Vec::with_capacity(intent.batches.len());
        for b in &intent.batches {
            let delete = DeleteRequest::builder()
                .key("pk", s(source_key(&b.source)))
                .key("sk", s(format!("pending#{:020}", b.first_offset)))
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
        self.client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s("commit"))
            .key("sk", s("intent"))
            .condition_expression("id = :id")
            .expression_attribute_values(":id", s(&intent.id))
            .send()
            .await
            .map_err(|e| {
                state_error("remove commit intent", &self.table, SdkFault::from_sdk(&e))
            })?;
        Ok(())
    }
}
