//! Avro records behind a schema registry: the body read with the writer's schema (named by the
//! registry header, [`super::framing`]) into the table's cells.
//!
//! Schemas come from the registry (the pipeline crate's `registry`) before a batch is decoded; decoding itself
//! is synchronous and never fetches. A record is a dead letter — never a crash — when it has no
//! registry header (`no_schema_id`), its schema is unknown to the registry (`unknown_schema`),
//! its body does not follow its schema (`schema_mismatch`), or a value does not fit its column
//! (the same kinds as JSON: `wrong_type`, `missing_field`, `out_of_range`, …).

mod cursor;
mod envelope;
mod read;
pub mod schema;

pub use envelope::AvroChange;

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
    /// For Debezium change events: where the envelope's parts are among the cells.
    envelope: Option<envelope::Layout>,
}

impl AvroDecoder {
    /// A decoder for the table's columns (looked up in the writer's record by their paths), or
    /// of its change events when the table reads Debezium's envelope.
    pub fn new(table: &TableSpec) -> AvroDecoder {
        let debezium = table
            .upsert
            .as_ref()
            .is_some_and(|u| u.envelope == Some(crate::spec::Envelope::Debezium));
        if debezium {
            let (leaves, layout) = envelope::columns(table);
            AvroDecoder {
                envelope: Some(layout),
                ..Self::of_leaves(&leaves)
            }
        } else {
            Self::of_leaves(&table.leaves())
        }
    }

    fn of_leaves(leaves: &[crate::spec::ColumnSpec]) -> AvroDecoder {
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
            envelope: None,
        }
    }

    /// Whether this decoder reads Debezium change events ([`Self::change`]).
    pub fn reads_changes(&self) -> bool {
        self.envelope.is_some()
    }

    /// Decodes one framed Debezium change event: the key's new row, or the key it deletes.
    /// A decoder of plain rows reads every value as a new row.
    pub fn change<'a>(
        &self,
        value: &'a [u8],
        scratch: &'a mut Vec<u8>,
        max_bytes: usize,
    ) -> Result<AvroChange<'a>, Rejection> {
        let Some(layout) = &self.envelope else {
            return self
                .decode(value, scratch, max_bytes)
                .map(AvroChange::Upsert);
        };
        let framed = frame(value)?;
        let cells = self.read(&framed, scratch, max_bytes)?;
        let column = |i: usize| self.columns.get(i);
        layout
            .change(
                cells,
                |i| column(i).is_some_and(|c| c.required),
                |i| {
                    column(i)
                        .map(|c| format!("{} ({})", c.name, c.path))
                        .unwrap_or_default()
                },
            )
            .map_err(|mut r| {
                r.message = format!("{} (a record of {})", r.message, framed.id);
                r
            })
    }

    /// Reads the body of `framed` into one cell per column of the decoder (NULL where the
    /// writer has no value).
    fn read<'a>(
        &self,
        framed: &Framed<'a>,
        scratch: &'a mut Vec<u8>,
        max_bytes: usize,
    ) -> Result<Vec<Cell<'a>>, Rejection> {
        let plan = self.plans.get(&framed.id)?;
        let body = body(framed, scratch, max_bytes)?;
        let mut cells = vec![Cell::Null; self.columns.len()];
        plan.read(body, &mut cells)
            .map_err(|e| self.rejection(&framed.id, e))?;
        Ok(cells)
    }

    /// Decodes one framed value into its cells, one per column in spec order. `scratch` holds a
    /// decompressed body; `max_bytes` bounds it. A decoder of change events reads a change of a
    /// row as its row, and refuses a delete.
    pub fn decode<'a>(
        &self,
        value: &'a [u8],
        scratch: &'a mut Vec<u8>,
        max_bytes: usize,
    ) -> Result<Vec<Cell<'a>>, Rejection> {
        if self.envelope.is_some() {
            return match self.change(value, scratch, max_bytes)? {
                AvroChange::Upsert(cells) => Ok(cells),
                AvroChange::Delete(_) => Err(crate::decode::debezium::refuse(
                    "a delete (op \"d\") where a row was expected",
                )),
            };
        }
        let framed = frame(value)?;
        let cells = self.read(&framed, scratch, max_bytes)?;
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

    fn was_missing(&self, id: &SchemaId) -> bool {
        self.plans.was_missing(id)
    }
}

#[cfg(test)]
mod tests;
