//! The Iceberg catalog: where each table's current metadata file is, swapped atomically.
//!
//! A catalog is, at heart, one pointer per table (the current metadata location) and a
//! compare-and-set on it. [`PointerStore`] is exactly that, with two implementations: SQLite in
//! the schema shared by the Iceberg JDBC catalog and pyiceberg's `SqlCatalog`
//! ([`sqlite::SqlitePointers`]), and AWS Glue with `VersionId` optimistic locking
//! ([`glue::GluePointers`]). [`TableCatalog`] builds Iceberg's `Catalog` trait on top, so the
//! library's transactions (`fast_append`, `expire_snapshots`) and readers work unchanged, and
//! offers [`TableCatalog::commit_metadata`] for commits the library cannot build (compaction's
//! `replace`).

#[cfg(feature = "aws")]
pub mod glue;
pub mod register;
pub mod sqlite;

use std::collections::HashMap;
use std::fmt::Debug;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{
    Catalog, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, TableCommit, TableCreation,
    TableIdent,
};

use crate::error::{Error, Result};

/// A table's current metadata location and the token that guards it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// The location of the table's current metadata file.
    pub metadata_location: String,
    /// Glue's `VersionId`; `None` on SQLite (the location itself is compared).
    pub version: Option<String>,
}

/// One metadata pointer per table, with compare-and-set.
#[async_trait]
pub trait PointerStore: Send + Sync + Debug {
    /// Creates the namespace (Glue database) if it does not exist.
    async fn ensure_namespace(&self, namespace: &str) -> Result<()>;
    /// Every namespace.
    async fn list_namespaces(&self) -> Result<Vec<String>>;
    /// Every table of a namespace.
    async fn list_tables(&self, namespace: &str) -> Result<Vec<String>>;
    /// The table's pointer, or `None` if the table does not exist.
    async fn get(&self, namespace: &str, table: &str) -> Result<Option<Pointer>>;
    /// Registers a new table. `Ok(false)` if it already exists (possibly because an earlier
    /// attempt of this very call succeeded and its answer was lost).
    async fn create(
        &self,
        namespace: &str,
        table: &str,
        location: &str,
        metadata: &TableMetadata,
    ) -> Result<bool>;
    /// Points the table at `new_location` if it still is at `expected`. `Ok(false)` only when
    /// the swap certainly did not happen (the pointer had moved); an error means the outcome is
    /// unknown (the swap may have been applied and its answer lost).
    async fn swap(
        &self,
        namespace: &str,
        table: &str,
        expected: &Pointer,
        new_location: &str,
        metadata: &TableMetadata,
    ) -> Result<bool>;
    /// Removes the table's entry (not its files).
    async fn drop_table(&self, namespace: &str, table: &str) -> Result<()>;
    /// Registers `view` (or brings it up to date) where a catalog's SQL engines read views —
    /// Glue, for Athena. Catalogs without such engines keep nothing: `streamtable query` reads
    /// views from the partial table's properties.
    async fn ensure_view(&self, namespace: &str, view: &crate::spec::ViewSpec) -> Result<()> {
        let _ = (namespace, view);
        Ok(())
    }
}

/// Iceberg's `Catalog` over a [`PointerStore`] and a `FileIO`.
#[derive(Debug, Clone)]
pub struct TableCatalog {
    pointers: Arc<dyn PointerStore>,
    file_io: FileIO,
    /// Root under which new tables are placed (`{root}/{namespace}.db/{table}`).
    warehouse_root: String,
}

fn to_iceberg(e: Error) -> iceberg::Error {
    let retryable = e.is_retryable();
    iceberg::Error::new(ErrorKind::Unexpected, e.to_string()).with_retryable(retryable)
}

fn namespace_name(ns: &NamespaceIdent) -> String {
    ns.clone().inner().join(".")
}

impl TableCatalog {
    /// A catalog on `pointers`, reading and writing metadata through `file_io`; new tables go under `warehouse_root`.
    pub fn new(
        pointers: Arc<dyn PointerStore>,
        file_io: FileIO,
        warehouse_root: impl Into<String>,
    ) -> Self {
        TableCatalog {
            pointers,
            file_io,
            warehouse_root: warehouse_root.into(),
        }
    }

