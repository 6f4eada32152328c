//! Schema registries: where an Avro record's writer schema comes from.
//!
//! A record names its schema in its header ([`SchemaId`]); before a batch is decoded, every id
//! the topic's decoder does not know yet is fetched once and kept for the life of the process
//! (a registry never changes the schema of an id). Three sources:
//! - a Confluent-compatible registry over HTTP(S) (`[registry] url`, or
//!   `STREAMTABLE_REGISTRY_URL`), with basic auth from `STREAMTABLE_REGISTRY_AUTH`
//!   (`key:secret`; the SAM template fills it from Secrets Manager);
//! - the AWS Glue Schema Registry (Glue-framed records, AWS backend);
//! - a directory of `<id>.avsc` and `<id>.proto` files (`file:DIR`), for the embedded backend and
//!   the demo.
//!
//! What a fetch can end in, and what happens to the batch:
//! - the schema: records decode with it;
//! - the registry does not have the id (404, no such file, not Avro): [`Lookup::Missing`] —
//!   the records are dead letters of kind `unknown_schema` with the reason;
//! - the registry cannot be reached (network, 5xx, throttling, refused credentials): an
//!   [`Error::Registry`] — nothing of the batch lands and the event source mapping retries it.
//!   A transient fault never turns records into dead letters.

mod confluent;
mod dir;
#[cfg(feature = "aws")]
mod glue;
pub mod mapping;
pub mod resolve;

use std::sync::Arc;

use async_trait::async_trait;

pub use crate::decode::framing::SchemaId;
use crate::error::{Error, Result};
use crate::spec::RegistrySpec;

pub use confluent::ConfluentRegistry;
pub use dir::DirRegistry;
#[cfg(feature = "aws")]
pub use glue::GlueRegistry;

/// The answer of a registry about one id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The schema's text and its kind as the registry names it (`AVRO`, `PROTOBUF`, …).
    Found {
        /// The schema (Avro: JSON; Protobuf: `.proto` source).
        schema: String,
        /// `AVRO`, `PROTOBUF` or `JSON`.
        kind: String,
    },
    /// The registry does not have it (or it is not an Avro schema); the reason names both.
    Missing(String),
}

/// A place writer schemas are fetched from.
#[async_trait]
pub trait SchemaSource: Send + Sync {
    /// The schema of `id`, or why the registry does not have it. `Err` only when the registry
    /// could not answer.
    async fn fetch(&self, id: &SchemaId) -> Result<Lookup>;

    /// The latest version registered under `subject` (Confluent: a subject name such as
    /// `orders-value`; Glue: `registry/schema`), with its id. `Err` only when the registry
    /// could not answer.
    async fn latest(&self, subject: &str) -> Result<Latest> {
        Ok(Latest::Missing(format!(
            "the {} does not list subjects (subject {subject:?})",
            self.describe()
        )))
    }

    /// Where it is, for messages.
    fn describe(&self) -> String;
}

/// The answer of a registry about a subject's latest version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Latest {
    /// The version's id, schema text and kind (`AVRO`, `PROTOBUF`).
    Found {
        /// Its id, as records carrying it name it.
        id: SchemaId,
        /// The schema text.
        schema: String,
        /// `AVRO`, `PROTOBUF` or `JSON`.
        kind: String,
    },
    /// The registry has no such subject; the reason says where it looked.
    Missing(String),
}

/// Environment variable that overrides `[registry] url`.
pub const URL_ENV: &str = "STREAMTABLE_REGISTRY_URL";
/// Environment variable with the Confluent registry's basic-auth `key:secret`.
pub const AUTH_ENV: &str = "STREAMTABLE_REGISTRY_AUTH";

/// The registries of a pipeline: one for Confluent ids, one for Glue schema version ids.
#[derive(Clone, Default)]
pub struct Registries {
    confluent: Option<Arc<dyn SchemaSource>>,
    glue: Option<Arc<dyn SchemaSource>>,
}

impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries")
            .field("confluent", &self.confluent.as_ref().map(|s| s.describe()))
            .field("glue", &self.glue.as_ref().map(|s| s.describe()))
            .finish()
    }
}

impl Registries {
    /// The registries of `spec`, with `lookup` reading the environment (`URL_ENV`, `AUTH_ENV`)
    /// and `glue` the backend's Glue registry (AWS only). A `file:` registry also answers for
    /// Glue ids when there is no Glue.
    pub fn configure(
        spec: &RegistrySpec,
        lookup: impl Fn(&str) -> Option<String>,
        glue: Option<Arc<dyn SchemaSource>>,
    ) -> Result<Registries> {
        let url = lookup(URL_ENV)
            .filter(|u| !u.trim().is_empty())
            .or_else(|| spec.url.clone());
        // A directory answers for both framings' ids; Glue-framed ids otherwise go to Glue.
        let (confluent, directory): (Option<Arc<dyn SchemaSource>>, bool) = match url {
            None => (None, false),
            Some(url) => match url.strip_prefix("file:") {
                Some(dir) => (Some(Arc::new(DirRegistry::new(dir))), true),
                None => (
                    Some(Arc::new(ConfluentRegistry::new(
                        &url,
                        lookup(AUTH_ENV).as_deref(),
                    )?)),
                    false,
                ),
            },
        };
        let glue = glue.or_else(|| confluent.clone().filter(|_| directory));
        Ok(Registries { confluent, glue })
    }

    /// Registries of explicit sources (tests, benchmarks).
    pub fn of(
        confluent: Option<Arc<dyn SchemaSource>>,
        glue: Option<Arc<dyn SchemaSource>>,
    ) -> Registries {
        Registries { confluent, glue }
    }

    /// Fetches `id` from the registry its framing belongs to.
    pub async fn fetch(&self, id: &SchemaId) -> Result<Lookup> {
        let (source, how) = match id {
            SchemaId::Confluent(_) => (
                &self.confluent,
                "no Confluent-compatible registry is configured: set [registry] url in the spec or STREAMTABLE_REGISTRY_URL, then replay the dead letters",
            ),
            SchemaId::Glue(_) => (
                &self.glue,
                "Glue Schema Registry records need the AWS backend (or a file: registry with <uuid>.avsc files), then replay the dead letters",
            ),
        };
        match source {
            Some(s) => s.fetch(id).await,
            None => Ok(Lookup::Missing(format!("{id}: {how}"))),
        }
    }
}

impl Registries {
    /// The latest version of `subject`: a Glue subject (`registry/schema`) from the Glue
    /// registry, any other from the Confluent-compatible one (or the directory).
    pub async fn latest(&self, subject: &str) -> Result<Latest> {
        let source = if subject.contains('/') {
            &self.glue
        } else {
            &self.confluent
        };
        match source {
            Some(s) => s.latest(subject).await,
            None if subject.contains('/') => Ok(Latest::Missing(format!(
                "subject {subject:?} names a Glue Schema Registry schema (registry/schema), which needs the AWS backend or a file: registry"
            ))),
            None => Ok(Latest::Missing(format!(
                "no registry is configured to read subject {subject:?} from: set [registry] url in the spec or {URL_ENV}"
            ))),
        }
    }
}

/// A registry fault: the batch is retried when `retryable`.
pub(crate) fn fault(registry: &str, message: impl Into<String>, retryable: bool) -> Error {
    Error::Registry {
        registry: registry.to_string(),
        message: message.into(),
        retryable,
    }
}

#[cfg(test)]
mod tests;
