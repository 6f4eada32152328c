//! Schema evolution: what changes when a table in the catalog meets its spec again.
//!
//! Columns are matched by name, or by `renamed_from` (the field id is kept, so old files keep
//! their values under the new name). The spec's columns come first in the evolved schema, in the
//! spec's order, then the Kafka columns; a new column gets the next field id after the table's
//! `last-column-id`, so two writers that evolve the same table from the same spec agree on every
//! id. What the Iceberg spec allows is planned; everything else is refused with what to do
//! instead:
//!
//! - a new column must be optional (rows written before it have no value);
//! - types only widen: int → long, float → double, decimal(P,S) → decimal(P',S) with P' > P;
//! - required → optional is allowed, optional → required is not;
//! - a column no longer in the spec is dropped from the schema (its data stays in the files that
//!   have it), unless a partition field is computed from it.
//!
//! `kafka_headers = true` adds the `kafka_headers` column after the other Kafka columns; turning
//! the option off never drops it (new rows leave it NULL).
//!
//! A struct column's fields are planned the same way, one level down (`+ column customer.tier`).

use std::fmt;
use std::sync::Arc;

use iceberg::spec::{NestedField, NestedFieldRef, PrimitiveType, Schema, StructType, Type};

use super::primitive;
use crate::error::Error;
use crate::kafka;
use crate::spec::{ColumnSpec, ColumnType, TableSpec};

/// One change the evolution makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new optional column.
    Add {
        /// Its name (`struct.field` inside a struct).
        name: String,
        /// Its type, as shown.
        ty: String,
    },
    /// A column's type widened.
    Widen {
        /// The column.
        name: String,
        /// The table's type.
        from: PrimitiveType,
        /// The spec's (wider) type.
        to: PrimitiveType,
    },
    /// A column renamed (same field id).
    Rename {
        /// The table's name.
        from: String,
        /// The spec's name.
        to: String,
    },
    /// A required column made optional.
    Relax {
        /// The column.
        name: String,
    },
    /// A column dropped from the schema.
    Drop {
        /// The column.
        name: String,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Add { name, ty } => write!(f, "+ column {name} {ty} (optional)"),
            Change::Widen { name, from, to } => {
                write!(f, "~ {name} {} → {}", show(from), show(to))
            }
            Change::Rename { from, to } => write!(f, "~ {from} renamed to {to} (same field id)"),
            Change::Relax { name } => write!(f, "~ {name}: required → optional"),
            Change::Drop { name } => write!(
                f,
                "- column {name} (dropped from the schema; older files keep its values)"
            ),
        }
    }
}

/// A change the evolution cannot make, and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The column.
    pub column: String,
    /// The change asked for, e.g. `optional → required`.
    pub change: String,
    /// Why not, and what to do instead.
    pub why: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "! {}: {} — refused: {}",
            self.column, self.change, self.why
        )
    }
}

/// What meeting the spec again does to a table's schema.
#[derive(Debug, Clone)]
pub struct SchemaPlan {
    /// The changes, in spec order (drops last).
    pub changes: Vec<Change>,
    /// The changes that cannot be made; when any, nothing is changed.
    pub refused: Vec<Refusal>,
    /// The evolved schema (with the current schema's id + 1), when there are changes and no
    /// refusals.
    pub evolved: Option<Schema>,
}

impl SchemaPlan {
    /// Whether the table already matches the spec.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.refused.is_empty()
    }

    /// The refusals as one error naming the table.
    pub fn refusal_error(&self, table: &str) -> Option<Error> {
        if self.refused.is_empty() {
            return None;
        }
        let lines: Vec<String> = self.refused.iter().map(ToString::to_string).collect();
        Some(Error::SchemaRefused {
            table: table.to_string(),
            reasons: lines.join("; "),
        })
    }
}

