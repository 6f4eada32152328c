//! Configuration: which backend, where things live, which pipeline spec. Read from the
//! environment (the Lambda functions) or from flags that default to the same variables (the
//! CLI); the clients are built from it by [`crate::backend`].
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `STREAMTABLE_BACKEND` | `embedded` or `aws` | `embedded` |
//! | `STREAMTABLE_PIPELINE` | pipeline spec file | `infra/pipeline.toml` if present, else the built-in copy |
//! | `STREAMTABLE_HOME` | embedded: state, catalog and warehouse directory | `./.streamtable` |
//! | `STREAMTABLE_BUCKET` | aws: S3 bucket of the warehouse | required |
//! | `STREAMTABLE_WAREHOUSE_PREFIX` | aws: key prefix of the warehouse | `warehouse` |
//! | `STREAMTABLE_STATE_TABLE` | aws: DynamoDB table of checkpoints | required |
//! | `STREAMTABLE_GLUE_DATABASE` | aws: Glue database (Iceberg namespace) | `streamtable` |
//!
//! The AWS SDK reads its own standard variables (`AWS_REGION`, credentials,
//! `AWS_ENDPOINT_URL`), so a local emulator stands in for AWS without code changes.

use std::path::{Path, PathBuf};

use crate::backend::{Backend, BackendConfig};
use crate::error::{Error, Result};
use crate::spec::PipelineSpec;
use crate::storage::DEFAULT_NAMESPACE;

/// The pipeline spec shipped in `infra/pipeline.toml`, compiled in as the default.
pub const BUILTIN_PIPELINE: &str = include_str!("../../../infra/pipeline.toml");
/// Default location of the pipeline spec.
pub const DEFAULT_PIPELINE_PATH: &str = "infra/pipeline.toml";
/// Default home of the embedded backend.
pub const DEFAULT_HOME: &str = ".streamtable";

/// Full configuration of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Pipeline spec file; `None` means the built-in copy.
    pub pipeline: Option<PathBuf>,
    /// Where state, catalog and data live.
    pub backend: BackendConfig,
    /// The deployment's table → topic mapping (`STREAMTABLE_TOPICS`, set by the SAM template):
    /// a spec that disagrees is refused when it is loaded.
    pub topics: Option<Vec<(String, String)>>,
}

