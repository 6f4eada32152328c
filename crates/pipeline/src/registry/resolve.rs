//! Reading a spec whose tables take their columns from the registry: each subject's latest
//! version gives the columns, merged with the table's columns in the catalog so that a table
//! only ever gains columns and keeps their order.

use std::path::Path;

use iceberg::spec::{PrimitiveType, Type};
use iceberg::{NamespaceIdent, TableIdent};

use super::mapping::{SchemaColumns, of_schema};
use super::{Latest, Registries, SchemaId};
use crate::backend::Backend;
use crate::error::Result;
use crate::schema::evolve::widens;
use crate::schema::primitive;
use crate::spec::{
    ColumnSpec, ColumnType, Format, PipelineSpec, RegistryTable, ResolvedColumns, unresolved,
};

/// What the registry gave one table.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    /// The table and its subject.
    pub table: RegistryTable,
    /// The latest version's id.
    pub id: SchemaId,
    /// Its columns, and the fields it has that are not columns.
    pub schema: SchemaColumns,
    /// Columns the table has that the latest version does not (kept; they read NULL for
    /// records without them).
    pub kept: Vec<String>,
}

/// Reads the spec `text` (from `origin`), its registry tables' columns from the registry and
/// the catalog of `backend`. A spec without such tables is parsed as it is.
pub async fn load_spec(text: &str, origin: &Path, backend: &Backend) -> Result<PipelineSpec> {
    load_spec_detailed(text, origin, Some(backend))
        .await
        .map(|(spec, _)| spec)
}

/// [`load_spec`], with what the registry gave each table (for `streamtable check`); without a
/// backend (no catalog yet), the columns are the registry's alone.
pub async fn load_spec_detailed(
    text: &str,
    origin: &Path,
    backend: Option<&Backend>,
) -> Result<(PipelineSpec, Vec<Resolution>)> {
    let (registry, wanted) = PipelineSpec::registry_tables(text, origin)?;
    if wanted.is_empty() {
        return Ok((
            PipelineSpec::parse(text, origin, &crate::process::Planner)?,
            Vec::new(),
        ));
    }
    let registries = Registries::configure(
        &registry,
        |k| std::env::var(k).ok(),
        backend.and_then(|b| b.glue_schemas.clone()),
    )?;
    let mut resolved = ResolvedColumns::new();
    let mut details = Vec::new();
    for table in wanted {
        let (id, schema) = latest_columns(&registries, origin, &table).await?;
        let existing = match backend {
            Some(b) => {
                let ident = TableIdent::new(
                    NamespaceIdent::new(b.namespace.clone()),
                    table.table.clone(),
                );
                match b.catalog.load(&ident).await? {
                    Some((t, _)) => {
                        business_columns(t.metadata().current_schema().as_struct().fields())
                    }
                    None => Vec::new(),
                }
            }
            None => Vec::new(),
        };
        let (columns, kept) = merge(&existing, &schema.columns);
        tracing::info!(table = %table.table, subject = %table.subject, schema = %id,
            columns = columns.len(), skipped = ?schema.skipped, "columns read from the registry");
        resolved.insert(table.table.clone(), columns);
        details.push(Resolution {
            table,
            id,
            schema,
            kept,
        });
    }
    let spec = PipelineSpec::parse_resolved(text, origin, &resolved, &crate::process::Planner)?;
    Ok((spec, details))
}

/// The columns of `table`'s subject's latest version, or why there are none.
async fn latest_columns(
    registries: &Registries,
    origin: &Path,
    table: &RegistryTable,
) -> Result<(SchemaId, SchemaColumns)> {
    let (id, schema, kind) = match registries.latest(&table.subject).await? {
        Latest::Found { id, schema, kind } => (id, schema, kind),
        Latest::Missing(why) => return Err(unresolved(origin, table, &why)),
    };
    let want = match table.format {
        Format::Avro => "AVRO",
        Format::Protobuf => "PROTOBUF",
        Format::Json => "JSON",
    };
    if !kind.eq_ignore_ascii_case(want) {
        return Err(unresolved(
            origin,
            table,
            &format!(
                "the latest version ({id}) is a {kind} schema but the table's format is {}",
                table.format
            ),
        ));
    }
    let columns = of_schema(table.format, &schema, table.message.as_deref())
        .map_err(|why| unresolved(origin, table, &format!("{id}: {why}")))?;
    if columns.columns.is_empty() {
        return Err(unresolved(
            origin,
            table,
            &format!(
                "{id} has no field a column can hold ({})",
                columns.skipped.join("; ")
            ),
        ));
    }
    Ok((id, columns))
}

