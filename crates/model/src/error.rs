//! The library's error type.
//!
//! Every error says which input it concerns and why. [`Error::is_retryable`] tells the Lambda
//! handlers whether to fail the invocation (so the event source mapping retries the batch) or
//! not: only transient faults of S3, DynamoDB, Glue or the local disk are retryable. Bad records
//! never surface here: they go to the dead-letter table (see [`crate::decode`]).

use std::path::PathBuf;

/// Result alias used throughout the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, with the input it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pipeline spec could not be read or is invalid. The message names file, line and fix.
    #[error("{0}")]
    Spec(String),

    /// `streamtable audit` found offsets missing or present twice (the message says where).
    #[error("audit: {0}")]
    Audit(String),

    /// A configuration value (flag or environment variable) is missing or invalid.
    #[error("configuration: {0}")]
    Config(String),

    /// An I/O error on a local file.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// An object store (S3 or the local warehouse) operation failed.
    #[error("object store: {op} {location}: {message}")]
    ObjectStore {
        /// What was being done.
        op: &'static str,
        /// The object.
        location: String,
        /// The store's error.
        message: String,
        /// Whether trying again later can succeed.
        retryable: bool,
    },

    /// A Kafka cluster could not be read or written (`streamtable run` and `produce`).
    #[error("kafka: {op}: {message}")]
    Kafka {
        /// What was being done.
        op: String,
        /// The client's error.
        message: String,
        /// Whether trying again later can succeed (a broker unreachable, a leader moving).
        retryable: bool,
    },

    /// The state store (DynamoDB or SQLite) failed.
    #[error("state store: {op}: {message}")]
    State {
        /// What was being done.
        op: &'static str,
        /// The store's error, naming the table or file.
        message: String,
        /// Whether trying again later can succeed.
        retryable: bool,
    },

    /// Another writer kept winning the conditional checkpoint update.
    #[error(
        "checkpoint of {source_partition} kept changing under this invocation ({attempts} attempts)"
    )]
    CheckpointContention {
        /// The topic-partition.
        source_partition: String,
        /// Conditional writes tried.
        attempts: u32,
    },

    /// Other writers kept changing the table while a commit was being made.
    #[error("commit to {table} kept losing to other writers ({attempts} attempts)")]
    CommitContention {
        /// The table.
        table: String,
        /// Commits tried.
        attempts: u32,
    },

    /// A commit whose id a snapshot of the table already carries: another committer (a
    /// zombie, an overlapping run) landed it first. Refused at the swap, so that no commit id
    /// lands twice; the caller finds the snapshot that holds it.
    #[error("commit to {table}: {commit_id} is already in the table's history")]
    AlreadyCommitted {
        /// The table.
        table: String,
        /// The commit (or replace) id.
        commit_id: String,
    },

    /// A catalog swap whose outcome could not be learned (its answer was lost and the pointer
    /// could not confirm it). Nothing it wrote was deleted; the next attempt finds out.
    #[error(
        "commit to {table}: outcome unknown ({message}); {metadata_location} is kept until orphan clean-up proves it unused"
    )]
    CommitStateUnknown {
        /// The table.
        table: String,
        /// The metadata file the swap would have pointed the table at.
        metadata_location: String,
        /// The swap's error.
        message: String,
    },

    /// The spec asks for a schema change the table cannot make (narrowing a type, a new
    /// required column, optional → required). Only that table stops; `streamtable check` shows
    /// the same refusal before deploy.
    #[error("table {table}: schema change refused: {reasons}")]
    SchemaRefused {
        /// The table.
        table: String,
        /// Each refused change, with what to do instead.
        reasons: String,
    },

    /// A schema registry could not answer (unreachable, 5xx, throttled, credentials refused).
    /// The batch is not landed and is retried; its records are never dead-lettered for this.
    #[error("schema registry {registry}: {message}")]
    Registry {
        /// The registry (URL or Glue).
        registry: String,
        /// What failed.
        message: String,
        /// Whether trying again later can succeed without a change of configuration.
        retryable: bool,
    },

    /// A table whose columns come from the registry met a writer schema with fields it has no
    /// columns for: nothing of the batch landed; the ingestor re-reads the spec from the
    /// registry and lands the batch again (retryable).
    #[error(
        "table {table}: {schema} has fields that are not columns yet ({columns}); the spec is read from the registry again and the batch retried"
    )]
    RegistryColumnsGrew {
        /// The table.
        table: String,
        /// The writer schema (its id).
        schema: String,
        /// The new columns, comma-separated.
        columns: String,
    },

    /// An error from the Iceberg library (metadata, writers, file IO).
    #[error("iceberg: {context}: {source}")]
    Iceberg {
        /// What was being done.
        context: String,
        /// The library's error.
        #[source]
        source: Box<iceberg::Error>,
    },

    /// A SQL query failed (bad SQL, unknown table or column). The message shows where.
    #[error("query: {0}")]
    Query(String),

    /// A broken invariant inside streamtable (a bug): never caused by input data.
    #[error("internal error: {0}")]
    Internal(String),

    /// A delivery holds records below a partition's checkpoint that the partition never took
    /// (stamped after the latest record it did): the topic was deleted and created again and
    /// its offsets restarted. Nothing of the partition lands (taking them as already seen
    /// would lose them); the invocation fails until the recovery README describes is done.
    #[error("{source_partition}: {message}")]
    Recreated {
        /// The topic-partition, `topic-partition`.
        source_partition: String,
        /// Which offsets, the stamps, and the recovery.
        message: String,
    },

    /// The input event itself is not an MSK event-source-mapping batch.
    #[error("event {origin}: {message}")]
    Event {
        /// Where the event came from (a file, an S3 object, the invocation).
        origin: String,
        /// What is wrong with it.
        message: String,
    },
}

impl Error {
    /// Whether retrying the same input later can succeed. The Lambda returns an error to the
    /// event source mapping only for these; everything else is handled inside the batch.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::ObjectStore { retryable, .. }
            | Error::State { retryable, .. }
            | Error::Registry { retryable, .. }
            | Error::Kafka { retryable, .. } => *retryable,
            Error::CheckpointContention { .. }
            | Error::CommitContention { .. }
            | Error::CommitStateUnknown { .. }
            | Error::RegistryColumnsGrew { .. } => true,
            Error::Io { source, .. } => {
                use std::io::ErrorKind as K;
                matches!(
                    source.kind(),
                    K::Interrupted
                        | K::TimedOut
                        | K::WouldBlock
                        | K::ResourceBusy
                        | K::StorageFull
                        | K::QuotaExceeded
                )
            }
            Error::Iceberg { source, .. } => source.retryable(),
            Error::Spec(_)
            | Error::Audit(_)
            | Error::Config(_)
            | Error::AlreadyCommitted { .. }
            | Error::SchemaRefused { .. }
            | Error::Event { .. }
            | Error::Recreated { .. }
            | Error::Internal(_)
            | Error::Query(_) => false,
        }
    }

    /// Wraps an Iceberg library error with what was being done.
    pub fn iceberg(context: impl Into<String>, source: iceberg::Error) -> Self {
        Error::Iceberg {
            context: context.into(),
            source: Box::new(source),
        }
    }

    /// Wraps a local I/O error with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
