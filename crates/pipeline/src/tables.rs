//! The tables of a pipeline: their layouts, their creation on first use, and the check that a
//! catalog table still matches the spec before files are committed to it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use iceberg::spec::{FormatVersion, Schema};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::schema::evolve::{self, SchemaPlan};
use crate::schema::{TableLayout, describe_partitioning};
use crate::spec::{DEAD_LETTER_TABLE, PipelineSpec, TableSpec};
pub use crate::table::properties::{VIEW_NAME_PROPERTY, VIEW_SQL_PROPERTY, table_properties};

/// One table: its layout and its target file size.
#[derive(Debug, Clone)]
pub struct TableDef {
    /// Schema, partition spec and Arrow schema.
    pub layout: Arc<TableLayout>,
    /// The compaction target.
    pub target_file_size_bytes: u64,
    /// For a windowed table's partial rows: the view analysts query (kept in the table's
    /// properties, where `streamtable query` finds it).
    pub view: Option<crate::spec::ViewSpec>,
    /// The table's spec, which its schema evolves to (`None`: the dead-letter table and
    /// reference tables, whose columns streamtable fixes or analysts own).
    pub spec: Option<TableSpec>,
}

/// Every table of a pipeline, the dead-letter table included, by name.
#[derive(Debug, Clone)]
pub struct TableSet {
    /// The Iceberg namespace (Glue database).
    pub namespace: String,
    /// The tables by name.
    pub tables: BTreeMap<String, TableDef>,
    /// The reference tables by name: created (empty) when missing, never written, compacted
    /// or expired by the pipeline (analysts maintain them).
    pub references: BTreeMap<String, TableDef>,
    /// The topics with a table of their own (`land`), and that table.
    pub topic_tables: BTreeMap<String, String>,
    /// The interval joins the commit stage runs, by the table they land.
    pub joins: Vec<(String, crate::spec::IntervalJoin)>,
    /// The spec, when some topic's partitions keep window state: the scheduled stage closes
    /// idle partitions' windows with it ([`crate::ingest::Ingestor::flush_idle`]).
    pub windowed_spec: Option<Arc<PipelineSpec>>,
    /// The spec's `max_record_bytes`: what a value the interval joins make may have.
    pub max_record_bytes: usize,
}

impl TableSet {
    /// The tables of `spec` (and `dead_letters`) in `namespace`.
    pub fn new(spec: &PipelineSpec, namespace: &str) -> Result<TableSet> {
        let mut tables = BTreeMap::new();
        for t in spec.landed_tables() {
            tables.insert(
                t.name.clone(),
                TableDef {
                    layout: Arc::new(TableLayout::for_table(t)?),
                    target_file_size_bytes: t.target_file_size_mb * 1024 * 1024,
                    view: spec
                        .derived
                        .iter()
                        .find(|d| d.table.name == t.name)
                        .and_then(|d| d.view.clone()),
                    spec: Some(t.clone()),
                },
            );
        }
        tables.insert(
            DEAD_LETTER_TABLE.to_string(),
            TableDef {
                layout: Arc::new(TableLayout::dead_letters()?),
                target_file_size_bytes: spec.settings.target_file_size_mb * 1024 * 1024,
                view: None,
                spec: None,
            },
        );
        let mut references = BTreeMap::new();
        for r in &spec.references {
            references.insert(
                r.name.clone(),
                TableDef {
                    layout: Arc::new(TableLayout::for_reference(r)?),
                    target_file_size_bytes: spec.settings.target_file_size_mb * 1024 * 1024,
                    view: None,
                    spec: None,
                },
            );
        }
        Ok(TableSet {
            namespace: namespace.to_string(),
            tables,
            references,
            topic_tables: spec
                .tables
                .iter()
                .filter(|t| t.land)
                .map(|t| (t.topic.clone(), t.name.clone()))
                .collect(),
            joins: spec
                .derived
                .iter()
                .filter_map(|d| d.join.clone().map(|j| (d.table.name.clone(), j)))
                .collect(),
            windowed_spec: spec
                .derived
                .iter()
                .any(|d| d.view.is_some())
                .then(|| Arc::new(spec.clone())),
            max_record_bytes: spec.settings.max_record_bytes,
        })
    }

