//! The Debezium change event envelope (`envelope = "debezium"` on an upsert table), as the
//! Kafka Connect JSON converter writes it (Avro behind a registry: [`super::avro`], by the same
//! rules), with or without schemas (`{"schema": …, "payload":
//! {…}}` or the payload alone). Follows the envelope of Debezium 2.x and 3.x (`before`, `after`,
//! `source`, `op`, `ts_ms`; "Debezium connector for PostgreSQL — Data change events").
//!
//! - `op` `c` (create), `u` (update) and `r` (a snapshot read) make `after` the key's row: its
//!   fields are the columns, and three more members are readable by `path`: `$.__op` (the
//!   operation), `$.__ts_ms` (when the connector processed it) and `$.__source` (the envelope's
//!   `source`: `$.__source.lsn`, `$.__source.ts_ms`, `$.__source.file`, … — the position in the
//!   source database, kept as a column).
//! - `op` `d` deletes the key: the key's columns are read from `before` (or, when `before` is
//!   null, from the Kafka key).
//! - Anything else (`t`, a truncate; `m`, a message; no `op`) is refused with the reason.

use serde_json::Value;

use super::{RejectKind, Rejection};

/// What a change event asks of the table.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The key's row is now this JSON object (`after`, with `__op`, `__ts_ms`, `__source`).
    Upsert(String),
    /// The key is deleted; its columns are in this JSON object (`before`), or in the Kafka key
    /// when `None`.
    Delete(Option<String>),
}

/// Debezium's placeholder for a value the source did not send (its default
/// `unavailable.value.placeholder`).
pub(crate) const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// What an event's `op` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `c`, `u` or `r`: `after` is the key's row.
    Row,
    /// `d`: the key is deleted.
    Delete,
}

/// What `op` asks for, or why it is no change of a row.
pub(crate) fn op(op: &str) -> Result<Op, Rejection> {
    match op {
        "c" | "u" | "r" => Ok(Op::Row),
        "d" => Ok(Op::Delete),
        "t" => Err(refuse(
            "a truncate (op \"t\") is not applied: the table keeps its rows; delete them with a SQL DELETE if the source table was emptied",
        )),
        other => Err(refuse(format!(
            "op {other:?} is not a change of a row (c, u, r or d)"
        ))),
    }
}

/// The refusal of an event without an `op`.
pub(crate) fn no_op() -> Rejection {
    refuse("it has no op; is the topic written by Debezium?")
}

/// The refusal of an update whose `field` holds the placeholder of a value the source did not
/// send.
pub(crate) fn unavailable(field: &str) -> Rejection {
    refuse(format!(
        "after.{field} is {UNAVAILABLE:?} (the source did not send the unchanged value); set REPLICA IDENTITY FULL on the source table"
    ))
}

pub(crate) fn refuse(why: impl Into<String>) -> Rejection {
    Rejection::new(
        RejectKind::Envelope,
        format!("Debezium change event: {}", why.into()),
    )
}

/// Reads a Debezium change event (UTF-8 JSON).
pub fn change(value: &[u8]) -> Result<Change, Rejection> {
    if let Some(framed) = super::framing::not_json_but_framed(value) {
        return Err(framed);
    }
    let text = std::str::from_utf8(value)
        .map_err(|e| Rejection::new(RejectKind::InvalidUtf8, format!("value is not UTF-8: {e}")))?;
    let parsed: Value = serde_json::from_str(text)
        .map_err(|e| Rejection::new(RejectKind::NotJson, format!("value is not JSON: {e}")))?;
    let Value::Object(mut event) = parsed else {
        return Err(Rejection::new(
            RejectKind::NotAnObject,
            "value is JSON but not an object",
        ));
    };
    // The JSON converter with schemas: the event is the payload.
    if event.contains_key("schema")
        && let Some(Value::Object(payload)) = event.remove("payload")
    {
        event = payload;
    }
    let op = match event.get("op") {
        Some(Value::String(op)) => op.clone(),
        Some(other) => return Err(refuse(format!("op is {other}, not a string"))),
        None => return Err(no_op()),
    };
    match self::op(&op)? {
        Op::Row => {
            let Some(Value::Object(mut after)) = event.remove("after") else {
                return Err(refuse(format!("op {op:?} without an after object")));
            };
            if let Some(name) = ["__op", "__ts_ms", "__source"]
                .into_iter()
                .find(|n| after.contains_key(*n))
            {
                return Err(refuse(format!(
                    "after has a field {name}, the name this envelope gives the event's own {}; rename the source column",
                    &name[2..]
                )));
            }
            // PostgreSQL leaves an unchanged TOASTed value out of an update unless the table's
            // REPLICA IDENTITY is FULL: Debezium puts a placeholder, which would replace the value.
            if let Some((name, _)) = after.iter().find(|(_, v)| v.as_str() == Some(UNAVAILABLE)) {
                return Err(unavailable(name));
            }
            after.insert("__op".into(), Value::String(op));
            for (from, to) in [("ts_ms", "__ts_ms"), ("source", "__source")] {
                if let Some(v) = event.remove(from) {
                    after.insert(to.into(), v);
                }
            }
            Ok(Change::Upsert(Value::Object(after).to_string()))
        }
        Op::Delete => match event.remove("before") {
            Some(Value::Object(before)) => {
                Ok(Change::Delete(Some(Value::Object(before).to_string())))
            }
            Some(Value::Null) | None => Ok(Change::Delete(None)),
            Some(other) => Err(refuse(format!("before is {other}, not an object"))),
        },
    }
}