    /// The pointer store (for tests and tools).
    pub fn pointers(&self) -> &Arc<dyn PointerStore> {
        &self.pointers
    }

    /// The `FileIO` metadata and manifests are read and written with.
    pub fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    fn table(&self, ident: &TableIdent, location: &str, metadata: TableMetadata) -> Result<Table> {
        let runtime =
            iceberg::Runtime::try_current().map_err(|e| Error::iceberg("tokio runtime", e))?;
        Table::builder()
            .identifier(ident.clone())
            .metadata_location(location.to_string())
            .metadata(metadata)
            .file_io(self.file_io.clone())
            .runtime(runtime)
            .build()
            .map_err(|e| Error::iceberg(format!("load {ident}"), e))
    }

    /// Loads a table and the pointer it was loaded at; `None` if it does not exist.
    pub async fn load(&self, ident: &TableIdent) -> Result<Option<(Table, Pointer)>> {
        let ns = namespace_name(ident.namespace());
        let Some(pointer) = self.pointers.get(&ns, ident.name()).await? else {
            return Ok(None);
        };
        let metadata = TableMetadata::read_from(&self.file_io, &pointer.metadata_location)
            .await
            .map_err(|e| {
                Error::iceberg(
                    format!("read metadata of {ident} at {}", pointer.metadata_location),
                    e,
                )
            })?;
        let table = self.table(ident, &pointer.metadata_location, metadata)?;
        Ok(Some((table, pointer)))
    }

    /// Writes `metadata` as the table's next metadata file and swaps the pointer to it, if the
    /// pointer is still `expected`. Returns the new table, or `None` when another writer won (the
    /// written metadata file is then deleted).
    ///
    /// When the swap's outcome is unknown (an error, or Glue refusing what may be the SDK's
    /// repeat of a swap that succeeded), the pointer is read again: if it names the new metadata,
    /// or the table's history shows it was built on it, the commit happened. Otherwise the error
    /// is returned as [`Error::CommitStateUnknown`] and nothing is deleted: files whose commit
    /// may have happened are left to orphan clean-up, which deletes only what no snapshot
    /// references.
    pub async fn commit_metadata(
        &self,
        table: &Table,
        expected: &Pointer,
        metadata: TableMetadata,
    ) -> Result<Option<Table>> {
        let ident = table.identifier();
        // Every attempt of every swap: a snapshot this commit adds must not carry an id the
        // table's history (at the pointer swapped from) already has. The swap is a
        // compare-and-set on that very pointer, so an id can never land twice, whatever the
        // retries of the library's transactions or an overlapping committer do.
        if let Some(id) = repeated_commit_id(table.metadata(), &metadata) {
            return Err(Error::AlreadyCommitted {
                table: ident.to_string(),
                commit_id: id,
            });
        }
        let current = MetadataLocation::from_str(&expected.metadata_location)
            .map_err(|e| Error::iceberg(format!("metadata location of {ident}"), e))?;
        let next = current.with_next_version().with_new_metadata(&metadata);
        metadata
            .write_to(&self.file_io, &next)
            .await
            .map_err(|e| Error::iceberg(format!("write metadata of {ident}"), e))?;
        let next = next.to_string();
        let ns = namespace_name(ident.namespace());
        let swapped = self
            .pointers
            .swap(&ns, ident.name(), expected, &next, &metadata)
            .await;
        match swapped {
            Ok(true) => Ok(Some(self.table(ident, &next, metadata)?)),
            Ok(false) => {
                let _ = self.file_io.delete(&next).await;
                Ok(None)
            }
            Err(e) => match self.committed_after_all(ident, &next).await {
                Ok(true) => {
                    tracing::warn!(table = %ident, error = %e, metadata = %next,
                        "the swap reported an error, but the pointer shows it happened");
                    Ok(Some(self.table(ident, &next, metadata)?))
                }
                Ok(false) | Err(_) => Err(Error::CommitStateUnknown {
                    table: ident.to_string(),
                    metadata_location: next,
                    message: e.to_string(),
                }),
            },
        }
    }

