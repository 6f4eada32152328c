//! Decoding: one Kafka record's bytes to one typed row, or a reason to reject it.
//!
//! A record is rejected — never dropped — when its value is absent (tombstone), empty, over the
//! size limit, not UTF-8, not JSON, not a JSON object, or when a column is missing, of the wrong
//! type, out of range or an unparseable timestamp. The [`RejectKind`] and a message naming the
//! column and its JSON path go to the dead-letter table with the raw bytes.

pub mod avro;
mod builders;
pub mod debezium;
pub mod framing;
mod json;
pub mod protobuf;
pub mod value;

use std::fmt;

use serde::de::DeserializeSeed;
use serde_json::value::RawValue;

pub use builders::{DeadLetter, DeadLetterBuilder, RowBuilder};
use json::{Mismatch, Node, ObjectSeed};
pub use value::Cell;

use crate::spec::{ColumnType, TableSpec};

/// Why a record went to the dead-letter table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectKind {
    /// The key or value is not valid base64.
    InvalidBase64,
    /// The value is absent (a Kafka tombstone).
    Tombstone,
    /// The value is empty.
    EmptyValue,
    /// The value is larger than `max_record_bytes`.
    Oversize,
    /// The key or value is not valid UTF-8.
    InvalidUtf8,
    /// The value is not JSON.
    NotJson,
    /// The value is JSON but not an object.
    NotAnObject,
    /// A column's value has the wrong JSON type.
    WrongType,
    /// A required column is absent or null.
    MissingField,
    /// A timestamp or date column's value cannot be read.
    InvalidTimestamp,
    /// A number does not fit its column (or has too many decimal places).
    OutOfRange,
    /// The record's topic feeds no table in the pipeline spec.
    UnknownTopic,
    /// The record decoded, but a derived table's SQL failed on it (the message names the table).
    Transform,
    /// The record came later than a window's allowed lateness: the window's result was final
    /// (the message names the table, the window and the watermark).
    Late,
    /// The record's event time is further ahead of its Kafka timestamp than the table's
    /// `max_event_time_ahead`: a stateful table does not believe it (it would move the
    /// watermark there); the topic's own table keeps it.
    Future,
    /// An Avro topic's value has no schema registry header (Confluent or Glue).
    NoSchemaId,
    /// The value's schema id is not in the registry (or its schema cannot be read).
    UnknownSchema,
    /// The value's body does not follow the schema its header names.
    SchemaMismatch,
    /// A change event (`envelope = "debezium"`) that is no change of a row, or lacks its row.
    Envelope,
}

impl RejectKind {
    /// Every kind, for documentation and tests.
    pub const ALL: [RejectKind; 19] = [
        RejectKind::InvalidBase64,
        RejectKind::Tombstone,
        RejectKind::EmptyValue,
        RejectKind::Oversize,
        RejectKind::InvalidUtf8,
        RejectKind::NotJson,
        RejectKind::NotAnObject,
        RejectKind::WrongType,
        RejectKind::MissingField,
        RejectKind::InvalidTimestamp,
        RejectKind::OutOfRange,
        RejectKind::UnknownTopic,
        RejectKind::Transform,
        RejectKind::Late,
        RejectKind::Future,
        RejectKind::NoSchemaId,
        RejectKind::UnknownSchema,
        RejectKind::SchemaMismatch,
        RejectKind::Envelope,
    ];

    /// The value stored in the `error_kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectKind::InvalidBase64 => "invalid_base64",
            RejectKind::Tombstone => "tombstone",
            RejectKind::EmptyValue => "empty_value",
            RejectKind::Oversize => "oversize",
            RejectKind::InvalidUtf8 => "invalid_utf8",
            RejectKind::NotJson => "not_json",
            RejectKind::NotAnObject => "not_an_object",
            RejectKind::WrongType => "wrong_type",
            RejectKind::MissingField => "missing_field",
            RejectKind::InvalidTimestamp => "invalid_timestamp",
            RejectKind::OutOfRange => "out_of_range",
            RejectKind::UnknownTopic => "unknown_topic",
            RejectKind::Transform => "transform",
            RejectKind::Late => "late",
            RejectKind::Future => "future",
            RejectKind::NoSchemaId => "no_schema_id",
            RejectKind::UnknownSchema => "unknown_schema",
            RejectKind::SchemaMismatch => "schema_mismatch",
            RejectKind::Envelope => "envelope",
        }
    }
}

impl fmt::Display for RejectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected record's kind and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The kind, stored in `error_kind`.
    pub kind: RejectKind,
    /// The message, stored in `error_message`.
    pub message: String,
}

impl Rejection {
    /// A rejection of `kind` with `message`.
    pub fn new(kind: RejectKind, message: impl Into<String>) -> Self {
        Rejection {
            kind,
            message: message.into(),
        }
    }
}

/// Column facts the decoder needs, in spec order.
#[derive(Debug)]
struct Column {
    name: String,
    path: String,
    column_type: ColumnType,
    required: bool,
    slot: usize,
}

/// Decodes one topic's record values, in the topic's format.
#[derive(Debug)]
pub enum Decoder {
    /// JSON objects.
    Json(RecordDecoder),
    /// Registry-framed Avro.
    Avro(avro::AvroDecoder),
    /// Registry-framed Protobuf.
    Protobuf(protobuf::ProtobufDecoder),
}

