//! Protobuf producers for the benchmarks: rows of a table written as a producer with a schema
//! registry writes them (Confluent framing, the first message), from the same JSON records the
//! JSON topics carry. The `.proto` is derived from the table's columns: one field per column;
//! optional columns are `optional` fields (so NULL stays unset), timestamps are
//! `google.protobuf.Timestamp`, decimals numeric strings, dates days since 1970-01-01.

use prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor, ReflectMessage, Value};

use crate::decode::avro::CONFLUENT_MAGIC;
use crate::decode::{Cell, RecordDecoder, Rejection};
use crate::error::{Error, Result};
use crate::spec::{ColumnType, TableSpec};

/// Writes one table's rows as Confluent-framed Protobuf.
#[derive(Debug)]
pub struct ProtobufProducer {
    decoder: RecordDecoder,
    schema: String,
    message: MessageDescriptor,
    scales: Vec<u8>,
    header: [u8; 6],
}

fn proto_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::String | ColumnType::Decimal { .. } => "string",
        ColumnType::Int | ColumnType::Date => "int32",
        ColumnType::Long => "int64",
        ColumnType::Float => "float",
        ColumnType::Double => "double",
        ColumnType::Boolean => "bool",
        ColumnType::Timestamp => "google.protobuf.Timestamp",
        // Only primitive columns are written (the leaves).
        ColumnType::Struct => "bytes",
    }
}

impl ProtobufProducer {
    /// A producer of `table`'s rows under Confluent schema id `id`.
    pub fn new(table: &TableSpec, id: u32) -> Result<ProtobufProducer> {
        let mut schema = String::from(
            "syntax = \"proto3\";\npackage streamtable.demo;\nimport \"google/protobuf/timestamp.proto\";\n\nmessage Row {\n",
        );
        // One field per primitive column (a struct column's fields flat, `struct_field`).
        let leaves = table.leaves();
        for (i, c) in leaves.iter().enumerate() {
            let optional = if c.required { "" } else { "optional " };
            schema.push_str(&format!(
                "  {optional}{} {} = {};\n",
                proto_type(c.column_type),
                c.name.replace('.', "_"),
                i + 1
            ));
        }
        schema.push_str("}\n");
        let compiled = crate::decode::protobuf::compile(&schema)
            .map_err(|e| Error::Internal(format!("the producer's .proto: {e}")))?;
        let message = compiled
            .first_message()
            .ok_or_else(|| Error::Internal("the producer's .proto has no message".into()))?;
        let scales = leaves
            .iter()
            .map(|c| match c.column_type {
                ColumnType::Decimal { scale, .. } => scale,
                _ => 0,
            })
            .collect();
        let mut header = [CONFLUENT_MAGIC; 6];
        header[1..5].copy_from_slice(&id.to_be_bytes());
        Ok(ProtobufProducer {
            decoder: RecordDecoder::new(table),
            schema,
            message,
            scales,
            header,
        })
    }

    /// The `.proto`, as registered.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The framed Protobuf value of one JSON record (as the JSON topic would carry it), or why
    /// the record cannot be written.
    pub fn encode_json(&self, json: &str) -> std::result::Result<Vec<u8>, Rejection> {
        let cells = self.decoder.decode(json)?;
        let mut m = DynamicMessage::new(self.message.clone());
        for ((cell, field), scale) in cells.iter().zip(self.message.fields()).zip(&self.scales) {
            let value = match cell {
                Cell::Null => continue,
                Cell::Str(s) => Value::String(s.to_string()),
                Cell::Int(v) | Cell::Date(v) => Value::I32(*v),
                Cell::Long(v) => Value::I64(*v),
                Cell::Float(v) => Value::F32(*v),
                Cell::Double(v) => Value::F64(*v),
                Cell::Bool(v) => Value::Bool(*v),
                Cell::Decimal(v) => Value::String(decimal_text(*v, *scale)),
                Cell::Timestamp(us) => {
                    let Some(desc) = field.kind().as_message().cloned() else {
                        continue;
                    };
                    let mut ts = DynamicMessage::new(desc);
                    ts.set_field_by_name("seconds", Value::I64(us.div_euclid(1_000_000)));
                    ts.set_field_by_name(
                        "nanos",
                        Value::I32((us.rem_euclid(1_000_000) * 1000) as i32),
                    );
                    Value::Message(ts)
                }
            };
            m.set_field(&field, value);
        }
        let mut out = Vec::with_capacity(self.header.len() + m.encoded_len());
        out.extend_from_slice(&self.header);
        m.encode(&mut out)
            .map_err(|e| Rejection::new(crate::decode::RejectKind::Transform, e.to_string()))?;
        debug_assert_eq!(m.descriptor().full_name(), "streamtable.demo.Row");
        Ok(out)
    }
}

/// An unscaled decimal as text (`-12.30` for -1230 at scale 2).
fn decimal_text(v: i128, scale: u8) -> String {
    let digits = v.unsigned_abs().to_string();
    let scale = usize::from(scale);
    let sign = if v < 0 { "-" } else { "" };
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::round_trip;

    /// What the producer writes, the decoder reads back to the same cells as the JSON.
    #[test]
    fn round_trips_through_the_decoder() {
        let t = round_trip::all_types("protobuf");
        let p = ProtobufProducer::new(&t, 4).expect("producer");
        round_trip::check(&t, "PROTOBUF", 4, p.schema(), |json| {
            p.encode_json(json).expect("encodes")
        });
        assert_eq!(decimal_text(-5, 2), "-0.05");
        assert_eq!(decimal_text(12345, 0), "12345");
    }
}
