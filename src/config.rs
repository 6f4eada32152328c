//! Configuration: which backend, where things live. Read from the environment (the Lambda
//! functions) or from flags that default to the same variables (the CLI).
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
use std::sync::Arc;

use crate::catalog::TableCatalog;
use crate::catalog::sqlite::SqlitePointers;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::spec::PipelineSpec;
use crate::state::SqliteStateStore;
use crate::state::StateStore;
use crate::storage::{DEFAULT_NAMESPACE, Warehouse};

/// The pipeline spec shipped in `infra/pipeline.toml`, compiled in as the default.
pub const BUILTIN_PIPELINE: &str = include_str!("../infra/pipeline.toml");
/// Default location of the pipeline spec.
pub const DEFAULT_PIPELINE_PATH: &str = "infra/pipeline.toml";
/// Default home of the embedded backend.
pub const DEFAULT_HOME: &str = ".streamtable";

/// Where state, catalog and data live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    /// Everything in one local directory: no AWS account needed.
    Embedded {
        /// The directory: `state.db`, `catalog.db` and `warehouse/`.
        home: PathBuf,
    },
    /// S3 + DynamoDB + Glue.
    Aws {
        /// The warehouse bucket.
        bucket: String,
        /// The warehouse's key prefix.
        prefix: String,
        /// The DynamoDB table of checkpoints, pending batches and intents.
        state_table: String,
        /// The Glue database (Iceberg namespace).
        glue_database: String,
    },
}

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
            Some(path) => PipelineSpec::load(path),
            None => PipelineSpec::parse(
                BUILTIN_PIPELINE,
                Path::new("(built-in) infra/pipeline.toml"),
            ),
        }?;
        self.check_topics(spec)
    }
}

/// The connected backend: warehouse storage, state store and catalog. Built once per process.
#[derive(Clone)]
pub struct Backend {
    /// Table data and metadata.
    pub warehouse: Warehouse,
    /// Checkpoints, pending batches, commit intents, locks.
    pub state: Arc<dyn StateStore>,
    /// The Iceberg catalog (SQLite `catalog.db`, or Glue).
    pub catalog: TableCatalog,
    /// Iceberg namespace (Glue database) of the tables.
    pub namespace: String,
    /// The clock everything time-dependent asks.
    pub clock: Arc<dyn Clock>,
    /// The Glue Schema Registry (AWS backend), for Avro records framed by Glue's serializer.
    pub glue_schemas: Option<Arc<dyn crate::registry::SchemaSource>>,
}

impl Backend {
    /// Connects to the configured backend, building its clients once (the AWS SDK reads its
    /// standard configuration from the environment).
    pub async fn connect(config: &BackendConfig) -> Result<Backend> {
        match config {
            BackendConfig::Embedded { home } => {
                let warehouse = Warehouse::local(&home.join("warehouse"))?;
                let state = SqliteStateStore::open(&home.join("state.db"))?;
                let pointers = SqlitePointers::open(&home.join("catalog.db"))?;
                let catalog = TableCatalog::new(
                    Arc::new(pointers),
                    warehouse.file_io().clone(),
                    warehouse.root(),
                );
                Ok(Backend {
                    warehouse,
                    state: Arc::new(state),
                    catalog,
                    namespace: DEFAULT_NAMESPACE.to_string(),
                    clock: crate::clock::system(),
                    glue_schemas: None,
                })
            }
            BackendConfig::Aws { .. } => Self::connect_aws(config).await,
        }
    }

