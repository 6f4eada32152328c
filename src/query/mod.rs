//! SQL over the tables: DataFusion reading the catalog's Iceberg tables, read-only.
//!
//! Every table of the namespace is registered as a read-only snapshot view (optionally at a
//! given snapshot id or as of a time), in catalog `streamtable` under the namespace, which is
//! also the default schema: `SELECT * FROM orders` works as in Athena with the Glue database
//! selected. DDL, DML and other statements are refused, so a query never writes.

mod clock;
pub mod metadata;
mod sketches;

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::catalog::{MemoryCatalogProvider, MemorySchemaProvider, SchemaProvider};
use datafusion::datasource::MemTable;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_datafusion::IcebergStaticTableProvider;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// Catalog name the tables are registered under.
pub const CATALOG: &str = "streamtable";

/// Which version of the tables to read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimeTravel {
    /// The current snapshot of every table.
    #[default]
    Current,
    /// This snapshot, for the table that has it; the others at their current snapshot.
    Snapshot(i64),
    /// Every table as it was at this time (epoch milliseconds); empty if created later.
    AsOf(i64),
}

/// A SQL session over the tables of one namespace.
pub struct QueryEngine {
    ctx: SessionContext,
    /// The namespace's schema, where metadata tables are registered when a query names them.
    schema: Arc<MemorySchemaProvider>,
    /// Every table at its current metadata, for its metadata tables.
    current: std::collections::BTreeMap<String, Table>,
    /// Tables read as empty because they did not exist yet at the `--as-of` time, with when
    /// their first snapshot was committed (ms).
    not_yet: Vec<(String, i64)>,
    /// Views (windowed tables' merging views) by name, with the table of their partial rows.
    views: std::collections::BTreeMap<String, String>,
}