    /// Whether the table's pointer names `location`, or names metadata whose history does.
    async fn committed_after_all(&self, ident: &TableIdent, location: &str) -> Result<bool> {
        let ns = namespace_name(ident.namespace());
        let Some(pointer) = self.pointers.get(&ns, ident.name()).await? else {
            return Ok(false);
        };
        if pointer.metadata_location == location {
            return Ok(true);
        }
        let current = TableMetadata::read_from(&self.file_io, &pointer.metadata_location)
            .await
            .map_err(|e| Error::iceberg(format!("read metadata of {ident}"), e))?;
        Ok(current
            .metadata_log()
            .iter()
            .any(|entry| entry.metadata_file == location))
    }

    /// Creates a table, or returns the existing one.
    pub async fn create_if_absent(
        &self,
        namespace: &str,
        creation: TableCreation,
    ) -> Result<Table> {
        let ident = TableIdent::new(
            NamespaceIdent::new(namespace.to_string()),
            creation.name.clone(),
        );
        if let Some((t, _)) = self.load(&ident).await? {
            return Ok(t);
        }
        self.pointers.ensure_namespace(namespace).await?;
        let location = creation
            .location
            .clone()
            .unwrap_or_else(|| format!("{}/{namespace}.db/{}", self.warehouse_root, creation.name));
        let creation = TableCreation {
            location: Some(location.clone()),
            ..creation
        };
        let metadata = TableMetadataBuilder::from_table_creation(creation)
            .and_then(|b| b.build())
            .map_err(|e| Error::iceberg(format!("new table {ident}"), e))?
            .metadata;
        let metadata_location = MetadataLocation::new_with_metadata(location.clone(), &metadata);
        metadata
            .write_to(&self.file_io, &metadata_location)
            .await
            .map_err(|e| Error::iceberg(format!("write metadata of {ident}"), e))?;
        let created = self
            .pointers
            .create(
                namespace,
                ident.name(),
                &metadata_location.to_string(),
                &metadata,
            )
            .await?;
        if !created {
            // Someone created it first, or this very call did and its answer was lost: delete
            // the file only when the table does not point at it.
            let ours = metadata_location.to_string();
            let pointer = self.pointers.get(namespace, ident.name()).await?;
            if pointer.is_some_and(|p| p.metadata_location != ours) {
                let _ = self.file_io.delete(ours).await;
            }
        }
        match self.load(&ident).await? {
            Some((t, _)) => Ok(t),
            None => Err(Error::Internal(format!(
                "table {ident} vanished right after creation"
            ))),
        }
    }
}

/// Summary keys that identify a commit: a snapshot carrying one of them must be unique in a
/// table's history.
const COMMIT_IDS: [&str; 2] = [
    crate::table::COMMIT_ID_PROPERTY,
    crate::table::REPLACE_ID_PROPERTY,
];

/// The first commit id a snapshot new in `next` carries that a snapshot of `base` already has.
fn repeated_commit_id(base: &TableMetadata, next: &TableMetadata) -> Option<String> {
    let known: std::collections::HashSet<i64> = base.snapshots().map(|s| s.snapshot_id()).collect();
    for s in next
        .snapshots()
        .filter(|s| !known.contains(&s.snapshot_id()))
    {
        for key in COMMIT_IDS {
            let Some(id) = s.summary().additional_properties.get(key) else {
                continue;
            };
            let seen = base
                .snapshots()
                .any(|b| b.summary().additional_properties.get(key) == Some(id));
            if seen {
                return Some(id.clone());
            }
        }
    }
    None
}