/// A key object as Kafka Connect's JSON converter writes it (`{"schema": {"type": …}, "payload":
/// …}`) without its schema; any other JSON as it is.
pub fn key_payload(key: Value) -> Value {
    match key {
        Value::Object(mut m)
            if m.len() == 2
                && m.contains_key("payload")
                && m.get("schema").is_some_and(|s| s.get("type").is_some()) =>
        {
            m.remove("payload").unwrap_or(Value::Null)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PostgreSQL connector's create event of the Debezium documentation (2.7), with the
    /// JSON converter's schemas (abridged to the fields the payload has).
    const CREATE_WITH_SCHEMA: &str = r#"{
      "schema": {"type": "struct", "optional": false, "name": "PostgreSQL_server.inventory.customers.Envelope",
                 "fields": [{"type": "struct", "field": "before"}, {"type": "struct", "field": "after"},
                            {"type": "struct", "field": "source"}, {"type": "string", "field": "op"},
                            {"type": "int64", "field": "ts_ms"}]},
      "payload": {
        "before": null,
        "after": {"id": 1, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"},
        "source": {"version": "2.7.0.Final", "connector": "postgresql", "name": "PostgreSQL_server",
                   "ts_ms": 1559033904863, "snapshot": true, "db": "postgres", "sequence": "[\"24023119\",\"24023128\"]",
                   "schema": "public", "table": "customers", "txId": 555, "lsn": 24023128, "xmin": null},
        "op": "c",
        "ts_ms": 1559033904863
      }
    }"#;

    /// The same connector's delete event, without schemas.
    const DELETE: &str = r#"{
        "before": {"id": 1, "first_name": null, "last_name": null, "email": null},
        "after": null,
        "source": {"version": "2.7.0.Final", "connector": "postgresql", "name": "PostgreSQL_server",
                   "ts_ms": 1559033904863, "snapshot": false, "db": "postgres", "schema": "public",
                   "table": "customers", "txId": 556, "lsn": 46523128, "xmin": null},
        "op": "d",
        "ts_ms": 1465581902461
    }"#;

    #[test]
    fn a_create_is_its_after_with_the_source_position() {
        let Change::Upsert(row) = change(CREATE_WITH_SCHEMA.as_bytes()).expect("create") else {
            panic!("not an upsert");
        };
        let row: Value = serde_json::from_str(&row).expect("json");
        assert_eq!(row["id"], 1);
        assert_eq!(row["email"], "annek@noanswer.org");
        assert_eq!(row["__op"], "c");
        assert_eq!(row["__source"]["lsn"], 24023128);
        assert_eq!(row["__ts_ms"], 1559033904863i64);
    }

    #[test]
    fn a_delete_names_its_key_by_before_or_by_the_kafka_key() {
        let Change::Delete(Some(before)) = change(DELETE.as_bytes()).expect("delete") else {
            panic!("not a delete");
        };
        let before: Value = serde_json::from_str(&before).expect("json");
        assert_eq!(before["id"], 1);
        let no_before = DELETE.replace(
            r#""before": {"id": 1, "first_name": null, "last_name": null, "email": null}"#,
            r#""before": null"#,
        );
        assert_eq!(change(no_before.as_bytes()), Ok(Change::Delete(None)));
        let key: Value = serde_json::from_str(
            r#"{"schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]}, "payload": {"id": 1}}"#,
        )
        .expect("key");
        assert_eq!(key_payload(key), serde_json::json!({"id": 1}));
        // A key whose columns are named schema and payload is a key.
        let real = serde_json::json!({"schema": "public", "payload": "x"});
        assert_eq!(key_payload(real.clone()), real);
    }

    #[test]
    fn what_is_no_change_of_a_row_is_refused_saying_why() {
        for (event, why) in [
            (r#"{"op": "t", "before": null, "after": null}"#, "truncate"),
            (r#"{"op": "m", "message": {}}"#, "not a change of a row"),
            (r#"{"id": 1}"#, "no op"),
            (r#"{"op": "u", "after": null}"#, "without an after"),
            (r#"{"op": 5}"#, "not a string"),
            (
                r#"{"op": "u", "after": {"id": 1, "__op": "x"}}"#,
                "rename the source column",
            ),
            (
                r#"{"op": "u", "after": {"id": 1, "bio": "__debezium_unavailable_value"}}"#,
                "REPLICA IDENTITY FULL",
            ),
        ] {
            let err = change(event.as_bytes()).expect_err(event);
            assert_eq!(err.kind, RejectKind::Envelope, "{event}");
            assert!(err.message.contains(why), "{event}: {}", err.message);
        }
        assert_eq!(
            change(b"[1]").expect_err("array").kind,
            RejectKind::NotAnObject
        );
        assert_eq!(change(b"{").expect_err("cut").kind, RejectKind::NotJson);
    }
}