    #[cfg(feature = "aws")]
    async fn connect_aws(config: &BackendConfig) -> Result<Backend> {
        use crate::catalog::glue::GluePointers;
        use crate::state::DynamoStateStore;
        let BackendConfig::Aws {
            bucket,
            prefix,
            state_table,
            glue_database,
        } = config
        else {
            return Err(Error::Internal(
                "connect_aws called for another backend".into(),
            ));
        };
        let sdk = crate::aws::load_config().await;
        // In a traced Lambda function, every S3, DynamoDB and Glue call is an X-Ray subsegment.
        let xray = crate::aws::xray::XRaySubsegments::from_env();
        let mut s3_config = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true);
        let mut dynamo_config = aws_sdk_dynamodb::config::Builder::from(&sdk);
        let mut glue_config = aws_sdk_glue::config::Builder::from(&sdk);
        if let Some(x) = xray {
            s3_config = s3_config.interceptor(x.clone());
            dynamo_config = dynamo_config.interceptor(x.clone());
            glue_config = glue_config.interceptor(x);
        }
        let s3 = aws_sdk_s3::Client::from_conf(s3_config.build());
        let dynamo = aws_sdk_dynamodb::Client::from_conf(dynamo_config.build());
        let glue = aws_sdk_glue::Client::from_conf(glue_config.build());
        let warehouse = Warehouse::s3(s3, bucket, prefix);
        let glue_schemas: Arc<dyn crate::registry::SchemaSource> =
            Arc::new(crate::registry::GlueRegistry::new(glue.clone()));
        let catalog = TableCatalog::new(
            Arc::new(GluePointers::new(glue)),
            warehouse.file_io().clone(),
            warehouse.root(),
        );
        Ok(Backend {
            warehouse,
            state: Arc::new(
                DynamoStateStore::new(dynamo, state_table)
                    .with_body_layout(body_layout_from_env()?),
            ),
            catalog,
            namespace: glue_database.clone(),
            clock: crate::clock::system(),
            glue_schemas: Some(glue_schemas),
        })
    }

    #[cfg(not(feature = "aws"))]
    async fn connect_aws(_: &BackendConfig) -> Result<Backend> {
        Err(Error::Config(
            "STREAMTABLE_BACKEND=aws, but this build has no AWS backend: build with the aws feature".into(),
        ))
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
            "orders=orders,payments=payments,readings=sensors",
        )]))
        .expect("config");
        let e = c.load_pipeline().expect_err("disagree").to_string();
        assert!(
            e.contains("table readings") && e.contains("\"sensors\""),
            "{e}"
        );
        let c = Config::from_lookup(lookup(&[(
            "STREAMTABLE_TOPICS",
            "orders=orders,payments=payments,readings=readings",
        )]))
        .expect("config");
        assert_eq!(c.load_pipeline().expect("agree").tables.len(), 3);
        assert!(Config::from_lookup(lookup(&[("STREAMTABLE_TOPICS", "orders")])).is_err());
    }

    #[test]
    fn the_builtin_pipeline_is_valid() {
        let c = Config {
            pipeline: None,
            backend: BackendConfig::Embedded { home: ".".into() },
            topics: None,
        };
        assert_eq!(c.load_pipeline().expect("valid").tables.len(), 3);
    }
}

/// `STREAMTABLE_PENDING_BODIES`: `carried` (the default) lets the scheduled stage mark the
/// state table so that ingest compresses pending items against the dictionary and carries small
/// derived files in state files; `dictionary` takes the carried rows back, `first` both (set it
/// on the scheduled function, let a run and a minute pass, and wait until no pending batch is
/// older, before rolling back below the release that introduced it: RELIABILITY.md, P33, P35).
#[cfg(feature = "aws")]
fn body_layout_from_env() -> Result<i64> {
    body_layout(std::env::var("STREAMTABLE_PENDING_BODIES").ok().as_deref())
}

#[cfg(feature = "aws")]
fn body_layout(value: Option<&str>) -> Result<i64> {
    use crate::state::dynamodb::{BODY_LAYOUT, CARRIED_ROWS_LAYOUT};
    match value.map(str::trim) {
        None | Some("") | Some("carried") => Ok(CARRIED_ROWS_LAYOUT),
        Some("dictionary") => Ok(BODY_LAYOUT),
        Some("first") => Ok(0),
        Some(other) => Err(Error::Config(format!(
            "STREAMTABLE_PENDING_BODIES={other:?} is none of \"carried\" (the default), \
             \"dictionary\" (no rows carried in state files) and \"first\" (pending items in \
             the layout every release reads), the last two before a rollback"
        ))),
    }
}

#[cfg(all(test, feature = "aws"))]
mod pending_bodies_tests {
    use crate::state::dynamodb::{BODY_LAYOUT, CARRIED_ROWS_LAYOUT};

    #[test]
    fn pending_bodies_setting_is_carried_dictionary_first_or_refused_by_name() {
        let layout = |v| super::body_layout(v).expect("a setting");
        assert!(layout(None) >= BODY_LAYOUT, "dictionary bodies by default");
        assert_eq!(layout(None), CARRIED_ROWS_LAYOUT, "and carried rows");
        assert_eq!(layout(Some("carried")), CARRIED_ROWS_LAYOUT);
        assert_eq!(layout(Some("dictionary")), BODY_LAYOUT);
        assert_eq!(layout(Some(" first ")), 0);
        let err = super::body_layout(Some("zstd")).expect_err("refused");
        assert!(
            err.to_string().contains("STREAMTABLE_PENDING_BODIES"),
            "{err}"
        );
    }
}
