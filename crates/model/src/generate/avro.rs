//! Avro producers for the demo and the benchmarks: rows of a table written as a producer with a
//! schema registry writes them (Confluent framing), from the same JSON records the JSON topics
//! carry. The writer schema is derived from the table's columns: one field per column, named
//! after it (a struct column's fields flat, `struct_field`); optional columns are
//! `["null", T]` with default `null`.

use crate::decode::avro::CONFLUENT_MAGIC;
use crate::decode::{Cell, RecordDecoder, Rejection};
use crate::spec::{ColumnType, TableSpec};

/// Writes one table's rows as Confluent-framed Avro.
#[derive(Debug)]
pub struct AvroProducer {
    decoder: RecordDecoder,
    schema: String,
    header: [u8; 5],
}

impl AvroProducer {
    /// A producer of `table`'s rows under Confluent schema id `id`.
    pub fn new(table: &TableSpec, id: u32) -> AvroProducer {
        // One field per primitive column (a struct column's fields flat, named `struct_field`).
        let fields: Vec<serde_json::Value> = table
            .leaves()
            .iter()
            .map(|c| {
                let ty = avro_type_of(c.column_type);
                let name = c.name.replace('.', "_");
                if c.required {
                    serde_json::json!({"name": name, "type": ty})
                } else {
                    serde_json::json!({"name": name, "type": ["null", ty], "default": null})
                }
            })
            .collect();
        let schema = serde_json::json!({
            "type": "record", "name": table.name, "namespace": "streamtable.demo", "fields": fields
        })
        .to_string();
        let mut header = [CONFLUENT_MAGIC; 5];
        header[1..].copy_from_slice(&id.to_be_bytes());
        AvroProducer {
            decoder: RecordDecoder::new(table),
            schema,
            header,
        }
    }

    /// The writer schema, as registered.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The framed Avro value of one JSON record (as the JSON topic would carry it), or why the
    /// record cannot be written (a producer's serializer would refuse it too).
    pub fn encode_json(&self, json: &str) -> Result<Vec<u8>, Rejection> {
        let cells = self.decoder.decode(json)?;
        let mut out = Vec::with_capacity(json.len() / 2 + 8);
        out.extend_from_slice(&self.header);
        for (cell, column) in cells.iter().zip(self.decoder.column_types()) {
            let (ty, required) = column;
            if !required {
                long(&mut out, i64::from(*cell != Cell::Null));
            }
            write_cell(&mut out, cell, ty);
        }
        Ok(out)
    }
}

/// The Avro type a column of `ty` is written as.
fn avro_type_of(ty: ColumnType) -> serde_json::Value {
    use serde_json::json;
    match ty {
        ColumnType::String => json!("string"),
        ColumnType::Int => json!("int"),
        ColumnType::Long => json!("long"),
        ColumnType::Float => json!("float"),
        ColumnType::Double => json!("double"),
        ColumnType::Boolean => json!("boolean"),
        ColumnType::Date => json!({"type": "int", "logicalType": "date"}),
        ColumnType::Timestamp => json!({"type": "long", "logicalType": "timestamp-micros"}),
        ColumnType::Decimal { precision, scale } => json!({
            "type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale
        }),
        // Only primitive columns are written (the leaves).
        ColumnType::Struct => json!("null"),
    }
}

fn write_cell(out: &mut Vec<u8>, cell: &Cell<'_>, ty: ColumnType) {
    match cell {
        Cell::Null => {}
        Cell::Str(s) => bytes(out, s.as_bytes()),
        Cell::Int(v) | Cell::Date(v) => long(out, i64::from(*v)),
        Cell::Long(v) | Cell::Timestamp(v) => long(out, *v),
        Cell::Float(v) => out.extend_from_slice(&v.to_le_bytes()),
        Cell::Double(v) => out.extend_from_slice(&v.to_le_bytes()),
        Cell::Bool(v) => out.push(u8::from(*v)),
        Cell::Decimal(v) => {
            debug_assert!(matches!(ty, ColumnType::Decimal { .. }));
            // Two's complement, big-endian, in the fewest bytes that keep the sign.
            let be = v.to_be_bytes();
            let fill = if *v < 0 { 0xff } else { 0 };
            let mut start = 0;
            while start < 15 && be[start] == fill && (be[start + 1] & 0x80) == (fill & 0x80) {
                start += 1;
            }
            bytes(out, &be[start..]);
        }
    }
}

fn long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    long(out, b.len() as i64);
    out.extend_from_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::round_trip;

    /// What the producer writes, the decoder reads back to the same cells as the JSON.
    #[test]
    fn round_trips_through_the_decoder() {
        let t = round_trip::all_types("avro");
        let p = AvroProducer::new(&t, 3);
        round_trip::check(&t, "AVRO", 3, p.schema(), |json| {
            p.encode_json(json).expect("encodes")
        });
    }
}
