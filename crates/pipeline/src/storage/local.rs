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
        // One blocking task for the three steps (not one per step): a batch writes several
        // files, each waiting on its own thread hand-offs.
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
            std::fs::write(&tmp, &bytes).map_err(|e| Error::io("write", &tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename", &path, e))
        })
        .await
        .map_err(|e| Error::Internal(format!("write task failed: {e}")))?
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

fn is_write_in_progress(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n.starts_with('.') && n.ends_with(".tmp"))
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
            // A write in progress (`.{name}.{pid}.{n}.tmp`, renamed when complete) is not an
            // object yet, as an S3 PUT in flight is not; it may vanish while listed.
            if is_write_in_progress(&entry.file_name()) {
                continue;
            }
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("stat", entry.path(), e)),
            };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_in_progress_are_not_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("t/data");
        std::fs::create_dir_all(&data).expect("mkdir");
        std::fs::write(data.join("a.parquet"), b"x").expect("write");
        std::fs::write(data.join(".b.parquet.17.3.tmp"), b"partial").expect("write");
        let listed: Vec<String> = list_local(dir.path())
            .expect("list")
            .into_iter()
            .map(|o| o.location)
            .collect();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(listed[0].ends_with("/t/data/a.parquet"));
    }
}