    /// The Iceberg identifier of `table`.
    pub fn ident(&self, table: &str) -> TableIdent {
        TableIdent::new(
            NamespaceIdent::new(self.namespace.clone()),
            table.to_string(),
        )
    }

    /// A table of the set, or an error naming it.
    pub fn get(&self, table: &str) -> Result<&TableDef> {
        self.tables.get(table).ok_or_else(|| {
            Error::Config(format!(
                "table {table:?} has pending files but is not in the pipeline spec; restore its [[tables]] entry"
            ))
        })
    }

    /// Creates every missing table (Iceberg v2, the spec's partitioning, ZSTD, target size).
    pub async fn ensure_all(&self, backend: &Backend) -> Result<()> {
        for name in self.tables.keys() {
            self.ensure(backend, name).await?;
        }
        self.ensure_references(backend).await
    }

    /// Creates every missing reference table, empty, with its declared columns (an existing
    /// one is left as it is: analysts own it).
    pub async fn ensure_references(&self, backend: &Backend) -> Result<()> {
        for (name, def) in &self.references {
            let creation = TableCreation::builder()
                .name(name.clone())
                .schema(def.layout.schema.as_ref().clone())
                .format_version(FormatVersion::V2)
                .properties(table_properties(def.target_file_size_bytes))
                .build();
            backend
                .catalog
                .create_if_absent(&self.namespace, creation)
                .await?;
        }
        Ok(())
    }

    /// Table `name`'s layout as the catalog has it (field ids after evolution), checked to have
    /// the spec's columns.
    pub fn catalog_layout(&self, name: &str, table: &Table) -> Result<TableLayout> {
        let metadata = table.metadata();
        let layout = TableLayout::of_table(
            name,
            metadata.current_schema().clone(),
            metadata.default_partition_spec().clone(),
        )?;
        // A table may keep `kafka_headers` after its spec stopped asking for them.
        if !layout.fits(&self.get(name)?.layout) {
            return Err(Error::Config(format!(
                "table {name}: the catalog's columns are not the spec's; `streamtable check` shows the difference"
            )));
        }
        Ok(layout)
    }

    /// The table, created from the spec if it does not exist yet.
    pub async fn ensure(&self, backend: &Backend, name: &str) -> Result<Table> {
        let def = self.get(name)?;
        let creation = TableCreation::builder()
            .name(name.to_string())
            .schema(def.layout.schema.as_ref().clone())
            .partition_spec(def.layout.partition_spec.as_ref().clone().into_unbound())
            .format_version(FormatVersion::V2)
            .properties(def.properties())
            .build();
        let table = backend
            .catalog
            .create_if_absent(&self.namespace, creation)
            .await?;
        check_partition_spec(name, &table, &def.layout)?;
        let table = match &def.spec {
            Some(spec) => evolve_table(backend, &self.ident(name), spec, table).await?,
            None => {
                check_schema(name, table.metadata().current_schema(), &def.layout.schema)?;
                table
            }
        };
        if let Some(v) = &def.view {
            backend
                .catalog
                .pointers()
                .ensure_view(&self.namespace, v)
                .await?;
        }
        Ok(table)
    }
}

impl TableDef {
    /// The properties the table is created with.
    pub fn properties(&self) -> HashMap<String, String> {
        let mut p = table_properties(self.target_file_size_bytes);
        if let Some(v) = &self.view {
            p.insert(VIEW_NAME_PROPERTY.into(), v.name.clone());
            p.insert(VIEW_SQL_PROPERTY.into(), v.sql.clone());
        }
        p
    }
}

/// How many times a schema change is retried against other writers.
const EVOLVE_ATTEMPTS: u32 = 8;

/// The plan of `spec` against `table` as the catalog has it.
pub fn plan_for(table: &Table, spec: &TableSpec) -> SchemaPlan {
    let metadata = table.metadata();
    let sources: Vec<i32> = metadata
        .default_partition_spec()
        .fields()
        .iter()
        .map(|f| f.source_id)
        .collect();
    evolve::plan(
        metadata.current_schema(),
        metadata.last_column_id(),
        &sources,
        spec,
    )
}

