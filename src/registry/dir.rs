//! A directory of schema files as a registry: `<id>.avsc` (Avro) or `<id>.proto` (Protobuf) for
//! Confluent ids, `<uuid>.avsc` / `<uuid>.proto` for Glue schema version ids. For the embedded
//! backend, the demo and tests without a server.

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

    fn path(&self, id: &SchemaId, extension: &str) -> PathBuf {
        match id {
            SchemaId::Confluent(n) => self.dir.join(format!("{n}.{extension}")),
            SchemaId::Glue(u) => self.dir.join(format!("{u}.{extension}")),
        }
    }
}

#[async_trait]
impl SchemaSource for DirRegistry {
    async fn fetch(&self, id: &SchemaId) -> Result<Lookup> {
        for (extension, kind) in [("avsc", "AVRO"), ("proto", "PROTOBUF")] {
            let path = self.path(id, extension);
            match tokio::fs::read_to_string(&path).await {
                Ok(schema) => {
                    return Ok(Lookup::Found {
                        schema,
                        kind: kind.into(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(Error::Io {
                        op: "read schema",
                        path,
                        source,
                    });
                }
            }
        }
        Ok(Lookup::Missing(format!(
            "{id} is not in the registry directory {} (no {} or .proto)",
            self.dir.display(),
            self.path(id, "avsc").display()
        )))
    }

    fn describe(&self) -> String {
        format!("directory {}", self.dir.display())
    }
}