/// The type as written in specs.
pub fn show(ty: &PrimitiveType) -> String {
    match ty {
        PrimitiveType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
        PrimitiveType::Boolean => "boolean".into(),
        PrimitiveType::Int => "int".into(),
        PrimitiveType::Long => "long".into(),
        PrimitiveType::Float => "float".into(),
        PrimitiveType::Double => "double".into(),
        PrimitiveType::Date => "date".into(),
        PrimitiveType::Timestamp => "timestamp".into(),
        PrimitiveType::String => "string".into(),
        PrimitiveType::Binary => "binary".into(),
        other => other.to_string(),
    }
}

/// Whether Iceberg lets a column of type `from` be read as `to`.
pub fn widens(from: &PrimitiveType, to: &PrimitiveType) -> bool {
    use PrimitiveType as P;
    match (from, to) {
        (P::Int, P::Long) | (P::Float, P::Double) => true,
        (
            P::Decimal {
                precision: p1,
                scale: s1,
            },
            P::Decimal {
                precision: p2,
                scale: s2,
            },
        ) => s1 == s2 && p2 > p1,
        _ => false,
    }
}

fn primitive_of(field: &NestedField) -> Option<&PrimitiveType> {
    match field.field_type.as_ref() {
        Type::Primitive(p) => Some(p),
        _ => None,
    }
}

/// Plans `spec` against `current` (the table's current schema; `last_column_id` from its
/// metadata; `partition_sources`: the field ids partition fields are computed from).
pub fn plan(
    current: &Schema,
    last_column_id: i32,
    partition_sources: &[i32],
    spec: &TableSpec,
) -> SchemaPlan {
    let fields: Vec<&NestedFieldRef> = current.as_struct().fields().iter().collect();
    let by_name = |name: &str| fields.iter().find(|f| f.name == name).copied();
    if spec.registry_subject.is_some() && lacks_a_column(&fields, spec) {
        // A registry table's columns only grow: a spec without one of them was resolved before
        // another writer evolved the table, and is older than the table.
        return SchemaPlan {
            changes: Vec::new(),
            refused: Vec::new(),
            evolved: None,
        };
    }
    let mut p = Planner {
        changes: Vec::new(),
        refused: Vec::new(),
        next_id: last_column_id.max(current.highest_field_id()),
        partition_sources,
    };
    let business: Vec<&NestedFieldRef> = fields
        .iter()
        .copied()
        .filter(|f| !kafka::is_kafka_column(&f.name))
        .collect();
    let mut evolved = p.level(&business, &spec.columns, "");

    // The Kafka columns, as the table has them; an older table gains the ones it lacks.
    for k in kafka::fields(0) {
        match by_name(&k.name) {
            Some(f) => evolved.push(f.as_ref().clone()),
            None => {
                p.next_id += 1;
                p.changes.push(Change::Add {
                    name: k.name.clone(),
                    ty: primitive_of(&k).map_or("binary".into(), show),
                });
                let mut f =
                    NestedField::optional(p.next_id, &k.name, k.field_type.as_ref().clone());
                f.doc = k.doc.clone();
                evolved.push(f);
            }
        }
    }
    // The headers: kept where the table has them (even when the spec no longer asks for them),
    // added when the spec asks.
    match by_name(kafka::HEADERS) {
        Some(f) => evolved.push(f.as_ref().clone()),
        None if spec.kafka_headers => {
            let id = p.next_id + 1;
            let f = kafka::headers_field(id, id + 1);
            p.next_id = id + kafka::HEADERS_NESTED_IDS;
            p.changes.push(Change::Add {
                name: f.name.clone(),
                ty: show_type(&f.field_type),
            });
            evolved.push(f);
        }
        None => {}
    }

    let same_order = {
        let have: Vec<&NestedField> = current
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.as_ref())
            .collect();
        let want: Vec<&NestedField> = evolved.iter().collect();
        ids(&have) == ids(&want)
    };
    let evolved = if p.refused.is_empty() && (!p.changes.is_empty() || !same_order) {
        Schema::builder()
            .with_schema_id(current.schema_id() + 1)
            .with_fields(evolved.into_iter().map(Arc::new))
            .build()
            .ok()
    } else {
        None
    };
    SchemaPlan {
        changes: p.changes,
        refused: p.refused,
        evolved,
    }
}

