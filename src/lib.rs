//! streamtable: Kafka (MSK) topics to Apache Iceberg tables on AWS Lambda, exactly once.
//!
//! The crate is the pipeline, in the order data flows through it:
//!
//! **The model** — what flows and what it must look like:
//! - [`esm`]: the MSK event-source-mapping batch, the input contract;
//! - [`spec`]: the pipeline spec (topics to tables, columns, partitioning), validated at load;
//! - [`schema`]: spec to Iceberg schema, partition spec and Arrow schema;
//! - [`decode`]: one Kafka record to a typed row, or a dead letter with the reason;
//! - [`partition`]: partition values as safe directory names;
//! - [`generate`]: synthetic sources (orders, payments, readings) for the demo, tests and
//!   benchmarks.
//!
//! **The stages** — in pipeline order:
//! 1. [`ingest`]: an ESM batch to Parquet micro-files, checkpointed exactly once
//!    ([`checkpoint`] is its state machine); [`replay`] lands batches the mapping gave up on;
//! 2. [`process`]: derived tables in SQL (filters, derived columns, lookup joins to reference
//!    tables, fan-out), run on each batch and landed with it;
//! 3. [`commit`]: pending micro-files become Iceberg snapshots, exactly once;
//! 4. [`compact`]: small files rewritten into large ones in `replace` snapshots;
//! 5. [`maintenance`]: snapshot expiry, orphan clean-up, manifest merge;
//! 6. [`scheduled`]: commit, compaction and maintenance as one bounded run;
//! 7. [`query`]: SQL over the tables, read-only (feature `query`); [`athena`] lists what
//!    Athena needs of a table.
//!
//! **The adapters** — one trait each, an AWS and an embedded implementation:
//! - [`state`]: checkpoints, pending batches, commit intents, locks (DynamoDB / SQLite);
//! - [`catalog`]: the table pointer with compare-and-set (Glue / SQLite);
//! - [`storage`]: the warehouse's objects (S3 / a local directory);
//! - [`aws`]: SDK configuration and error classification (feature `aws`).
//!
//! **Running it**: [`config`] (environment to [`config::Backend`]), [`tables`] (the pipeline's
//! tables in the catalog), [`lambda`] (the handlers around the stages, feature `lambda`),
//! [`telemetry`] (JSON logs, CloudWatch metrics), [`status`] (what an operator looks at),
//! [`clock`], [`error`]. The command line
//! (`streamtable …`) is [`cli`] (feature `cli`), which the Lambda functions do not link.

#![warn(missing_docs)]

// The model.
pub mod decode;
pub mod esm;
pub mod generate;
pub mod partition;
pub mod registry;
pub mod schema;
pub mod spec;

// The stages.
pub mod athena;
pub mod checkpoint;
pub mod commit;
pub mod compact;
pub mod ingest;
pub mod maintenance;
pub mod process;
#[cfg(feature = "query")]
pub mod query;
pub mod replay;
pub mod scheduled;

// The adapters.
#[cfg(feature = "aws")]
pub mod aws;
pub mod catalog;
pub mod state;
pub mod storage;

// Running it.
pub mod clock;
pub mod config;
pub mod error;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod status;
pub mod tables;
pub mod telemetry;

// The command line.
#[cfg(feature = "cli")]
pub mod cli;

pub use error::{Error, Result};
