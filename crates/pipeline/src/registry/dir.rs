//! A directory of schema files as a registry: `<id>.avsc` (Avro) or `<id>.proto` (Protobuf) for
//! Confluent ids, `<uuid>.avsc` / `<uuid>.proto` for Glue schema version ids. For the embedded
//! backend, the demo and tests without a server. A subject is a file `subjects/<subject>` holding
//! the id of its latest version (`subjects/orders-value` containing `2`).

use std::path::PathBuf;

use async_trait::async_trait;

use super::{Latest, Lookup, SchemaId, SchemaSource};
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

    async fn latest(&self, subject: &str) -> Result<Latest> {
        let path = self.dir.join("subjects").join(subject);
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Latest::Missing(format!(
                    "subject {subject:?} is not in the registry directory {} (no file {}; it holds the latest version's schema id)",
                    self.dir.display(),
                    path.display()
                )));
            }
            Err(source) => {
                return Err(Error::Io {
                    op: "read subject",
                    path,
                    source,
                });
            }
        };
        let id = text.trim();
        let id = match (id.parse::<u32>(), uuid::Uuid::parse_str(id)) {
            (Ok(n), _) => SchemaId::Confluent(n),
            (_, Ok(u)) => SchemaId::Glue(u),
            _ => {
                return Ok(Latest::Missing(format!(
                    "{} must hold a schema id (a number or a Glue schema version UUID), not {id:?}",
                    path.display()
                )));
            }
        };
        Ok(match self.fetch(&id).await? {
            Lookup::Found { schema, kind } => Latest::Found { id, schema, kind },
            Lookup::Missing(why) => Latest::Missing(format!("subject {subject:?}: {why}")),
        })
    }

    fn describe(&self) -> String {
        format!("directory {}", self.dir.display())
    }
}