/// Every field id, depth first (a reorder anywhere changes it).
fn ids(fields: &[&NestedField]) -> Vec<i32> {
    let mut out = Vec::new();
    for f in fields {
        out.push(f.id);
        match f.field_type.as_ref() {
            Type::Struct(s) => {
                let inner: Vec<&NestedField> = s.fields().iter().map(|f| f.as_ref()).collect();
                out.extend(ids(&inner));
            }
            Type::List(l) => out.extend(ids(&[l.element_field.as_ref()])),
            _ => {}
        }
    }
    out
}

/// The plan being made, level by level (a struct column's fields are a level of their own).
struct Planner<'a> {
    changes: Vec<Change>,
    refused: Vec<Refusal>,
    next_id: i32,
    partition_sources: &'a [i32],
}

impl Planner<'_> {
    fn refuse(&mut self, column: &str, change: String, why: String) {
        self.refused.push(Refusal {
            column: column.to_string(),
            change,
            why,
        });
    }

    /// The evolved fields of one level: `have` as the table has them, `want` as the spec says;
    /// `prefix` names the struct they are in (`customer.`).
    fn level(
        &mut self,
        have: &[&NestedFieldRef],
        want: &[ColumnSpec],
        prefix: &str,
    ) -> Vec<NestedField> {
        let by_name = |name: &str| have.iter().find(|f| f.name == name).copied();
        let mut kept: Vec<i32> = Vec::new();
        let mut evolved = Vec::new();
        for c in want {
            let shown = format!("{prefix}{}", c.name);
            let existing = match by_name(&c.name) {
                Some(f) => Some(f),
                None => match c.renamed_from.as_deref().and_then(by_name) {
                    Some(old) => {
                        self.changes.push(Change::Rename {
                            from: format!("{prefix}{}", old.name),
                            to: shown.clone(),
                        });
                        Some(old)
                    }
                    None => None,
                },
            };
            let Some(old) = existing else {
                evolved.push(self.add(c, &shown));
                continue;
            };
            kept.push(old.id);
            let ty = if c.column_type == ColumnType::Struct {
                let Type::Struct(inner) = old.field_type.as_ref() else {
                    self.refuse(
                        &shown,
                        format!("{} → struct", old.field_type),
                        "the table's column is not a struct; give the struct another name".into(),
                    );
                    continue;
                };
                let inner: Vec<&NestedFieldRef> = inner.fields().iter().collect();
                let fields = self.level(&inner, &c.fields, &format!("{shown}."));
                Type::Struct(StructType::new(fields.into_iter().map(Arc::new).collect()))
            } else {
                match self.primitive(old, c, &shown) {
                    Some(p) => Type::Primitive(p),
                    None => continue,
                }
            };
            let required = self.required(old, c, &shown);
            let mut field = if required {
                NestedField::required(old.id, &c.name, ty)
            } else {
                NestedField::optional(old.id, &c.name, ty)
            };
            field.doc = old.doc.clone();
            evolved.push(field);
        }
        for f in have {
            if kept.contains(&f.id) {
                continue;
            }
            let shown = format!("{prefix}{}", f.name);
            if self.partition_sources.contains(&f.id) {
                self.refuse(
                    &shown,
                    "dropped".into(),
                    "the table is partitioned by it; keep the column in the spec".into(),
                );
                continue;
            }
            self.changes.push(Change::Drop { name: shown });
        }
        evolved
    }

    /// A new column (a struct with all its fields), with fresh ids.
    fn add(&mut self, c: &ColumnSpec, shown: &str) -> NestedField {
        if c.required {
            self.refuse(
                shown,
                format!("new column {} required", c.column_type),
                "rows already in the table have no value for it; add it without `required = true`"
                    .into(),
            );
        }
        self.next_id += 1;
        let id = self.next_id;
        let ty = if c.column_type == ColumnType::Struct {
            let mut next = self.next_id + 1 + c.fields.len() as i32;
            let fields = super::fields_with_ids(&c.fields, self.next_id + 1, &mut next);
            self.next_id = next - 1;
            Type::Struct(StructType::new(fields.into_iter().map(Arc::new).collect()))
        } else {
            Type::Primitive(primitive(c.column_type))
        };
        // A refused column is shown once, as refused, not also as added.
        if !c.required {
            self.changes.push(Change::Add {
                name: shown.to_string(),
                ty: show_type(&ty),
            });
        }
        NestedField::optional(id, &c.name, ty)
    }

    /// The type an existing primitive column evolves to, or `None` (refused).
    fn primitive(
        &mut self,
        old: &NestedField,
        c: &ColumnSpec,
        shown: &str,
    ) -> Option<PrimitiveType> {
        let want = primitive(c.column_type);
        let Some(have) = primitive_of(old) else {
            self.refuse(
                shown,
                format!("{} → {}", old.field_type, show(&want)),
                "the table's column is not a primitive type; give the spec's column another name"
                    .into(),
            );
            return None;
        };
        if *have == want {
            return Some(want);
        }
        if widens(have, &want) {
            self.changes.push(Change::Widen {
                name: shown.to_string(),
                from: have.clone(),
                to: want.clone(),
            });
            return Some(want);
        }
        self.refuse(
            shown,
            format!("{} → {}", show(have), show(&want)),
            format!(
                "Iceberg only widens int → long, float → double and decimal precision up (same scale); \
                 keep {} here, or add a new column with the new type",
                show(have)
            ),
        );
        None
    }

    /// Whether an existing column stays required (required → optional is a change; optional →
    /// required is refused).
    fn required(&mut self, old: &NestedField, c: &ColumnSpec, shown: &str) -> bool {
        match (old.required, c.required) {
            (true, false) => {
                self.changes.push(Change::Relax {
                    name: shown.to_string(),
                });
                false
            }
            (false, true) => {
                self.refuse(
                    shown,
                    "optional → required".into(),
                    "rows already in the table may have no value for it; keep it optional \
                     (a derived table can filter out the rows without it)"
                        .into(),
                );
                false
            }
            (r, _) => r,
        }
    }
}

