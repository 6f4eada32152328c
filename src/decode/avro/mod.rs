//! Avro records behind a schema registry: the framing that names the writer's schema, and the
//! body read with that schema into the table's cells.
//!
//! Two framings, told apart by their first byte:
//! - Confluent: magic byte `0`, then the schema id as 4 bytes big-endian, then the body;
//! - AWS Glue Schema Registry: header version `3`, compression (`0` none, `5` zlib), the schema
//!   version's UUID (16 bytes), then the body (compressed or not).
//!
//! Schemas come from the registry ([`crate::registry`]) before a batch is decoded; decoding itself
//! is synchronous and never fetches. A record is a dead letter — never a crash — when it has no
//! registry header (`no_schema_id`), its schema is unknown to the registry (`unknown_schema`),
//! its body does not follow its schema (`schema_mismatch`), or a value does not fit its column
//! (the same kinds as JSON: `wrong_type`, `missing_field`, `out_of_range`, …).

mod cursor;
mod read;
mod schema;

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::sync::{Arc, RwLock};

use read::{Plan, ReadError, Target};
use schema::Schema;

use super::json::Node;
use super::{Cell, RejectKind, Rejection};
use crate::spec::{ColumnType, TableSpec};

/// Which schema a record says it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SchemaId {
    /// A Confluent Schema Registry id.
    Confluent(u32),
    /// An AWS Glue Schema Registry schema version id.
    Glue(uuid::Uuid),
}

impl fmt::Display for SchemaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaId::Confluent(id) => write!(f, "Confluent schema id {id}"),
            SchemaId::Glue(id) => write!(f, "Glue schema version {id}"),
        }
    }
}

/// Confluent wire format: magic byte.
pub const CONFLUENT_MAGIC: u8 = 0;
/// Glue Schema Registry wire format: header version byte.
pub const GLUE_HEADER_VERSION: u8 = 3;
/// Glue: body not compressed.
pub const GLUE_COMPRESSION_NONE: u8 = 0;
/// Glue: body compressed with zlib.
pub const GLUE_COMPRESSION_ZLIB: u8 = 5;
const GLUE_HEADER_LEN: usize = 18;

/// A framed value: the writer's schema and the body.
#[derive(Debug, PartialEq, Eq)]
pub struct Framed<'a> {
    /// The writer's schema.
    pub id: SchemaId,
    /// The body (still compressed when `zlib`).
    pub body: &'a [u8],
    /// Whether the body is zlib-compressed (Glue).
    pub zlib: bool,
}

/// Reads the registry header of a value.
pub fn frame(value: &[u8]) -> Result<Framed<'_>, Rejection> {
    match value.first() {
        Some(&CONFLUENT_MAGIC) if value.len() >= 5 => Ok(Framed {
            id: SchemaId::Confluent(u32::from_be_bytes([value[1], value[2], value[3], value[4]])),
            body: &value[5..],
            zlib: false,
        }),
        Some(&GLUE_HEADER_VERSION) if value.len() >= GLUE_HEADER_LEN => {
            let zlib = match value[1] {
                GLUE_COMPRESSION_NONE => false,
                GLUE_COMPRESSION_ZLIB => true,
                other => {
                    return Err(Rejection::new(
                        RejectKind::NoSchemaId,
                        format!(
                            "Glue Schema Registry header names compression {other}; only 0 (none) and 5 (zlib) exist"
                        ),
                    ));
                }
            };
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(&value[2..GLUE_HEADER_LEN]);
            Ok(Framed {
                id: SchemaId::Glue(uuid::Uuid::from_bytes(uuid)),
                body: &value[GLUE_HEADER_LEN..],
                zlib,
            })
        }
        first => Err(Rejection::new(
            RejectKind::NoSchemaId,
            format!(
                "value ({} bytes, first byte {}) has no schema registry header: expected the Confluent magic byte 0 and a 4-byte schema id, or the Glue header version 3; set format = \"json\" if the topic carries JSON",
                value.len(),
                first.map_or("none".to_string(), |b| b.to_string())
            ),
        )),
    }
}

/// A column of the table, as messages name it.
#[derive(Debug)]
struct Column {
    name: String,
    path: String,
    required: bool,
}

/// A writer schema compiled for this table, or why it cannot be.
type Compiled = Result<Arc<Plan>, String>;

/// Decodes registry-framed Avro values for one table.
#[derive(Debug)]
pub struct AvroDecoder {
    tree: Node,
    slots: Vec<Vec<Target>>,
    columns: Vec<Column>,
    plans: RwLock<HashMap<SchemaId, Compiled>>,
    /// Ids the registry did not have at the last lookup, with its reason (asked again the next
    /// time a batch names them).
    missing: RwLock<HashMap<SchemaId, String>>,
}

