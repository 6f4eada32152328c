//! The MSK event-source-mapping (ESM) event: what the ingest Lambda receives.
//!
//! ```json
//! {"eventSource": "aws:kafka", "eventSourceArn": "...", "bootstrapServers": "...",
//!  "records": {"orders-0": [{"topic": "orders", "partition": 0, "offset": 15,
//!    "timestamp": 1795939583239, "timestampType": "CREATE_TIME",
//!    "key": "<base64>", "value": "<base64>", "headers": []}]}}
//! ```
//!
//! A type of our own rather than `aws_lambda_events`' `KafkaEvent`, for two reasons. Exactness:
//! that type turns the record timestamp (epoch milliseconds) into a date through an `f64` and
//! truncates, so about half of all records (measured on current epoch values) land with
//! `kafka_timestamp` a millisecond early.
//! Speed: it allocates a map per header and a date per record, a third of the ingest CPU; this
//! one keeps the timestamp as the integer it is and skips headers, which no table stores.
//!
//! `partition` and `offset` are required: a record without them could not be checkpointed, and
//! defaulting them to 0 would make the record look like a duplicate and drop it silently.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One ESM invocation's payload: records grouped under `topic-partition` keys.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EsmEvent {
    #[serde(default)]
    /// `aws:kafka` (or `SelfManagedKafka`).
    pub event_source: Option<String>,
    #[serde(default)]
    /// The cluster's ARN.
    pub event_source_arn: Option<String>,
    #[serde(default)]
    /// The brokers the mapping read from.
    pub bootstrap_servers: Option<String>,
    #[serde(default)]
    /// Records under `topic-partition` keys.
    pub records: BTreeMap<String, Vec<EsmRecord>>,
}

/// One Kafka record as the ESM delivers it: key and value base64-encoded.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EsmRecord {
    #[serde(default)]
    /// The topic (the map key names it when absent).
    pub topic: Option<String>,
    /// The partition number.
    pub partition: i64,
    /// The record's offset in its partition.
    pub offset: i64,
    /// Epoch milliseconds (the record's CREATE_TIME or LOG_APPEND_TIME).
    #[serde(default)]
    pub timestamp: i64,
    #[serde(default)]
    /// `CREATE_TIME` or `LOG_APPEND_TIME`.
    pub timestamp_type: Option<String>,
    #[serde(default)]
    /// The key, base64; absent for a record without one.
    pub key: Option<String>,
    #[serde(default)]
    /// The value, base64; absent for a tombstone.
    pub value: Option<String>,
}

impl EsmEvent {
    /// Number of records in the event.
    pub fn len(&self) -> usize {
        self.records.values().map(Vec::len).sum()
    }

    /// Whether the event carries no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENT: &str = r#"{"eventSource":"aws:kafka","eventSourceArn":"arn:aws:kafka:x","bootstrapServers":"b:9098",
        "records":{"orders-3":[{"topic":"orders","partition":3,"offset":15,"timestamp":1796037119142,
        "timestampType":"CREATE_TIME","key":"azE=","value":"e30=",
        "headers":[{"h":[1,2]}]},{"topic":"orders","partition":3,"offset":16,"timestamp":1796037119999,
        "timestampType":"LOG_APPEND_TIME","key":null,"value":null,"headers":[]}]}}"#;

    #[test]
    fn timestamps_keep_every_millisecond_and_headers_are_skipped() {
        let event: EsmEvent = serde_json::from_str(EVENT).expect("parses");
        assert_eq!(event.len(), 2);
        let records = &event.records["orders-3"];
        assert_eq!(records[0].timestamp, 1_796_037_119_142);
        assert_eq!(records[1].timestamp, 1_796_037_119_999);
        assert_eq!(records[0].key.as_deref(), Some("azE="));
        assert_eq!(records[1].value, None);
        assert_eq!((records[0].partition, records[0].offset), (3, 15));
    }

    #[test]
    fn a_record_without_an_offset_is_refused_by_name() {
        let err = serde_json::from_str::<EsmEvent>(
            r#"{"records":{"orders-0":[{"topic":"orders","partition":0,"timestamp":1}]}}"#,
        )
        .expect_err("no offset");
        assert!(err.to_string().contains("missing field `offset`"), "{err}");
    }

    #[test]
    fn round_trips_through_json() {
        let event: EsmEvent = serde_json::from_str(EVENT).expect("parses");
        let again: EsmEvent =
            serde_json::from_str(&serde_json::to_string(&event).expect("serialises"))
                .expect("parses again");
        assert_eq!(event, again);
    }
}
