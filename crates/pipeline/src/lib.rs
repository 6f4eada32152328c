//! streamtable's pipeline: the stages that turn ESM batches into Iceberg tables, exactly once,
//! over the adapters they run on. It sits on [`streamtable_model`] (what flows) and
//! [`streamtable_process`] (the SQL planner and operators); the command line and the Lambda
//! functions sit on it.
//!
//! **The stages**, in pipeline order:
//! 1. [`ingest`]: an ESM batch to Parquet micro-files, checkpointed exactly once; [`replay`]
//!    lands batches the mapping gave up on;
//! 2. processing ([`process`], the crate below) runs inside ingest: derived tables, windows,
//!    dedup, with state that moves with the checkpoint;
//! 3. [`commit`]: pending micro-files become Iceberg snapshots, exactly once, and interval joins
//!    run over what a round lands;
//! 4. [`compact`]: small files rewritten into large ones in `replace` snapshots;
//! 5. [`maintenance`]: snapshot expiry, orphan clean-up, manifest merge;
//! 6. [`scheduled`]: commit, compaction and maintenance as one bounded run.
//!
//! **Tables**: [`tables`] (the pipeline's tables in the catalog: creation, evolution, views),
//! [`table`] (what every writer of a table shares: data files written, snapshots built by
//! hand, snapshot properties), [`references`] (reference tables read for lookups), [`athena`]
//! (what Athena needs of a table).
//!
//! **The adapters** — one trait each, an AWS and an embedded implementation:
//! - [`store`]: the state store — checkpoints, pending batches, partition states, commit
//!   intents, locks (DynamoDB / SQLite);
//! - [`catalog`]: the table pointer with compare-and-set (Glue / SQLite);
//! - [`storage`]: the warehouse's objects (S3 / a local directory);
//! - [`registry`]: writer schemas (Confluent-compatible, Glue, a directory);
//! - [`aws`]: SDK configuration and error classification (feature `aws`).
//!
//! **Running it**: [`config`] (the environment to a [`config::Config`]), [`backend`] (the
//! clients, built once), [`lambda`] (the handlers around the stages, feature `lambda`),
//! [`telemetry`] (JSON logs, CloudWatch metrics), [`status`] (what an operator looks at).

#![warn(missing_docs)]

pub use streamtable_model::{
    Error, Result, checkpoint, clock, decode, error, esm, generate, kafka, ledger, partition,
    schema, spec,
};
pub use streamtable_process as process;

// The stages.
pub mod commit;
pub mod compact;
pub mod ingest;
pub mod maintenance;
pub mod replay;
pub mod scheduled;
pub mod upsert;

// The processor plans interval joins when its `sql` feature is on, and the commit stage runs
// them only under this crate's: a processor with SQL under a pipeline without it would load
// join specs whose rows never come.
const _: () = assert!(
    streamtable_process::SQL == cfg!(feature = "sql"),
    "streamtable-pipeline's `sql` feature must match streamtable-process's"
);

// Tables.
pub mod athena;
#[cfg(feature = "sql")]
pub mod references;
pub mod table;
pub mod tables;

// The adapters.
#[cfg(feature = "aws")]
pub mod aws;
pub mod catalog;
pub mod registry;
pub mod storage;
pub mod store;

// Running it.
pub mod backend;
pub mod config;
pub mod failure;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod status;
pub mod telemetry;
