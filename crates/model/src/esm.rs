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
//! one keeps the timestamp as the integer it is, and headers as one list of key and bytes
//! (nothing allocated for a record without headers).
//!
//! Headers come as AWS sends them: a list of one-entry objects, the header's key naming an
//! array of its value's bytes (`"headers":[{"source":[119,101,98]}]`), a key repeated as often
//! as the record repeats it. Bytes are read as 0..=255 or as Java's signed -128..=127; a null
//! value is a header without a value.
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
    #[serde(
        default,
        deserialize_with = "headers",
        skip_serializing_if = "Vec::is_empty"
    )]
    /// The record's headers, in the record's order (keys may repeat).
    pub headers: Vec<EsmHeader>,
}

/// One Kafka record header.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EsmHeader {
    /// The header's key.
    pub key: String,
    /// The header's value; `None` for a header without one.
    pub value: Option<Vec<u8>>,
}

impl Serialize for EsmHeader {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry(&self.key, &self.value)?;
        map.end()
    }
}

/// A header object: each entry is one header (AWS sends one entry per object).
struct HeaderObject(Vec<EsmHeader>);

/// A header value: an array of bytes (unsigned or Java's signed), null, or a string.
struct HeaderBytes(Option<Vec<u8>>);

impl<'de> Deserialize<'de> for HeaderBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = HeaderBytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a header value: an array of bytes, a string or null")
            }
            fn visit_unit<E>(self) -> Result<HeaderBytes, E> {
                Ok(HeaderBytes(None))
            }
            fn visit_none<E>(self) -> Result<HeaderBytes, E> {
                Ok(HeaderBytes(None))
            }
            fn visit_some<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<HeaderBytes, D::Error> {
                d.deserialize_any(V)
            }
            fn visit_str<E>(self, v: &str) -> Result<HeaderBytes, E> {
                Ok(HeaderBytes(Some(v.as_bytes().to_vec())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<HeaderBytes, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(n) = seq.next_element::<i64>()? {
                    let byte = match n {
                        0..=255 => n as u8,
                        -128..=-1 => (n + 256) as u8,
                        _ => {
                            return Err(serde::de::Error::custom(format!(
                                "header byte {n} is outside -128..=255"
                            )));
                        }
                    };
                    out.push(byte);
                }
                Ok(HeaderBytes(Some(out)))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for HeaderObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = HeaderObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a header object {\"key\": [bytes]}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<HeaderObject, A::Error> {
                let mut out = Vec::with_capacity(1);
                while let Some((key, value)) = map.next_entry::<String, HeaderBytes>()? {
                    out.push(EsmHeader {
                        key,
                        value: value.0,
                    });
                }
                Ok(HeaderObject(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The `headers` field: a list of header objects (null as none), flattened in order.
fn headers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<EsmHeader>, D::Error> {
    let objects: Option<Vec<HeaderObject>> = Deserialize::deserialize(d)?;
    Ok(objects
        .unwrap_or_default()
        .into_iter()
        .flat_map(|o| o.0)
        .collect())
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
    fn headers_keep_their_order_repeats_and_bytes() {
        let event: EsmEvent = serde_json::from_str(
            r#"{"records":{"t-0":[{"partition":0,"offset":1,"headers":[
            {"trace":[104,105]},{"trace":[-1,0,255]},{"empty":[]},{"none":null},
            {"a":[1],"b":[2]}]},{"partition":0,"offset":2,"headers":null},
            {"partition":0,"offset":3}]}}"#,
        )
        .expect("parses");
        let records = &event.records["t-0"];
        let h = &records[0].headers;
        let keys: Vec<&str> = h.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(keys, ["trace", "trace", "empty", "none", "a", "b"]);
        assert_eq!(h[0].value.as_deref(), Some(&b"hi"[..]));
        assert_eq!(h[1].value.as_deref(), Some(&[255, 0, 255][..]));
        assert_eq!(h[2].value.as_deref(), Some(&[][..]));
        assert_eq!(h[3].value, None);
        assert!(records[1].headers.is_empty() && records[2].headers.is_empty());
        let again: EsmEvent =
            serde_json::from_str(&serde_json::to_string(&event).expect("serialises"))
                .expect("parses again");
        assert_eq!(again, event);
        let err = serde_json::from_str::<EsmEvent>(
            r#"{"records":{"t-0":[{"partition":0,"offset":1,"headers":[{"k":[256]}]}]}}"#,
        )
        .expect_err("not a byte");
        assert!(err.to_string().contains("header byte 256"), "{err}");
    }

    #[test]
    fn timestamps_keep_every_millisecond_and_headers_are_read() {
        let event: EsmEvent = serde_json::from_str(EVENT).expect("parses");
        assert_eq!(event.len(), 2);
        let records = &event.records["orders-3"];
        assert_eq!(records[0].timestamp, 1_796_037_119_142);
        assert_eq!(records[1].timestamp, 1_796_037_119_999);
        assert_eq!(records[0].key.as_deref(), Some("azE="));
        assert_eq!(records[1].value, None);
        assert_eq!((records[0].partition, records[0].offset), (3, 15));
        assert_eq!(records[0].headers.len(), 1);
        assert_eq!(records[0].headers[0].value.as_deref(), Some(&[1, 2][..]));
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