/// A decoder whose writer schemas come from a schema registry, added before decoding.
pub trait RegistryDecoder: Send + Sync {
    /// Whether the schema `id` has been added.
    fn knows(&self, id: &framing::SchemaId) -> bool;
    /// Adds the schema `id` as the registry returned it (`kind`: `AVRO`, `PROTOBUF`, …). A schema
    /// of another kind, or one that cannot be read, is kept as such: its records are dead letters
    /// that say why.
    fn add_schema(&self, id: framing::SchemaId, kind: &str, text: &str);
    /// Records that the registry does not have `id`, and why.
    fn add_missing(&self, id: framing::SchemaId, reason: String);
    /// Whether the registry lacked `id` at an earlier lookup ([`Self::add_missing`]).
    fn was_missing(&self, id: &framing::SchemaId) -> bool;
}

impl Decoder {
    /// The decoder of `table`'s format.
    pub fn new(table: &TableSpec) -> Decoder {
        match table.format {
            crate::spec::Format::Json => Decoder::Json(RecordDecoder::new(table)),
            crate::spec::Format::Avro => Decoder::Avro(avro::AvroDecoder::new(table)),
            crate::spec::Format::Protobuf => {
                Decoder::Protobuf(protobuf::ProtobufDecoder::new(table))
            }
        }
    }

    /// The registry side of a registry format's decoder.
    pub fn registry(&self) -> Option<&dyn RegistryDecoder> {
        match self {
            Decoder::Json(_) => None,
            Decoder::Avro(d) => Some(d),
            Decoder::Protobuf(d) => Some(d),
        }
    }

    /// Decodes one value (already size-checked) into its cells, one per column in spec order.
    pub fn decode<'a>(
        &self,
        value: &'a [u8],
        scratch: &'a mut Vec<u8>,
        max_bytes: usize,
    ) -> Result<Vec<Cell<'a>>, Rejection> {
        match self {
            Decoder::Json(d) => {
                if let Some(framed) = framing::not_json_but_framed(value) {
                    return Err(framed);
                }
                let json = std::str::from_utf8(value).map_err(|e| {
                    Rejection::new(RejectKind::InvalidUtf8, format!("value is not UTF-8: {e}"))
                })?;
                d.decode(json)
            }
            Decoder::Avro(d) => d.decode(value, scratch, max_bytes),
            Decoder::Protobuf(d) => d.decode(value, scratch, max_bytes),
        }
    }
}

/// Decodes JSON record values for one table.
#[derive(Debug)]
pub struct RecordDecoder {
    tree: Node,
    columns: Vec<Column>,
    slots: usize,
}

impl RecordDecoder {
    /// A decoder for the table's columns.
    pub fn new(table: &TableSpec) -> RecordDecoder {
        let leaves = table.leaves();
        let paths: Vec<_> = leaves.iter().map(|c| &c.path).collect();
        let (tree, slot_of, slots) = Node::build(&paths);
        let columns = leaves
            .iter()
            .zip(slot_of)
            .map(|(c, slot)| Column {
                name: c.name.clone(),
                path: c.path.to_string(),
                column_type: c.column_type,
                required: c.required,
                slot,
            })
            .collect();
        RecordDecoder {
            tree,
            columns,
            slots,
        }
    }

    /// Each column's type and whether it is required, in spec order.
    pub fn column_types(&self) -> impl Iterator<Item = (ColumnType, bool)> + '_ {
        self.columns.iter().map(|c| (c.column_type, c.required))
    }

    /// Number of columns a decoded row has.
    pub fn width(&self) -> usize {
        self.columns.len()
    }

    /// Decodes one JSON object into its cells, one per column in spec order.
    pub fn decode<'a>(&self, json: &'a str) -> Result<Vec<Cell<'a>>, Rejection> {
        let mut raws: Vec<Option<&'a RawValue>> = vec![None; self.slots];
        let mut mismatch = None;
        let mut de = serde_json::Deserializer::from_str(json);
        ObjectSeed {
            node: &self.tree,
            slots: &mut raws,
            mismatch: &mut mismatch,
        }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| Rejection::new(RejectKind::NotJson, format!("value is not JSON: {e}")))?;
        if let Some(Mismatch { path, found }) = mismatch {
            if path == "$" {
                return Err(Rejection::new(
                    RejectKind::NotAnObject,
                    format!("value is {found}, not a JSON object"),
                ));
            }
            let names: Vec<_> = self
                .columns
                .iter()
                .filter(|c| c.path.starts_with(&path))
                .map(|c| c.name.as_str())
                .collect();
            return Err(Rejection::new(
                RejectKind::WrongType,
                format!(
                    "{path} (columns {}) must be an object, found {found}",
                    names.join(", ")
                ),
            ));
        }
        let mut cells = Vec::with_capacity(self.columns.len());
        for c in &self.columns {
            let raw = raws.get(c.slot).copied().flatten();
            let cell = match raw {
                Some(raw) => value::parse_cell(c.column_type, raw.get()).map_err(|e| {
                    Rejection::new(
                        e.kind,
                        format!("column {} ({}): {}", c.name, c.path, e.detail),
                    )
                })?,
                None => Cell::Null,
            };
            if c.required && cell == Cell::Null {
                let how = if raw.is_some() {
                    "is null"
                } else {
                    "is missing"
                };
                return Err(Rejection::new(
                    RejectKind::MissingField,
                    format!("required column {} ({}) {how}", c.name, c.path),
                ));
            }
            cells.push(cell);
        }
        Ok(cells)
    }
}

#[cfg(test)]
mod tests;