#[async_trait]
impl Catalog for TableCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        if parent.is_some() {
            return Ok(Vec::new());
        }
        let names = self.pointers.list_namespaces().await.map_err(to_iceberg)?;
        Ok(names.into_iter().map(NamespaceIdent::new).collect())
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        _properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.pointers
            .ensure_namespace(&namespace_name(namespace))
            .await
            .map_err(to_iceberg)?;
        Ok(Namespace::new(namespace.clone()))
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        if self.namespace_exists(namespace).await? {
            Ok(Namespace::new(namespace.clone()))
        } else {
            Err(iceberg::Error::new(
                ErrorKind::NamespaceNotFound,
                format!("no namespace {namespace:?}"),
            ))
        }
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        let names = self.pointers.list_namespaces().await.map_err(to_iceberg)?;
        Ok(names.contains(&namespace_name(namespace)))
    }

    async fn update_namespace(
        &self,
        _: &NamespaceIdent,
        _: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        Err(iceberg::Error::new(
            ErrorKind::FeatureUnsupported,
            "namespace properties are not managed by streamtable",
        ))
    }

    async fn drop_namespace(&self, _: &NamespaceIdent) -> iceberg::Result<()> {
        Err(iceberg::Error::new(
            ErrorKind::FeatureUnsupported,
            "dropping namespaces is not supported by streamtable",
        ))
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        let names = self
            .pointers
            .list_tables(&namespace_name(namespace))
            .await
            .map_err(to_iceberg)?;
        Ok(names
            .into_iter()
            .map(|n| TableIdent::new(namespace.clone(), n))
            .collect())
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        if self.table_exists(&ident).await? {
            return Err(iceberg::Error::new(
                ErrorKind::TableAlreadyExists,
                format!("table {ident} exists"),
            ));
        }
        self.create_if_absent(&namespace_name(namespace), creation)
            .await
            .map_err(to_iceberg)
    }

    async fn load_table(&self, ident: &TableIdent) -> iceberg::Result<Table> {
        match self.load(ident).await.map_err(to_iceberg)? {
            Some((t, _)) => Ok(t),
            None => Err(iceberg::Error::new(
                ErrorKind::TableNotFound,
                format!("no table {ident}"),
            )),
        }
    }

    async fn drop_table(&self, ident: &TableIdent) -> iceberg::Result<()> {
        self.pointers
            .drop_table(&namespace_name(ident.namespace()), ident.name())
            .await
            .map_err(to_iceberg)
    }

    async fn purge_table(&self, ident: &TableIdent) -> iceberg::Result<()> {
        self.drop_table(ident).await
    }

    async fn table_exists(&self, ident: &TableIdent) -> iceberg::Result<bool> {
        let ns = namespace_name(ident.namespace());
        Ok(self
            .pointers
            .get(&ns, ident.name())
            .await
            .map_err(to_iceberg)?
            .is_some())
    }

    async fn rename_table(&self, _: &TableIdent, _: &TableIdent) -> iceberg::Result<()> {
        Err(iceberg::Error::new(
            ErrorKind::FeatureUnsupported,
            "renaming tables is not supported by streamtable",
        ))
    }

    async fn register_table(&self, _: &TableIdent, _: String) -> iceberg::Result<Table> {
        Err(iceberg::Error::new(
            ErrorKind::FeatureUnsupported,
            "registering tables is not supported by streamtable",
        ))
    }

    /// One optimistic attempt: apply the commit to the current metadata and swap. A lost race is
    /// a retryable `CatalogCommitConflicts`, which makes `Transaction::commit` reload and retry.
    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        let ident = commit.identifier().clone();
        let (table, pointer) = self
            .load(&ident)
            .await
            .map_err(to_iceberg)?
            .ok_or_else(|| {
                iceberg::Error::new(ErrorKind::TableNotFound, format!("no table {ident}"))
            })?;
        let staged = commit.apply(table.clone()).map_err(|e| {
            let retry = e.kind() == ErrorKind::CatalogCommitConflicts;
            e.with_retryable(retry)
        })?;
        let metadata = staged.metadata().clone();
        match self
            .commit_metadata(&table, &pointer, metadata)
            .await
            .map_err(to_iceberg)?
        {
            Some(t) => Ok(t),
            None => Err(iceberg::Error::new(
                ErrorKind::CatalogCommitConflicts,
                format!("{ident} was changed by another writer"),
            )
            .with_retryable(true)),
        }
    }
}