impl Config {
    /// Reads the configuration from environment variables.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// Reads the configuration through `var` (for tests and for flags layered over the env).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let pipeline = var("STREAMTABLE_PIPELINE").map(PathBuf::from).or_else(|| {
            Path::new(DEFAULT_PIPELINE_PATH)
                .exists()
                .then(|| PathBuf::from(DEFAULT_PIPELINE_PATH))
        });
        let backend = match var("STREAMTABLE_BACKEND").as_deref().unwrap_or("embedded") {
            "embedded" => BackendConfig::Embedded {
                home: PathBuf::from(var("STREAMTABLE_HOME").unwrap_or_else(|| DEFAULT_HOME.into())),
            },
            "aws" => {
                let need = |k: &str, what: &str| {
                    var(k).ok_or_else(|| {
                        Error::Config(format!(
                            "{k} is not set; STREAMTABLE_BACKEND=aws needs {what}"
                        ))
                    })
                };
                BackendConfig::Aws {
                    bucket: need("STREAMTABLE_BUCKET", "the S3 bucket of the warehouse")?,
                    prefix: var("STREAMTABLE_WAREHOUSE_PREFIX")
                        .unwrap_or_else(|| "warehouse".into()),
                    state_table: need(
                        "STREAMTABLE_STATE_TABLE",
                        "the DynamoDB table of checkpoints",
                    )?,
                    glue_database: var("STREAMTABLE_GLUE_DATABASE")
                        .unwrap_or_else(|| DEFAULT_NAMESPACE.into()),
                }
            }
            other => {
                return Err(Error::Config(format!(
                    "STREAMTABLE_BACKEND={other:?} is not a backend; use embedded or aws"
                )));
            }
        };
        let topics = var(crate::spec::TOPICS_ENV)
            .map(|t| crate::spec::parse_mapping(&t))
            .transpose()?;
        Ok(Config {
            pipeline,
            backend,
            topics,
        })
    }

    /// Loads and validates the pipeline spec, reading the columns of tables that take them from
    /// the schema registry (`columns = "from-registry"`) from it and from `backend`'s catalog.
    /// What every command that builds tables uses.
    pub async fn load_pipeline_resolved(&self, backend: &Backend) -> Result<PipelineSpec> {
        let (text, origin) = self.pipeline_text()?;
        let spec = crate::registry::resolve::load_spec(&text, &origin, backend).await?;
        self.check_topics(spec)
    }

    /// The spec, if the deployment's topics (`STREAMTABLE_TOPICS`) agree with it.
    fn check_topics(&self, spec: PipelineSpec) -> Result<PipelineSpec> {
        if let Some(mapping) = &self.topics {
            spec.check_deployed_topics(mapping)?;
        }
        Ok(spec)
    }

    /// The spec's text and where it is from.
    pub fn pipeline_text(&self) -> Result<(String, PathBuf)> {
        match &self.pipeline {
            Some(path) => Ok((
                std::fs::read_to_string(path).map_err(|e| {
                    Error::Spec(format!(
                        "{}: cannot read the pipeline spec: {e}; pass --pipeline FILE or set STREAMTABLE_PIPELINE",
                        path.display()
                    ))
                })?,
                path.clone(),
            )),
            None => Ok((
                BUILTIN_PIPELINE.to_string(),
                PathBuf::from("(built-in) infra/pipeline.toml"),
            )),
        }
    }

    /// Loads and validates the pipeline spec (a spec whose tables take their columns from the
    /// registry needs [`Config::load_pipeline_resolved`]).
    pub fn load_pipeline(&self) -> Result<PipelineSpec> {
        let spec = match &self.pipeline {
            Some(path) => PipelineSpec::load(path, &crate::process::Planner),
            None => PipelineSpec::parse(
                BUILTIN_PIPELINE,
                Path::new("(built-in) infra/pipeline.toml"),
                &crate::process::Planner,
            ),
        }?;
        self.check_topics(spec)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn embedded_is_the_default() {
        let c = Config::from_lookup(lookup(&[])).expect("config");
        assert_eq!(
            c.backend,
            BackendConfig::Embedded {
                home: PathBuf::from(".streamtable")
            }
        );
    }

    #[test]
    fn aws_needs_bucket_and_table_and_says_so() {
        let err =
            Config::from_lookup(lookup(&[("STREAMTABLE_BACKEND", "aws")])).expect_err("missing");
        assert!(err.to_string().contains("STREAMTABLE_BUCKET"), "{err}");
        let c = Config::from_lookup(lookup(&[
            ("STREAMTABLE_BACKEND", "aws"),
            ("STREAMTABLE_BUCKET", "b"),
            ("STREAMTABLE_STATE_TABLE", "t"),
        ]))
        .expect("config");
        assert_eq!(
            c.backend,
            BackendConfig::Aws {
                bucket: "b".into(),
                prefix: "warehouse".into(),
                state_table: "t".into(),
                glue_database: "streamtable".into()
            }
        );
    }

    #[test]
    fn an_unknown_backend_is_refused() {
        let err = Config::from_lookup(lookup(&[("STREAMTABLE_BACKEND", "gcp")])).expect_err("bad");
        assert!(err.to_string().contains("use embedded or aws"));
    }

    #[test]
    fn a_deployment_whose_topics_are_not_the_specs_is_refused_at_load() {
        let c = Config::from_lookup(lookup(&[(
            "STREAMTABLE_TOPICS",
            "orders=orders,payments=payments,readings=sensors,orders_current=order_status",
        )]))
        .expect("config");
        let e = c.load_pipeline().expect_err("disagree").to_string();
        assert!(
            e.contains("table readings") && e.contains("\"sensors\""),
            "{e}"
        );
        let c = Config::from_lookup(lookup(&[(
            "STREAMTABLE_TOPICS",
            "orders=orders,payments=payments,readings=readings,orders_current=order_status",
        )]))
        .expect("config");
        assert_eq!(c.load_pipeline().expect("agree").tables.len(), 4);
        assert!(Config::from_lookup(lookup(&[("STREAMTABLE_TOPICS", "orders")])).is_err());
    }

    #[test]
    fn the_builtin_pipeline_is_valid() {
        let c = Config {
            pipeline: None,
            backend: BackendConfig::Embedded { home: ".".into() },
            topics: None,
        };
        assert_eq!(c.load_pipeline().expect("valid").tables.len(), 4);
    }
}

#[cfg(test)]
mod deployed_topics_tests {
    use std::path::Path;

    use super::BUILTIN_PIPELINE;
    use crate::spec::{PipelineSpec, parse_mapping};

    fn spec() -> PipelineSpec {
        PipelineSpec::parse(
            BUILTIN_PIPELINE,
            Path::new("pipeline.toml"),
            &crate::process::Planner,
        )
        .expect("spec")
    }

    #[test]
    fn the_templates_default_mapping_agrees_with_the_shipped_spec() {
        let mapping = parse_mapping(
            "orders=orders, payments=payments,readings=readings,orders_current=order_status",
        )
        .expect("mapping");
        spec().check_deployed_topics(&mapping).expect("agree");
    }

    #[test]
    fn a_renamed_topic_or_a_missing_event_source_is_refused_with_both_names() {
        let mapping = parse_mapping("orders=prod.orders,payments=payments").expect("mapping");
        let e = spec()
            .check_deployed_topics(&mapping)
            .expect_err("disagree")
            .to_string();
        assert!(
            e.contains("table orders: the event source mapping reads topic \"prod.orders\", the spec says topic = \"orders\"")
                && e.contains("table readings: no event source mapping reads its topic \"readings\""),
            "{e}"
        );
        let e = spec()
            .check_deployed_topics(
                &parse_mapping("orders=orders,payments=payments,readings=readings,clicks=clicks")
                    .expect("mapping"),
            )
            .expect_err("unknown table")
            .to_string();
        assert!(
            e.contains("for table clicks, which the spec does not have"),
            "{e}"
        );
        assert!(parse_mapping("orders").is_err());
        assert!(parse_mapping("=x").is_err());
    }
}