impl QueryEngine {
    /// Registers every table of the backend's namespace.
    pub async fn new(backend: &Backend, travel: TimeTravel) -> Result<QueryEngine> {
        let ns = backend.namespace.clone();
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG, &ns)
            .with_information_schema(true);
        let ctx = SessionContext::new_with_config(config);
        ctx.register_udaf(sketches::merge_sketches());
        ctx.register_udf(clock::now_udf(backend.clock.now_ms()));
        let schema = Arc::new(MemorySchemaProvider::new());
        let names = backend.catalog.pointers().list_tables(&ns).await?;
        let mut found_snapshot = false;
        let mut views = Vec::new();
        let mut current = std::collections::BTreeMap::new();
        let mut not_yet = Vec::new();
        let mut view_tables = std::collections::BTreeMap::new();
        for name in names {
            let ident = TableIdent::new(NamespaceIdent::new(ns.clone()), name.clone());
            let Some((table, _)) = backend.catalog.load(&ident).await? else {
                continue;
            };
            let props = table.metadata().properties();
            if let (Some(view), Some(sql)) = (
                props.get(crate::tables::VIEW_NAME_PROPERTY),
                props.get(crate::tables::VIEW_SQL_PROPERTY),
            ) {
                views.push((view.clone(), sql.clone()));
                view_tables.insert(view.clone(), name.clone());
            }
            current.insert(name.clone(), table.clone());
            let provider: Arc<dyn datafusion::catalog::TableProvider> =
                match travel {
                    TimeTravel::Current => Arc::new(static_provider(table, None).await?),
                    TimeTravel::Snapshot(id) if table.metadata().snapshot_by_id(id).is_some() => {
                        found_snapshot = true;
                        Arc::new(static_provider(table, Some(id)).await?)
                    }
                    TimeTravel::Snapshot(_) => Arc::new(static_provider(table, None).await?),
                    TimeTravel::AsOf(ms) => match snapshot_as_of(&table, ms) {
                        Some(id) => Arc::new(static_provider(table, Some(id)).await?),
                        None => {
                            let first = table
                                .metadata()
                                .history()
                                .iter()
                                .map(|e| e.timestamp_ms)
                                .min();
                            not_yet.push((name.clone(), first.unwrap_or(-1)));
                            let arrow = iceberg::arrow::schema_to_arrow_schema(
                                table.metadata().current_schema(),
                            )
                            .map_err(|e| Error::iceberg(format!("schema of {ident}"), e))?;
                            Arc::new(MemTable::try_new(Arc::new(arrow), vec![vec![]]).map_err(
                                |e| Error::Internal(format!("empty view of {ident}: {e}")),
                            )?)
                        }
                    },
                };
            schema
                .register_table(name.clone(), provider)
                .map_err(|e| Error::Internal(format!("register {ident}: {e}")))?;
        }
        if let TimeTravel::Snapshot(id) = travel
            && !found_snapshot
        {
            return Err(Error::Config(format!(
                "no table in namespace {ns} has snapshot {id}; `streamtable tables` lists current snapshots"
            )));
        }
        let catalog = Arc::new(MemoryCatalogProvider::new());
        datafusion::catalog::CatalogProvider::register_schema(
            catalog.as_ref(),
            &ns,
            schema.clone(),
        )
        .map_err(|e| Error::Internal(format!("register namespace {ns}: {e}")))?;
        ctx.register_catalog(CATALOG, catalog);
        // Windowed tables: the view merging their partial rows, under the derived table's name.
        for (name, sql) in views {
            let view = ctx
                .sql(&sql)
                .await
                .map_err(|e| Error::Internal(format!("view {name} ({sql}): {e}")))?
                .into_view();
            schema
                .register_table(name.clone(), view)
                .map_err(|e| Error::Internal(format!("register view {name}: {e}")))?;
        }
        Ok(QueryEngine {
            ctx,
            schema,
            current,
            not_yet,
            views: view_tables,
        })
    }

    /// The `name$kind` references in lower-case `sql`: each `$` between identifier characters.
    fn dollar_names(sql: &str) -> Vec<(String, String)> {
        let word = |c: char| c.is_alphanumeric() || c == '_';
        let mut out = Vec::new();
        for (at, _) in sql.match_indices('$') {
            let name: String = sql[..at]
                .chars()
                .rev()
                .take_while(|c| word(*c))
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let kind: String = sql[at + 1..].chars().take_while(|c| word(*c)).collect();
            if !name.is_empty() && !kind.is_empty() {
                out.push((name, kind));
            }
        }
        out
    }

    /// Whether `sql` reads a metadata table (which shows the current metadata, whatever
    /// `--as-of` or `--snapshot` say).
    pub fn reads_metadata(&self, sql: &str) -> bool {
        Self::dollar_names(&sql.to_lowercase())
            .iter()
            .any(|(name, kind)| {
                self.current.contains_key(name) && metadata::KINDS.contains(&kind.as_str())
            })
    }

    /// Tables the query reads as empty because they had no snapshot yet at the `--as-of`
    /// time, with when their first snapshot came (ms, -1: none yet), among those `sql` names.
    pub fn empty_as_of(&self, sql: &str) -> Vec<(String, i64)> {
        let lower = sql.to_lowercase();
        self.not_yet
            .iter()
            .filter(|(name, _)| {
                // The table, or a view over it (a windowed table's merging view).
                names(&lower, name)
                    || self
                        .views
                        .iter()
                        .any(|(view, table)| table == name && names(&lower, view))
            })
            .cloned()
            .collect()
    }

    /// Registers the metadata tables (`"orders$snapshots"`…) that `sql` names.
    async fn register_metadata_tables(&self, sql: &str) -> Result<()> {
        if !sql.contains('$') {
            return Ok(());
        }
        let lower = sql.to_lowercase();
        for (name, kind) in Self::dollar_names(&lower) {
            let full = format!("{name}${kind}");
            let kinds = metadata::KINDS.map(|k| format!("${k}")).join(", ");
            let Some(table) = self.current.get(&name) else {
                if let Some(partials) = self.views.get(&name) {
                    return Err(Error::Query(format!(
                        "{name} is a view (merging the partial rows of table {partials}): it has no metadata tables; its table's are \"{partials}${kind}\""
                    )));
                }
                continue;
            };
            if !metadata::KINDS.contains(&kind.as_str()) {
                return Err(Error::Query(format!(
                    "no metadata table \"{full}\": a table has {kinds}"
                )));
            }
            if self.schema.table_exist(&full) {
                continue;
            }
            let batch = metadata::of(table, &kind).await?;
            let mem = MemTable::try_new(batch.schema(), vec![vec![batch]])
                .map_err(|e| Error::Internal(format!("{full}: {e}")))?;
            self.schema
                .register_table(full.clone(), Arc::new(mem))
                .map_err(|e| Error::Internal(format!("register {full}: {e}")))?;
        }
        Ok(())
    }

    /// The tables (and views) the engine reads, as they were when it was made.
    pub fn tables(&self) -> Vec<String> {
        self.ctx
            .catalog(CATALOG)
            .into_iter()
            .flat_map(|c| {
                c.schema_names()
                    .into_iter()
                    .filter_map(move |n| c.schema(&n))
                    .flat_map(|schema| schema.table_names())
            })
            .collect()
    }

    /// Runs one read-only query. A SQL error says where in the statement it is.
    pub async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        self.register_metadata_tables(sql).await?;
        let options = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let df = self
            .ctx
            .sql_with_options(sql, options)
            .await
            .map_err(|e| Error::Query(describe_sql_error(sql, &e.to_string())))?;
        df.collect()
            .await
            .map_err(|e| Error::Query(describe_sql_error(sql, &e.to_string())))
    }
}

