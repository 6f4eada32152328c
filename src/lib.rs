//! streamtable: Kafka (MSK) topics to Apache Iceberg tables on AWS Lambda, exactly once.
//!
//! The pipeline stages, each in its own module:
//!
//! - [`spec`]: the pipeline spec (topics to tables, columns, partitioning), validated at load.
//! - [`schema`]: spec to Iceberg schema, partition spec and Arrow schema.
//! - [`decode`]: one Kafka record to a typed row, or a dead letter with the reason.

pub mod decode;
pub mod error;
pub mod esm;
#[cfg(feature = "query")]
pub mod query;
pub mod replay;
pub mod scheduled;
pub mod schema;
pub mod spec;

pub use error::{Error, Result};
#[cfg(feature = "query")]
pub mod analyst;
pub mod athena;
#[cfg(feature = "aws")]
pub mod aws;
pub mod bench;
pub mod catalog;
pub mod checkpoint;
pub mod cli;
pub mod clock;
pub mod commit;
pub mod compact;
pub mod config;
#[cfg(feature = "query")]
pub mod dashboard;
#[cfg(feature = "query")]
pub mod demo;
pub mod generate;
pub mod ingest;
pub mod maintenance;
pub mod overview;
pub mod partition;
pub mod state;
pub mod storage;
pub mod tables;
pub mod telemetry;
pub mod writer;
