//! The embedded backend's object store: a local directory. Writes go to a temporary name and
//! are renamed into place, so a crash never leaves a torn file under the final name.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;

use super::{ObjectInfo, ObjectStore};
use crate::error::{Error, Result};

/// Objects as files; locations are absolute paths.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalStore;

#[async_trait]
impl ObjectStore for LocalStore {
    async fn write(&self, location: &str, bytes: Bytes) -> Result<()> {
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

    async fn read(&self, location: &str) -> Result<Bytes> {
        tokio::fs::read(location)
            .await
            .map(Bytes::from)
            .map_err(|e| Error::io("read", location, e))
    }

    async fn delete(&self, location: &str) -> Result<()> {
        match tokio::fs::remove_file(location).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io("delete", location, e))
            }
            _ => Ok(()),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let root = PathBuf::from(prefix);
        tokio::task::spawn_blocking(move || list_local(&root))
            .await
            .map_err(|e| Error::Internal(format!("listing task failed: {e}")))?
    }

    async fn stat(&self, location: &str) -> Result<Option<ObjectInfo>> {
        match tokio::fs::metadata(location).await {
            Ok(meta) => Ok(Some(ObjectInfo {
                location: location.to_string(),
                size: meta.len(),
                modified_ms: modified_ms(&meta),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("stat", location, e)),
        }
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
