//! The warehouse: where table data and metadata live (S3, or a local directory).
//!
//! Both backends are Iceberg `FileIO`s, so the Iceberg writers and readers use them directly;
//! [`Warehouse`] adds what streamtable needs on top: table locations, atomic whole-object
//! writes, and listing (for orphan clean-up).

pub mod s3;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use iceberg::io::{FileIO, FileIOBuilder, LocalFsStorageFactory};

use crate::error::{Error, Result};
use s3::{S3Storage, S3StorageFactory};

/// The Iceberg namespace (Glue database) of every table.
pub const DEFAULT_NAMESPACE: &str = "streamtable";

/// An object in the warehouse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub location: String,
    pub size: u64,
    /// Last modification, epoch milliseconds.
    pub modified_ms: i64,
}

#[derive(Debug, Clone)]
enum Backend {
    Local,
    S3(S3Storage),
}

/// Table storage: a root location and the `FileIO` that reaches it.
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: String,
    file_io: FileIO,
    backend: Backend,
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
            backend: Backend::Local,
        })
    }

    /// A warehouse at `s3://bucket/prefix` on an SDK client built once by the caller.
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
            backend: Backend::S3(S3Storage::new(client)),
        }
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

    /// Writes a whole object. On the local backend the file appears atomically (write to a
    /// temporary name, then rename), so a crash never leaves a torn file under the final name.
    pub async fn write(&self, location: &str, bytes: Bytes) -> Result<()> {
        match &self.backend {
            Backend::Local => {
                let path = PathBuf::from(location);
                let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("object");
                static TMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = TMP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
                tokio::fs::create_dir_all(&dir)
                    .await
                    .map_err(|e| Error::io("create directory", &dir, e))?;
                tokio::fs::write(&tmp, &bytes)
                    .await
                    .map_err(|e| Error::io("write", &tmp, e))?;
                tokio::fs::rename(&tmp, &path)
                    .await
                    .map_err(|e| Error::io("rename", &path, e))
            }
            Backend::S3(_) => {
                let out = self
                    .file_io
                    .new_output(location)
                    .map_err(|e| Error::iceberg(format!("write {location}"), e))?;
                out.write(bytes)
                    .await
                    .map_err(|e| object_error("write", location, e))
            }
        }
    }

    /// Reads a whole object.
    pub async fn read(&self, location: &str) -> Result<Bytes> {
        let input = self
            .file_io
            .new_input(location)
            .map_err(|e| Error::iceberg(format!("read {location}"), e))?;
        input
            .read()
            .await
            .map_err(|e| object_error("read", location, e))
    }

    /// Deletes an object; a missing object is not an error.
    pub async fn delete(&self, location: &str) -> Result<()> {
        match &self.backend {
            Backend::Local => match tokio::fs::remove_file(location).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io("delete", location, e))
                }
                _ => Ok(()),
            },
            Backend::S3(_) => self
                .file_io
                .delete(location)
                .await
                .map_err(|e| object_error("delete", location, e)),
        }
    }

    /// The object's size and age, or `None` if it does not exist.
    pub async fn stat(&self, location: &str) -> Result<Option<ObjectInfo>> {
        match &self.backend {
            Backend::Local => match tokio::fs::metadata(location).await {
                Ok(meta) => Ok(Some(ObjectInfo {
                    location: location.to_string(),
                    size: meta.len(),
                    modified_ms: modified_ms(&meta),
                })),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::io("stat", location, e)),
            },
            Backend::S3(s) => Ok(s
                .head(location)
                .await
                .map_err(|e| object_error("stat", location, e))?
                .map(|(size, modified_ms)| ObjectInfo {
                    location: location.to_string(),
                    size,
                    modified_ms,
                })),
        }
    }

    /// Lists every object under a location prefix (recursively).
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        match &self.backend {
            Backend::Local => {
                let root = PathBuf::from(prefix);
                tokio::task::spawn_blocking(move || list_local(&root))
                    .await
                    .map_err(|e| Error::Internal(format!("listing task failed: {e}")))?
            }
            Backend::S3(s) => Ok(s
                .list(prefix)
                .await
                .map_err(|e| object_error("list", prefix, e))?
                .into_iter()
                .map(|(location, size, modified_ms)| ObjectInfo {
                    location,
                    size,
                    modified_ms,
                })
                .collect()),
        }
    }
}

fn object_error(op: &'static str, location: &str, e: iceberg::Error) -> Error {
    Error::ObjectStore {
        op,
        location: location.to_string(),
        retryable: e.retryable(),
        message: e.to_string(),
    }
}

fn modified_ms(meta: &std::fs::Metadata) -> i64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64)
}

fn list_local(root: &Path) -> Result<Vec<ObjectInfo>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("list", &dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("list", &dir, e))?;
            let meta = entry
                .metadata()
                .map_err(|e| Error::io("stat", entry.path(), e))?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if let Some(location) = entry.path().to_str() {
                out.push(ObjectInfo {
                    location: location.to_string(),
                    size: meta.len(),
                    modified_ms: modified_ms(&meta),
                });
            }
        }
    }
    out.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(out)
}
