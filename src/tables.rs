//! The tables of a pipeline: their layouts, their creation on first use, and the check that a
//! catalog table still matches the spec before files are committed to it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use iceberg::spec::{FormatVersion, Schema};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use crate::config::Backend;
use crate::error::{Error, Result};
use crate::schema::{TableLayout, describe_partitioning};
use crate::spec::{DEAD_LETTER_TABLE, KAFKA_COLUMNS, PipelineSpec};

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
    /// The interval joins the commit stage runs, by the table they land.
    pub joins: Vec<(String, crate::spec::IntervalJoin)>,
    /// The spec, when some topic's partitions keep window state: the scheduled stage closes
    /// idle partitions' windows with it ([`crate::ingest::Ingestor::flush_idle`]).
    pub windowed_spec: Option<Arc<PipelineSpec>>,
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
                },
            );
        }
        tables.insert(
            DEAD_LETTER_TABLE.to_string(),
            TableDef {
                layout: Arc::new(TableLayout::dead_letters()?),
                target_file_size_bytes: spec.settings.target_file_size_mb * 1024 * 1024,
                view: None,
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
                },
            );
        }
        Ok(TableSet {
            namespace: namespace.to_string(),
            tables,
            references,
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
        let table = add_missing_kafka_columns(backend, name, table, &def.layout.schema).await?;
        check_schema(name, table.metadata().current_schema(), &def.layout.schema)?;
        check_partition_spec(name, &table, &def.layout)?;
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

/// Table property: the view over a windowed table's partial rows (its name).
pub const VIEW_NAME_PROPERTY: &str = "streamtable.view.name";
/// Table property: the view's SQL.
pub const VIEW_SQL_PROPERTY: &str = "streamtable.view.sql";

/// Properties of every table streamtable creates.
pub fn table_properties(target_file_size_bytes: u64) -> HashMap<String, String> {
    HashMap::from([
        ("write.format.default".into(), "parquet".into()),
        ("write.parquet.compression-codec".into(), "zstd".into()),
        (
            "write.target-file-size-bytes".into(),
            target_file_size_bytes.to_string(),
        ),
        ("streamtable.managed".into(), "true".into()),
    ])
}

/// Adds the Kafka columns a table created by an earlier release lacks (`kafka_key_bytes`): the
/// table's columns are then the spec's columns plus a suffix of the Kafka columns, and the next
/// field id the table assigns is the one the layout (and every file ingest writes) uses.
async fn add_missing_kafka_columns(
    backend: &Backend,
    name: &str,
    table: Table,
    expected: &Schema,
) -> Result<Table> {
    let actual = table.metadata().current_schema().as_struct().fields();
    let wanted = expected.as_struct().fields();
    if actual.len() >= wanted.len() {
        return Ok(table);
    }
    let (prefix, missing) = wanted.split_at(actual.len());
    let is_prefix = actual
        .iter()
        .zip(prefix)
        .all(|(a, e)| a.id == e.id && a.name == e.name && a.field_type == e.field_type);
    let ids_follow = missing
        .iter()
        .enumerate()
        .all(|(i, f)| f.id == table.metadata().last_column_id() + 1 + i as i32);
    let kafka_only = missing
        .iter()
        .all(|f| KAFKA_COLUMNS.contains(&f.name.as_str()) && !f.required);
    if !(is_prefix && ids_follow && kafka_only) {
        return Ok(table); // check_schema explains the difference
    }
    let mut update = Transaction::new(&table).update_schema();
    for f in missing {
        let column = match &f.doc {
            Some(doc) => AddColumn::builder()
                .name(f.name.clone())
                .field_type(f.field_type.as_ref().clone())
                .doc(doc.clone())
                .build(),
            None => AddColumn::optional(&f.name, f.field_type.as_ref().clone()),
        };
        update = update.add_column(column);
    }
    let tx = update
        .apply(Transaction::new(&table))
        .map_err(|e| Error::iceberg(format!("add Kafka columns to {name}"), e))?;
    let table = tx
        .commit(&backend.catalog)
        .await
        .map_err(|e| Error::iceberg(format!("add Kafka columns to {name}"), e))?;
    let added: Vec<&str> = missing.iter().map(|f| f.name.as_str()).collect();
    tracing::info!(table = name, columns = ?added, "added the Kafka columns of this release");
    Ok(table)
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

/// Refuses to commit into a table whose schema no longer matches the spec's.
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
         the spec's columns of an existing table can only change once schema evolution is supported",
        show(a),
        show(e)
    )))
}
