//! Table pointers in SQLite (`catalog.db` of the embedded backend), in the schema of the Iceberg
//! JDBC catalog, which pyiceberg's `SqlCatalog` and iceberg-rust's SQL catalog also use: any of
//! them can open the catalog this writes. The swap is `UPDATE … WHERE metadata_location = ?`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use iceberg::spec::TableMetadata;
use rusqlite::{Connection, OptionalExtension, params};

use super::{Pointer, PointerStore};
use crate::error::{Error, Result};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS iceberg_tables (
    catalog_name VARCHAR(255) NOT NULL,
    table_namespace VARCHAR(255) NOT NULL,
    table_name VARCHAR(255) NOT NULL,
    metadata_location VARCHAR(1000),
    previous_metadata_location VARCHAR(1000),
    iceberg_type VARCHAR(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name)
);
CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
    catalog_name VARCHAR(255) NOT NULL,
    namespace VARCHAR(255) NOT NULL,
    property_key VARCHAR(255),
    property_value VARCHAR(1000),
    PRIMARY KEY (catalog_name, namespace, property_key)
);
";

/// Name of the catalog in the shared tables (pyiceberg: `SqlCatalog("streamtable", …)`).
pub const CATALOG_NAME: &str = "streamtable";

/// SQLite table pointers.
#[derive(Debug, Clone)]
pub struct SqlitePointers {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

fn db_error(op: &'static str, path: &Path, e: rusqlite::Error) -> Error {
    let busy = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    Error::State {
        op,
        message: format!("catalog {}: {e}", path.display()),
        retryable: busy,
    }
}

impl SqlitePointers {
    /// Opens (creating if needed) the catalog database.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io("create catalog directory", dir, e))?;
        }
        let conn = Connection::open(path).map_err(|e| db_error("open", path, e))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(|e| db_error("configure", path, e))?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| db_error("create schema", path, e))?;
        Ok(SqlitePointers {
            path: path.to_path_buf(),
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with_conn<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Path) -> Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| Error::Internal("catalog database lock poisoned".into()))?;
            f(&mut guard, &path)
        })
        .await
        .map_err(|e| Error::Internal(format!("catalog task failed: {e}")))?
    }
}

#[async_trait]
impl PointerStore for SqlitePointers {
    async fn ensure_namespace(&self, namespace: &str) -> Result<()> {
        let ns = namespace.to_string();
        self.with_conn(move |c, p| {
            c.execute(
                "INSERT OR IGNORE INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value)
                 VALUES (?1, ?2, 'exists', 'true')",
                params![CATALOG_NAME, ns],
            )
            .map(|_| ())
            .map_err(|e| db_error("create namespace", p, e))
        })
        .await
    }

    async fn list_namespaces(&self) -> Result<Vec<String>> {
        self.with_conn(|c, p| {
            let err = |e| db_error("list namespaces", p, e);
            let mut stmt = c
                .prepare(
                    "SELECT namespace FROM iceberg_namespace_properties WHERE catalog_name = ?1
                     UNION SELECT table_namespace FROM iceberg_tables WHERE catalog_name = ?1 ORDER BY 1",
                )
                .map_err(err)?;
            let rows = stmt.query_map([CATALOG_NAME], |r| r.get::<_, String>(0)).map_err(err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(err)
        })
        .await
    }

    async fn list_tables(&self, namespace: &str) -> Result<Vec<String>> {
        let ns = namespace.to_string();
        self.with_conn(move |c, p| {
            let err = |e| db_error("list tables", p, e);
            let mut stmt = c
                .prepare(
                    "SELECT table_name FROM iceberg_tables WHERE catalog_name = ?1 AND table_namespace = ?2
                     AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL) ORDER BY table_name",
                )
                .map_err(err)?;
            let rows = stmt.query_map(params![CATALOG_NAME, ns], |r| r.get::<_, String>(0)).map_err(err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(err)
        })
        .await
    }

    async fn get(&self, namespace: &str, table: &str) -> Result<Option<Pointer>> {
        let (ns, t) = (namespace.to_string(), table.to_string());
        self.with_conn(move |c, p| {
            c.query_row(
                "SELECT metadata_location FROM iceberg_tables
                 WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3",
                params![CATALOG_NAME, ns, t],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map(|row| {
                row.flatten().map(|metadata_location| Pointer {
                    metadata_location,
                    version: None,
                })
            })
            .map_err(|e| db_error("read table pointer", p, e))
        })
        .await
    }

    async fn create(
        &self,
        namespace: &str,
        table: &str,
        location: &str,
        _: &TableMetadata,
    ) -> Result<bool> {
        let (ns, t, loc) = (
            namespace.to_string(),
            table.to_string(),
            location.to_string(),
        );
        self.with_conn(move |c, p| {
            c.execute(
                "INSERT OR IGNORE INTO iceberg_tables
                 (catalog_name, table_namespace, table_name, metadata_location, iceberg_type)
                 VALUES (?1, ?2, ?3, ?4, 'TABLE')",
                params![CATALOG_NAME, ns, t, loc],
            )
            .map(|n| n == 1)
            .map_err(|e| db_error("create table", p, e))
        })
        .await
    }

    async fn swap(
        &self,
        namespace: &str,
        table: &str,
        expected: &Pointer,
        new_location: &str,
        _: &TableMetadata,
    ) -> Result<bool> {
        let (ns, t) = (namespace.to_string(), table.to_string());
        let (old, new) = (expected.metadata_location.clone(), new_location.to_string());
        self.with_conn(move |c, p| {
            c.execute(
                "UPDATE iceberg_tables SET metadata_location = ?1, previous_metadata_location = ?2
                 WHERE catalog_name = ?3 AND table_namespace = ?4 AND table_name = ?5
                   AND metadata_location = ?2",
                params![new, old, CATALOG_NAME, ns, t],
            )
            .map(|n| n == 1)
            .map_err(|e| db_error("swap table pointer", p, e))
        })
        .await
    }

    async fn drop_table(&self, namespace: &str, table: &str) -> Result<()> {
        let (ns, t) = (namespace.to_string(), table.to_string());
        self.with_conn(move |c, p| {
            c.execute(
                "DELETE FROM iceberg_tables WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3",
                params![CATALOG_NAME, ns, t],
            )
            .map(|_| ())
            .map_err(|e| db_error("drop table", p, e))
        })
        .await
    }
}
