//! Reference tables: Iceberg tables in the pipeline's catalog that analysts maintain (with
//! Athena or any engine), read whole into memory at cold start and re-read when their
//! `refresh_seconds` have passed and the table has a new snapshot.
//!
//! A reference table that does not exist yet is empty (a LEFT JOIN yields NULLs, an INNER JOIN
//! no row) and a warning is logged. A failed first read fails the invocation (the batch is
//! retried); a failed refresh keeps the copy already loaded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::{cast, concat_batches};
use futures::TryStreamExt;
use iceberg::{NamespaceIdent, TableIdent};

use crate::catalog::TableCatalog;
use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::spec::ReferenceSpec;

/// What reading a reference table found.
pub enum Loaded {
    /// The table does not exist.
    Missing,
    /// The table is at the version already loaded.
    Unchanged,
    /// The table's rows (in the declared columns' types) at `version`.
    Rows {
        /// The version read (the table's metadata location).
        version: String,
        /// Every row.
        rows: RecordBatch,
    },
}

/// Where reference tables are read from.
#[async_trait]
pub trait ReferenceSource: Send + Sync {
    /// Reads reference table `spec`, unless it is still at version `known`.
    async fn load(
        &self,
        spec: &ReferenceSpec,
        layout: &TableLayout,
        known: Option<&str>,
    ) -> Result<Loaded>;
}

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

/// The reference schema with every column nullable: a table maintained elsewhere may hold
/// NULLs where the spec says `required`, and a lookup must not fail on them.
pub(crate) fn nullable(layout: &TableLayout) -> datafusion::arrow::datatypes::SchemaRef {
    let fields: Vec<_> = layout
        .arrow_schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(datafusion::arrow::datatypes::Schema::new(fields))
}

struct Cached {
    version: Option<String>,
    rows: Arc<RecordBatch>,
    generation: u64,
    checked_at_ms: i64,
}

/// The loaded copies of the reference tables a pipeline's derived tables join to.
pub(crate) struct References {
    specs: Vec<(ReferenceSpec, Arc<TableLayout>)>,
    source: Option<Arc<dyn ReferenceSource>>,
    cache: Mutex<HashMap<String, Cached>>,
    generations: std::sync::atomic::AtomicU64,
}

impl References {
    pub fn new(specs: Vec<(ReferenceSpec, Arc<TableLayout>)>) -> Self {
        References {
            specs,
            source: None,
            cache: Mutex::new(HashMap::new()),
            generations: std::sync::atomic::AtomicU64::new(1),
        }
    }

    pub fn set_source(&mut self, source: Arc<dyn ReferenceSource>) {
        self.source = Some(source);
    }

    /// Reads every reference table not read yet, and re-reads those whose refresh interval has
    /// passed.
    pub async fn refresh(&self, now_ms: i64) -> Result<()> {
        for (spec, layout) in &self.specs {
            let known = {
                let cache = self.cache.lock().map_err(|_| poisoned())?;
                match cache.get(&spec.name) {
                    Some(c) if now_ms - c.checked_at_ms < spec.refresh_seconds as i64 * 1000 => {
                        continue;
                    }
                    Some(c) => Some(c.version.clone()),
                    None => None,
                }
            };
            let Some(source) = &self.source else {
                return Err(Error::Config(format!(
                    "reference table {} cannot be read: this ingestor has no catalog",
                    spec.name
                )));
            };
            let loaded = source
                .load(spec, layout, known.as_ref().and_then(|v| v.as_deref()))
                .await;
            let mut cache = self.cache.lock().map_err(|_| poisoned())?;
            let generation = self
                .generations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match loaded {
                Ok(Loaded::Unchanged) => {
                    if let Some(c) = cache.get_mut(&spec.name) {
                        c.checked_at_ms = now_ms;
                    }
                }
                Ok(Loaded::Missing) => {
                    if known.as_ref().is_none_or(|v| v.is_some()) {
                        tracing::warn!(table = %spec.name,
                            "reference table does not exist; lookups into it find nothing until it is created");
                    }
                    let empty = RecordBatch::new_empty(nullable(layout));
                    cache.insert(
                        spec.name.clone(),
                        Cached {
                            version: None,
                            rows: Arc::new(empty),
                            generation,
                            checked_at_ms: now_ms,
                        },
                    );
                }
                Ok(Loaded::Rows { version, rows }) => {
                    tracing::info!(table = %spec.name, rows = rows.num_rows(), "reference table loaded");
                    cache.insert(
                        spec.name.clone(),
                        Cached {
                            version: Some(version),
                            rows: Arc::new(rows),
                            generation,
                            checked_at_ms: now_ms,
                        },
                    );
                }
                Err(e) if known.is_some() => {
                    tracing::warn!(table = %spec.name, error = %e,
                        "reference table could not be re-read; the loaded copy stays in use");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The loaded rows of `name` and their generation (which changes with every new copy).
    pub fn get(&self, name: &str) -> Option<(u64, Arc<RecordBatch>)> {
        let cache = self.cache.lock().ok()?;
        cache.get(name).map(|c| (c.generation, c.rows.clone()))
    }
}

fn poisoned() -> Error {
    Error::Internal("reference table cache poisoned".into())
}

/// Appends `rows` (in the reference table's declared columns) to reference table `name` as
/// one snapshot, creating the table if needed. The demo and the tests fill reference tables
/// this way; in production analysts maintain them with their own engine.
pub async fn append_rows(
    backend: &crate::config::Backend,
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
    let files = crate::ingest::encode::encode(
        &def.layout,
        &rows,
        &location,
        &stem,
        &crate::ingest::encode::micro_file_properties(),
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
