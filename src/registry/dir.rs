//! A directory of schema files as a registry: `<id>.avsc` for Confluent ids, `<uuid>.avsc` for
//! Glue schema version ids. For the embedded backend, the demo and tests without a server.

use std::path::PathBuf;

use async_trait::async_trait;

use super::{Lookup, SchemaId, SchemaSource};
use crate::error::{Error, Result};

/// Schemas in a directory.
#[derive(Debug, Clone)]
pub struct DirRegistry {
    dir: PathBuf,
}

impl DirRegistry {
    /// The registry of `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> DirRegistry {
        DirRegistry { dir: dir.into() }
    }

    fn path(&self, id: &SchemaId) -> PathBuf {
        match id {
            SchemaId::Confluent(n) => self.dir.join(format!("{n}.avsc")),
            SchemaId::Glue(u) => self.dir.join(format!("{u}.avsc")),
        }
    }
}

#[async_trait]
impl SchemaSource for DirRegistry {
    async fn fetch(&self, id: &SchemaId) -> Result<Lookup> {
        let path = self.path(id);
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => Ok(Lookup::Found(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lookup::Missing(format!(
                "{id} is not in the registry directory {} (no {})",
                self.dir.display(),
                path.display()
            ))),
            Err(source) => Err(Error::Io {
                op: "read schema",
                path,
                source,
            }),
        }
    }

    fn describe(&self) -> String {
        format!("directory {}", self.dir.display())
    }
}