/// The columns of a table with `existing` columns (in the catalog) whose registry now gives
/// `latest`: the existing ones first, in their order (with the registry's type where it widens
/// theirs), then the new ones. Also the names of the existing columns the registry no longer
/// has.
pub fn merge(existing: &[ColumnSpec], latest: &[ColumnSpec]) -> (Vec<ColumnSpec>, Vec<String>) {
    let mut out = Vec::with_capacity(existing.len() + latest.len());
    let mut kept = Vec::new();
    for old in existing {
        match latest.iter().find(|c| c.name == old.name) {
            Some(new) => {
                let (have, want) = (primitive(old.column_type), primitive(new.column_type));
                let column_type = if have == want || widens(&have, &want) {
                    new.column_type
                } else {
                    old.column_type
                };
                out.push(ColumnSpec {
                    column_type,
                    ..new.clone()
                });
            }
            None => {
                kept.push(old.name.clone());
                out.push(old.clone());
            }
        }
    }
    for new in latest {
        if !existing.iter().any(|c| c.name == new.name) {
            out.push(new.clone());
        }
    }
    (out, kept)
}

/// A catalog table's business columns (not the Kafka ones) as optional spec columns read from
/// the field of their name.
fn business_columns(fields: &[iceberg::spec::NestedFieldRef]) -> Vec<ColumnSpec> {
    fields
        .iter()
        .filter(|f| !crate::kafka::is_kafka_column(&f.name))
        .filter_map(|f| {
            let Type::Primitive(p) = f.field_type.as_ref() else {
                return None;
            };
            Some(ColumnSpec {
                required: f.required,
                ..ColumnSpec::optional(&f.name, column_type(p)?)
            })
        })
        .collect()
}

/// The spec type of an Iceberg primitive, where there is one.
fn column_type(p: &PrimitiveType) -> Option<ColumnType> {
    Some(match p {
        PrimitiveType::String => ColumnType::String,
        PrimitiveType::Int => ColumnType::Int,
        PrimitiveType::Long => ColumnType::Long,
        PrimitiveType::Float => ColumnType::Float,
        PrimitiveType::Double => ColumnType::Double,
        PrimitiveType::Boolean => ColumnType::Boolean,
        PrimitiveType::Date => ColumnType::Date,
        PrimitiveType::Timestamp => ColumnType::Timestamp,
        PrimitiveType::Decimal { precision, scale } => ColumnType::Decimal {
            precision: u8::try_from(*precision).ok()?,
            scale: u8::try_from(*scale).ok()?,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, ty: &str) -> ColumnSpec {
        ColumnSpec::optional(name, ColumnType::parse(ty).expect("type"))
    }

    #[test]
    fn a_table_keeps_its_columns_and_order_and_gains_the_new_ones() {
        let existing = [col("a", "int"), col("b", "string"), col("c", "long")];
        let latest = [
            col("c", "int"),
            col("d", "string"),
            col("a", "long"),
            col("e", "double"),
        ];
        let (merged, kept) = merge(&existing, &latest);
        let shown: Vec<String> = merged
            .iter()
            .map(|c| format!("{} {}", c.name, c.column_type))
            .collect();
        // a widens to long; c stays long (int would narrow it); b is kept; d and e are new.
        assert_eq!(
            shown,
            ["a long", "b string", "c long", "d string", "e double"]
        );
        assert_eq!(kept, ["b"]);
        assert_eq!(merge(&[], &latest).0, latest.to_vec());
    }
}