async fn static_provider(
    table: Table,
    snapshot: Option<i64>,
) -> Result<IcebergStaticTableProvider> {
    let name = table.identifier().to_string();
    let provider = match snapshot {
        Some(id) => IcebergStaticTableProvider::try_new_from_table_snapshot(table, id).await,
        None => IcebergStaticTableProvider::try_new_from_table(table).await,
    };
    provider.map_err(|e| Error::iceberg(format!("open {name} for reading"), e))
}

/// Whether lower-case `sql` names table `name` (as a whole word).
fn names(sql: &str, name: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    sql.match_indices(name).any(|(at, _)| {
        let before = sql[..at].chars().next_back();
        let after = sql[at + name.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// The snapshot that was current at `ms` (from the snapshot log), if any.
pub fn snapshot_as_of(table: &Table, ms: i64) -> Option<i64> {
    table
        .metadata()
        .history()
        .iter()
        .filter(|e| e.timestamp_ms <= ms)
        .max_by_key(|e| e.timestamp_ms)
        .map(|e| e.snapshot_id)
}

/// The error message, plus the statement with a caret under the position it names
/// (DataFusion's parser says `at Line: L, Column: C`).
pub fn describe_sql_error(sql: &str, message: &str) -> String {
    let position = message.rfind("Line: ").and_then(|i| {
        let rest = &message[i + 6..];
        let (line, rest) = rest.split_once(", Column: ")?;
        let col: String = rest.chars().take_while(char::is_ascii_digit).collect();
        Some((
            line.trim().parse::<usize>().ok()?,
            col.parse::<usize>().ok()?,
        ))
    });
    if message.contains("DML not supported")
        || message.contains("DDL not supported")
        || message.contains("Statement not supported")
    {
        return format!("{message}: streamtable query is read-only");
    }
    match position {
        Some((line, col)) if line >= 1 => {
            let text = sql.lines().nth(line - 1).unwrap_or_default();
            format!(
                "{message}\n  {text}\n  {}^",
                " ".repeat(col.saturating_sub(1))
            )
        }
        _ => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_errors_point_at_their_column() {
        let msg = "SQL error: ParserError(\"Expected: end of statement, found: FORM at Line: 1, Column: 10\")";
        let shown = describe_sql_error("SELECT 1 FORM orders", msg);
        assert!(
            shown.ends_with("  SELECT 1 FORM orders\n           ^"),
            "{shown}"
        );
    }

    #[test]
    fn messages_without_a_position_are_kept() {
        assert_eq!(
            describe_sql_error("SELECT x", "Schema error: No field named x"),
            "Schema error: No field named x"
        );
    }
}