impl AvroDecoder {
    /// A decoder for the table's columns (looked up in the writer's record by their paths).
    pub fn new(table: &TableSpec) -> AvroDecoder {
        let paths: Vec<_> = table.columns.iter().map(|c| &c.path).collect();
        let (tree, slot_of, slot_count) = Node::build(&paths);
        let mut slots: Vec<Vec<Target>> = vec![Vec::new(); slot_count];
        for (column, (c, slot)) in table.columns.iter().zip(slot_of).enumerate() {
            if let Some(s) = slots.get_mut(slot) {
                s.push(Target {
                    column,
                    ty: c.column_type,
                });
            }
        }
        let columns = table
            .columns
            .iter()
            .map(|c| Column {
                name: c.name.clone(),
                path: c.path.to_string(),
                required: c.required,
            })
            .collect();
        AvroDecoder {
            tree,
            slots,
            columns,
            plans: RwLock::new(HashMap::new()),
            missing: RwLock::new(HashMap::new()),
        }
    }

    /// Whether the writer schema `id` has been added.
    pub fn knows(&self, id: &SchemaId) -> bool {
        self.plans.read().is_ok_and(|p| p.contains_key(id))
    }

    /// Adds the writer schema `id` (its JSON text from the registry). A schema that does not
    /// parse is kept as such: its records are dead letters that say why.
    pub fn add_schema(&self, id: SchemaId, text: &str) {
        let compiled = Schema::parse(text)
            .map(|s| Arc::new(Plan::new(Arc::new(s), &self.tree, &self.slots)))
            .map_err(|e| format!("{id}: the registry's schema cannot be read: {e}"));
        if let Ok(mut plans) = self.plans.write() {
            plans.insert(id, compiled);
        }
    }

    /// Records that `id` is not in the registry, and why (the dead letters' message).
    pub fn add_missing(&self, id: SchemaId, reason: String) {
        if let Ok(mut missing) = self.missing.write() {
            missing.insert(id, reason);
        }
    }

    /// Decodes one framed value into its cells, one per column in spec order. `scratch` holds a
    /// decompressed body; `max_bytes` bounds it.
    pub fn decode<'a>(
        &self,
        value: &'a [u8],
        scratch: &'a mut Vec<u8>,
        max_bytes: usize,
    ) -> Result<Vec<Cell<'a>>, Rejection> {
        let framed = frame(value)?;
        let plan = self
            .plans
            .read()
            .ok()
            .and_then(|p| p.get(&framed.id).cloned())
            .ok_or_else(|| {
                let reason = self
                    .missing
                    .read()
                    .ok()
                    .and_then(|m| m.get(&framed.id).cloned());
                Rejection::new(
                    RejectKind::UnknownSchema,
                    reason
                        .unwrap_or_else(|| format!("{} is not in the schema registry", framed.id)),
                )
            })?
            .map_err(|e| Rejection::new(RejectKind::UnknownSchema, e))?;
        let body = if framed.zlib {
            inflate(framed.body, scratch, max_bytes)?;
            scratch.as_slice()
        } else {
            framed.body
        };
        let mut cells = vec![Cell::Null; self.columns.len()];
        plan.read(body, &mut cells)
            .map_err(|e| self.rejection(&framed.id, e))?;
        for (c, cell) in self.columns.iter().zip(&cells) {
            if c.required && *cell == Cell::Null {
                return Err(Rejection::new(
                    RejectKind::MissingField,
                    format!(
                        "required column {} ({}) is missing or null in a record of {}",
                        c.name, c.path, framed.id
                    ),
                ));
            }
        }
        Ok(cells)
    }

    fn rejection(&self, id: &SchemaId, e: ReadError) -> Rejection {
        let name = |i: usize| {
            self.columns
                .get(i)
                .map(|c| format!("column {} ({})", c.name, c.path))
                .unwrap_or_default()
        };
        match e {
            ReadError::Malformed(m) => Rejection::new(
                RejectKind::SchemaMismatch,
                format!("payload does not match {id}: {m}"),
            ),
            ReadError::Value { column, error } => {
                Rejection::new(error.kind, format!("{}: {}", name(column), error.detail))
            }
            ReadError::Mismatch { column, detail } => {
                let which = column.map(name).unwrap_or_else(|| "the record".into());
                Rejection::new(
                    RejectKind::WrongType,
                    format!(
                        "{which}: {detail} ({id}); change the column's type in the spec or the producer's schema"
                    ),
                )
            }
        }
    }
}

/// Decompresses a zlib body into `out`, refusing more than `max_bytes`.
fn inflate(body: &[u8], out: &mut Vec<u8>, max_bytes: usize) -> Result<(), Rejection> {
    out.clear();
    let limit = u64::try_from(max_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    flate2::read::ZlibDecoder::new(body)
        .take(limit)
        .read_to_end(out)
        .map_err(|e| {
            Rejection::new(
                RejectKind::SchemaMismatch,
                format!("zlib-compressed body (Glue compression 5) does not inflate: {e}"),
            )
        })?;
    if out.len() > max_bytes {
        return Err(Rejection::new(
            RejectKind::Oversize,
            format!("body inflates to more than {max_bytes} bytes (max_record_bytes)"),
        ));
    }
    Ok(())
}

/// The Avro type a column of `ty` is written as in a schema derived from the spec (the demo
/// and the benchmark produce with it).
pub fn avro_type_of(ty: ColumnType) -> serde_json::Value {
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
    }
}

#[cfg(test)]
mod tests;