/// Evolves `table` to `spec` (new optional columns, widened types, renames, relaxed and dropped
/// columns) through a metadata commit, or refuses with what to do instead. Two writers that
/// evolve the same table to the same spec compute the same schema: the loser of the swap
/// reloads and finds nothing left to do.
pub async fn evolve_table(
    backend: &Backend,
    ident: &TableIdent,
    spec: &TableSpec,
    mut table: Table,
) -> Result<Table> {
    let name = ident.name();
    let gone = || Error::Config(format!("table {name} disappeared"));
    // The pointer `table` was loaded with, once known (a caller's table comes without it).
    let mut pointer = None;
    for attempt in 0..EVOLVE_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(crate::clock::jitter(20u64 << attempt.min(6))).await;
            let (t, p) = backend.catalog.load(ident).await?.ok_or_else(gone)?;
            (table, pointer) = (t, Some(p));
        }
        let plan = plan_for(&table, spec);
        if let Some(refused) = plan.refusal_error(name) {
            return Err(refused);
        }
        let Some(evolved) = plan.evolved else {
            return Ok(table);
        };
        let pointer = match pointer.take() {
            Some(p) => p,
            None => {
                let (t, p) = backend.catalog.load(ident).await?.ok_or_else(gone)?;
                if t.metadata_location() != table.metadata_location() {
                    continue; // changed since the caller loaded it: plan again
                }
                p
            }
        };
        let metadata = table
            .metadata()
            .clone()
            .into_builder(Some(pointer.metadata_location.clone()))
            .add_current_schema(evolved)
            .and_then(|b| b.build())
            .map_err(|e| Error::iceberg(format!("evolve the schema of {name}"), e))?
            .metadata;
        match backend
            .catalog
            .commit_metadata(&table, &pointer, metadata)
            .await
        {
            Ok(Some(t)) => {
                let changes: Vec<String> = plan.changes.iter().map(ToString::to_string).collect();
                tracing::info!(table = name, changes = ?changes, schema_id = t.metadata().current_schema_id(),
                    "table schema evolved to the spec");
                return Ok(t);
            }
            Ok(None) | Err(Error::CommitStateUnknown { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::CommitContention {
        table: name.to_string(),
        attempts: EVOLVE_ATTEMPTS,
    })
}

/// Refuses a table whose partitioning is not the spec's: files written for one layout must
/// never be registered with the metadata of another.
pub fn check_partition_spec(name: &str, table: &Table, layout: &TableLayout) -> Result<()> {
    let metadata = table.metadata();
    let have = describe_partitioning(metadata.default_partition_spec(), metadata.current_schema());
    let want = layout.partitioning();
    if have == want {
        return Ok(());
    }
    Err(Error::Config(format!(
        "table {name} in the catalog is partitioned by {have:?} but the pipeline spec says partition_by = {want:?}; \
         changing the partitioning of an existing table is not supported: restore partition_by = {have:?}, \
         or give the new layout a new table name"
    )))
}

/// Refuses to commit into a table (whose columns streamtable fixes) that no longer has them.
pub fn check_schema(table: &str, actual: &Schema, expected: &Schema) -> Result<()> {
    let a = actual.as_struct().fields();
    let e = expected.as_struct().fields();
    let same = a.len() == e.len()
        && a.iter().zip(e).all(|(x, y)| {
            x.id == y.id
                && x.name == y.name
                && x.field_type == y.field_type
                && x.required == y.required
        });
    if same {
        return Ok(());
    }
    let show = |fs: &[iceberg::spec::NestedFieldRef]| {
        fs.iter()
            .map(|f| {
                format!(
                    "{}:{}{}",
                    f.name,
                    f.field_type,
                    if f.required { "!" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(Error::Config(format!(
        "table {table} in the catalog has columns [{}] but the pipeline spec says [{}]; \
         this table's columns are fixed by streamtable: restore them, or drop the table so that it is created again",
        show(a),
        show(e)
    )))
}
