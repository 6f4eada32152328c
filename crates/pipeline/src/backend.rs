//! The connected backend: the warehouse's storage, the state store and the catalog, with the
//! clock everything time-dependent asks. Built once per process from a [`BackendConfig`]
//! (the embedded default: SQLite and a local directory; or S3, DynamoDB and Glue, whose SDK
//! clients are built here and nowhere else).

use std::path::PathBuf;
use std::sync::Arc;

use crate::catalog::TableCatalog;
use crate::catalog::sqlite::SqlitePointers;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::storage::{DEFAULT_NAMESPACE, Warehouse};
use crate::store::SqliteStateStore;
use crate::store::StateStore;

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
        use crate::store::DynamoStateStore;
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
    use crate::store::dynamodb::{BODY_LAYOUT, CARRIED_ROWS_LAYOUT};
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
    use crate::store::dynamodb::{BODY_LAYOUT, CARRIED_ROWS_LAYOUT};

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