/// A type as plans show it: `string`, `decimal(18,2)`, `struct<id string, tier string>`,
/// `list<struct<key string, value binary>>`.
pub fn show_type(ty: &Type) -> String {
    match ty {
        Type::Primitive(p) => show(p),
        Type::List(l) => format!("list<{}>", show_type(&l.element_field.field_type)),
        Type::Struct(s) => {
            let fields: Vec<String> = s
                .fields()
                .iter()
                .map(|f| format!("{} {}", f.name, show_type(&f.field_type)))
                .collect();
            format!("struct<{}>", fields.join(", "))
        }
        other => other.to_string(),
    }
}

/// Whether the table has a business column the spec neither has nor renames.
fn lacks_a_column(fields: &[&NestedFieldRef], spec: &TableSpec) -> bool {
    fields.iter().any(|f| {
        !kafka::is_kafka_column(&f.name)
            && !spec
                .columns
                .iter()
                .any(|c| c.name == f.name || c.renamed_from.as_deref() == Some(f.name.as_str()))
    })
}

/// The plan as the lines `streamtable check` prints under a table (empty: no change).
pub fn describe(plan: &SchemaPlan) -> Vec<String> {
    plan.changes
        .iter()
        .map(ToString::to_string)
        .chain(plan.refused.iter().map(ToString::to_string))
        .collect()
}

#[cfg(test)]
#[path = "evolve_tests.rs"]
mod tests;
