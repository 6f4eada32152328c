//! The state of a partition's stateful derived tables: one item per partition
//! (`state#{topic}#{partition}`, sk `state`) with the checkpoint's next offset it goes with, a
//! sequence number every write is conditioned on, and the encoded state (`body`, binary) or,
//! past ~300 KB, the location of the object holding it. Written in the advance's transaction.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

use super::{DynamoStateStore, get_n, get_s, n, s};
use crate::checkpoint::{SourcePartition, StoredState};
use crate::error::{Error, Result};

fn key(source: &SourcePartition) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (
            "pk".to_string(),
            s(format!("state#{}#{}", source.topic, source.partition)),
        ),
        ("sk".to_string(), s("state")),
    ])
}

impl DynamoStateStore {
    /// The stored states of `sources`, in their order.
    pub(super) async fn read_states(
        &self,
        sources: &[SourcePartition],
    ) -> Result<Vec<Option<StoredState>>> {
        let items = self
            .get_items(sources.iter().map(key).collect(), "read partition state")
            .await?;
        let mut by_pk: HashMap<String, StoredState> = HashMap::new();
        for item in items {
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
            by_pk.insert(
                pk.to_string(),
                StoredState {
                    next_offset,
                    seq,
                    body: item
                        .get("body")
                        .and_then(|b| b.as_b().ok())
                        .map(|b| b.as_ref().to_vec()),
                    location: get_s(&item, "location").map(str::to_string),
                    bytes: get_n(&item, "bytes").unwrap_or(0),
                    updated_at_ms: get_n(&item, "updated_at_ms").unwrap_or(0),
                },
            );
        }
        Ok(sources
            .iter()
            .map(|src| by_pk.remove(&format!("state#{}#{}", src.topic, src.partition)))
            .collect())
    }

    /// The transaction item writing `state` for `source`, if the stored one is at `seq - 1`.
    pub(super) fn state_put(
        &self,
        source: &SourcePartition,
        state: &StoredState,
    ) -> Result<TransactWriteItem> {
        let mut put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(key(source)))
            .item("next", n(state.next_offset))
            .item("seq", n(state.seq))
            .item("bytes", n(state.bytes))
            .item("updated_at_ms", n(state.updated_at_ms));
        if let Some(body) = &state.body {
            put = put.item("body", AttributeValue::B(Blob::new(body.clone())));
        }
        if let Some(location) = &state.location {
            put = put.item("location", s(location.clone()));
        }
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
}
