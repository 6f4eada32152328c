//! Reference tables in the pipeline's catalog: read for the lookup joins of derived tables
//! ([`CatalogReferences`], the processing stage's [`ReferenceSource`]), and filled by the demo
//! and the tests ([`append_rows`]); in production analysts maintain them with their own engine.

use arrow_array::{ArrayRef, RecordBatch};
use arrow_cast::cast;
use arrow_select::concat::concat_batches;
use async_trait::async_trait;
use futures::TryStreamExt;
use iceberg::{NamespaceIdent, TableIdent};

use crate::catalog::TableCatalog;
use crate::error::{Error, Result};
use crate::process::reference::{Loaded, ReferenceSource, nullable};
use crate::schema::TableLayout;
use crate::spec::ReferenceSpec;

/// Reference tables read from the pipeline's catalog.
pub struct CatalogReferences {
    catalog: TableCatalog,
    namespace: String,
}

impl CatalogReferences {
    /// Reads reference tables of `namespace` in `catalog`.
    pub fn new(catalog: TableCatalog, namespace: &str) -> Self {
        CatalogReferences {
            catalog,
            namespace: namespace.to_string(),
        }
    }
}

#[async_trait]
impl ReferenceSource for CatalogReferences {
    async fn load(
        &self,
        spec: &ReferenceSpec,
        layout: &TableLayout,
        known: Option<&str>,
    ) -> Result<Loaded> {
        let ident = TableIdent::new(
            NamespaceIdent::new(self.namespace.clone()),
            spec.name.clone(),
        );
        let Some((table, pointer)) = self.catalog.load(&ident).await? else {
            return Ok(Loaded::Missing);
        };
        if known == Some(pointer.metadata_location.as_str()) {
            return Ok(Loaded::Unchanged);
        }
        let ctx = |what: &str| format!("reference table {}: {what}", spec.name);
        let schema = table.metadata().current_schema();
        if let Some(c) = spec
            .columns
            .iter()
            .find(|c| schema.field_by_name(&c.name).is_none())
        {
            return Err(Error::Config(format!(
                "reference table {} has no column {:?}; add it to the table or remove it from [[reference_tables]]",
                spec.name, c.name
            )));
        }
        let names: Vec<&str> = spec.columns.iter().map(|c| c.name.as_str()).collect();
        let batches: Vec<RecordBatch> = table
            .scan()
            .select(names.iter().copied())
            .build()
            .map_err(|e| Error::iceberg(ctx("scan"), e))?
            .to_arrow()
            .await
            .map_err(|e| Error::iceberg(ctx("scan"), e))?
            .try_collect()
            .await
            .map_err(|e| Error::iceberg(ctx("read"), e))?;
        let mut typed = Vec::with_capacity(batches.len());
        for b in batches {
            let mut columns: Vec<ArrayRef> = Vec::with_capacity(names.len());
            for field in layout.arrow_schema.fields() {
                let column = b.column_by_name(field.name()).ok_or_else(|| {
                    Error::Internal(ctx(&format!("scan returned no column {}", field.name())))
                })?;
                columns.push(cast(column, field.data_type()).map_err(|e| {
                    Error::Config(ctx(&format!(
                        "column {} cannot be read as {}: {e}",
                        field.name(),
                        field.data_type()
                    )))
                })?);
            }
            typed.push(
                RecordBatch::try_new(nullable(layout), columns)
                    .map_err(|e| Error::Config(ctx(&e.to_string())))?,
            );
        }
        let rows = concat_batches(&nullable(layout), &typed)
            .map_err(|e| Error::Internal(ctx(&e.to_string())))?;
        Ok(Loaded::Rows {
            version: pointer.metadata_location,
            rows,
        })
    }
}

/// Appends `rows` (in the reference table's declared columns) to reference table `name` as
/// one snapshot, creating the table if needed. The demo and the tests fill reference tables
/// this way; in production analysts maintain them with their own engine.
pub async fn append_rows(
    backend: &crate::backend::Backend,
    tables: &crate::tables::TableSet,
    name: &str,
    rows: &RecordBatch,
) -> Result<()> {
    use iceberg::transaction::{ApplyTransactionAction, Transaction};
    let def = tables.references.get(name).ok_or_else(|| {
        Error::Config(format!(
            "{name} is not a reference table of the pipeline spec; add a [[reference_tables]] entry"
        ))
    })?;
    tables.ensure_references(backend).await?;
    let ident = tables.ident(name);
    let (table, _) = backend
        .catalog
        .load(&ident)
        .await?
        .ok_or_else(|| Error::Internal(format!("reference table {name} was not created")))?;
    let rows = RecordBatch::try_new(def.layout.arrow_schema.clone(), rows.columns().to_vec())
        .map_err(|e| Error::Config(format!("rows for reference table {name}: {e}")))?;
    let location = backend.warehouse.table_location(&backend.namespace, name);
    let stem = format!("reference-{}", backend.clock.now_ms());
    let files = crate::table::encode::encode(
        &def.layout,
        &rows,
        &location,
        &stem,
        &crate::table::encode::micro_file_properties(),
    )
    .await?;
    for f in &files {
        backend
            .warehouse
            .write(&f.location, f.bytes.clone())
            .await?;
    }
    let tx = Transaction::new(&table);
    let tx = tx
        .fast_append()
        .add_data_files(files.into_iter().map(|f| f.data_file).collect::<Vec<_>>())
        .apply(tx)
        .map_err(|e| Error::iceberg(format!("append to {name}"), e))?;
    tx.commit(&backend.catalog)
        .await
        .map_err(|e| Error::iceberg(format!("commit to {name}"), e))?;
    Ok(())
}
