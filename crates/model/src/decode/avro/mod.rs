//! Avro records behind a schema registry: the body read with the writer's schema (named by the
//! registry header, [`super::framing`]) into the table's cells.
//!
//! Schemas come from the registry (the pipeline crate's `registry`) before a batch is decoded; decoding itself
//! is synchronous and never fetches. A record is a dead letter — never a crash — when it has no
//! registry header (`no_schema_id`), its schema is unknown to the registry (`unknown_schema`),
//! its body does not follow its schema (`schema_mismatch`), or a value does not fit its column
//! (the same kinds as JSON: `wrong_type`, `missing_field`, `out_of_range`, …).

mod cursor;
mod read;
pub mod schema;

use std::sync::Arc;

use read::{Plan, ReadError, Target};
use schema::Schema;

pub use super::framing::{CONFLUENT_MAGIC, Framed, SchemaId, frame};
use super::framing::{SchemaCache, body};
use super::json::Node;
use super::{Cell, RejectKind, Rejection};
use crate::spec::TableSpec;

/// A column of the table, as messages name it.
#[derive(Debug)]
struct Column {
    name: String,
    path: String,
    required: bool,
}

/// Decodes registry-framed Avro values for one table.
#[derive(Debug)]
pub struct AvroDecoder {
    tree: Node,
    slots: Vec<Vec<Target>>,
    columns: Vec<Column>,
    plans: SchemaCache<Plan>,
}

impl AvroDecoder {
    /// A decoder for the table's columns (looked up in the writer's record by their paths).
    pub fn new(table: &TableSpec) -> AvroDecoder {
        let leaves = table.leaves();
        let paths: Vec<_> = leaves.iter().map(|c| &c.path).collect();
        let (tree, slot_of, slot_count) = Node::build(&paths);
        let mut slots: Vec<Vec<Target>> = vec![Vec::new(); slot_count];
        for (column, (c, slot)) in leaves.iter().zip(slot_of).enumerate() {
            if let Some(s) = slots.get_mut(slot) {
                s.push(Target {
                    column,
                    ty: c.column_type,
                });
            }
        }
        let columns = leaves
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
            plans: SchemaCache::default(),
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
        let plan = self.plans.get(&framed.id)?;
        let body = body(&framed, scratch, max_bytes)?;
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

impl super::RegistryDecoder for AvroDecoder {
    fn knows(&self, id: &SchemaId) -> bool {
        self.plans.knows(id)
    }

    fn add_schema(&self, id: SchemaId, kind: &str, text: &str) {
        self.plans.insert(id, kind, ("AVRO", "avro"), || {
            Schema::parse(text)
                .map(|s| Plan::new(Arc::new(s), &self.tree, &self.slots))
                .map_err(|e| format!("{id}: the registry's schema cannot be read: {e}"))
        });
    }

    fn add_missing(&self, id: SchemaId, reason: String) {
        self.plans.add_missing(id, reason);
    }
}

#[cfg(test)]
mod tests;
