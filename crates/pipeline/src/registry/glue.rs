//! The AWS Glue Schema Registry: `GetSchemaVersion` by schema version id, or a schema's latest
//! version.

use async_trait::async_trait;

use super::{Latest, Lookup, SchemaId, SchemaSource, fault};
use crate::aws::SdkFault;
use crate::error::Result;

/// The Glue Schema Registry of the backend's account and region.
#[derive(Debug, Clone)]
pub struct GlueRegistry {
    client: aws_sdk_glue::Client,
}

impl GlueRegistry {
    /// The registry behind `client`.
    pub fn new(client: aws_sdk_glue::Client) -> GlueRegistry {
        GlueRegistry { client }
    }
}

#[async_trait]
impl SchemaSource for GlueRegistry {
    async fn fetch(&self, id: &SchemaId) -> Result<Lookup> {
        let SchemaId::Glue(version) = id else {
            return Ok(Lookup::Missing(format!(
                "{id} cannot be looked up in the Glue Schema Registry"
            )));
        };
        let out = self
            .client
            .get_schema_version()
            .schema_version_id(version.to_string())
            .send()
            .await;
        match out {
            Ok(v) => {
                let kind = v
                    .data_format()
                    .map_or("AVRO".to_string(), |f| f.as_str().to_string());
                match v.schema_definition() {
                    Some(text) => Ok(Lookup::Found {
                        schema: text.to_string(),
                        kind,
                    }),
                    None => Ok(Lookup::Missing(format!(
                        "{id} has no schema definition in Glue"
                    ))),
                }
            }
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.is_not_found() {
                    Ok(Lookup::Missing(format!(
                        "{id} is not in the Glue Schema Registry"
                    )))
                } else {
                    Err(fault(
                        "Glue Schema Registry",
                        f.message,
                        f.retryable || f.status.is_none(),
                    ))
                }
            }
        }
    }

    async fn latest(&self, subject: &str) -> Result<Latest> {
        let Some((registry, schema)) = subject.split_once('/') else {
            return Ok(Latest::Missing(format!(
                "subject {subject:?} is not a Glue schema; write it as registry/schema"
            )));
        };
        let out = self
            .client
            .get_schema_version()
            .schema_id(
                aws_sdk_glue::types::SchemaId::builder()
                    .registry_name(registry)
                    .schema_name(schema)
                    .build(),
            )
            .schema_version_number(
                aws_sdk_glue::types::SchemaVersionNumber::builder()
                    .latest_version(true)
                    .build(),
            )
            .send()
            .await;
        match out {
            Ok(v) => {
                let id = v
                    .schema_version_id()
                    .and_then(|u| uuid::Uuid::parse_str(u).ok());
                match (id, v.schema_definition()) {
                    (Some(id), Some(text)) => Ok(Latest::Found {
                        id: SchemaId::Glue(id),
                        schema: text.to_string(),
                        kind: v
                            .data_format()
                            .map_or("AVRO".to_string(), |f| f.as_str().to_string()),
                    }),
                    _ => Ok(Latest::Missing(format!(
                        "Glue schema {subject} has no latest version with a definition"
                    ))),
                }
            }
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.is_not_found() {
                    Ok(Latest::Missing(format!(
                        "Glue schema {subject} is not in the Glue Schema Registry"
                    )))
                } else {
                    Err(fault(
                        "Glue Schema Registry",
                        f.message,
                        f.retryable || f.status.is_none(),
                    ))
                }
            }
        }
    }

    fn describe(&self) -> String {
        "Glue Schema Registry".into()
    }
}
