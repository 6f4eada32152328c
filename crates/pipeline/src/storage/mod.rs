//! The warehouse: where table data and metadata live (S3, or a local directory).
//!
//! Both backends are Iceberg `FileIO`s, so the Iceberg writers and readers use them directly;
//! [`Warehouse`] adds what streamtable needs on top: table locations, atomic whole-object
//! writes, and listing (for orphan clean-up).

pub mod local;
#[cfg(feature = "aws")]
pub mod s3;
#[cfg(feature = "aws")]
mod s3_multipart;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use iceberg::io::{FileIO, FileIOBuilder, LocalFsStorageFactory};

use crate::error::{Error, Result};
#[cfg(feature = "aws")]
use s3::{S3Storage, S3StorageFactory};

/// The Iceberg namespace (Glue database) of every table.
pub const DEFAULT_NAMESPACE: &str = "streamtable";

/// An object in the warehouse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Its location (`s3://…` or an absolute path).
    pub location: String,
    /// Its size in bytes.
    pub size: u64,
    /// Last modification, epoch milliseconds.
    pub modified_ms: i64,
}

/// Whole objects in the warehouse: what streamtable writes, reads, lists and deletes itself
/// (Iceberg's readers and writers go through the [`FileIO`]). One implementation per backend:
/// [`local::LocalStore`] and [`s3::S3Storage`].
#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// Writes a whole object; a reader never sees it half written.
    async fn write(&self, location: &str, bytes: Bytes) -> Result<()>;
    /// Reads a whole object.
    async fn read(&self, location: &str) -> Result<Bytes>;
    /// Deletes an object; a missing object is not an error.
    async fn delete(&self, location: &str) -> Result<()>;
    /// Every object under a location prefix (recursively), sorted by location.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    /// The object's size and age, or `None` if it does not exist.
    async fn stat(&self, location: &str) -> Result<Option<ObjectInfo>>;
}

/// Table storage: a root location, the `FileIO` that reaches it, and the [`ObjectStore`].
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: String,
    file_io: FileIO,
    store: Arc<dyn ObjectStore>,
}

impl Warehouse {
    /// A warehouse in a local directory (created if absent). Locations are absolute paths.
    pub fn local(dir: &Path) -> Result<Warehouse> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io("create warehouse directory", dir, e))?;
        let dir = dir
            .canonicalize()
            .map_err(|e| Error::io("resolve warehouse directory", dir, e))?;
        let root = dir
            .to_str()
            .ok_or_else(|| Error::Config(format!("warehouse path {} is not UTF-8", dir.display())))?
            .trim_end_matches('/')
            .to_string();
        Ok(Warehouse {
            root,
            file_io: FileIOBuilder::new(Arc::new(LocalFsStorageFactory)).build(),
            store: Arc::new(local::LocalStore),
        })
    }

    /// A warehouse at `s3://bucket/prefix` on an SDK client built once by the caller.
    #[cfg(feature = "aws")]
    pub fn s3(client: aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Warehouse {
        let prefix = prefix.trim_matches('/');
        let root = if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{prefix}")
        };
        Warehouse {
            root,
            file_io: FileIOBuilder::new(Arc::new(S3StorageFactory::new(client.clone()))).build(),
            store: Arc::new(S3Storage::new(client)),
        }
    }

    /// A warehouse on explicit parts (tests wrap them to inject faults).
    pub fn with_parts(
        root: impl Into<String>,
        file_io: FileIO,
        store: Arc<dyn ObjectStore>,
    ) -> Self {
        Warehouse {
            root: root.into(),
            file_io,
            store,
        }
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The warehouse root location.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The Iceberg `FileIO` for this warehouse.
    pub fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    /// Where a table lives: `{root}/{namespace}.db/{table}`.
    pub fn table_location(&self, namespace: &str, table: &str) -> String {
        format!("{}/{namespace}.db/{table}", self.root)
    }

    /// Writes a whole object (atomically: a crash never leaves a torn object).
    pub async fn write(&self, location: &str, bytes: Bytes) -> Result<()> {
        self.store.write(location, bytes).await
    }

    /// Reads a whole object.
    pub async fn read(&self, location: &str) -> Result<Bytes> {
        self.store.read(location).await
    }

    /// Deletes an object; a missing object is not an error.
    pub async fn delete(&self, location: &str) -> Result<()> {
        self.store.delete(location).await
    }

    /// The object's size and age, or `None` if it does not exist.
    pub async fn stat(&self, location: &str) -> Result<Option<ObjectInfo>> {
        self.store.stat(location).await
    }

    /// Lists every object under a location prefix (recursively).
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.store.list(prefix).await
    }
}

#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub(crate) fn object_error(op: &'static str, location: &str, e: iceberg::Error) -> Error {
    Error::ObjectStore {
        op,
        location: location.to_string(),
        retryable: e.retryable(),
        message: e.to_string(),
    }
}
