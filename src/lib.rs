//! streamtable: Kafka (MSK) topics to Apache Iceberg tables on AWS Lambda, exactly once.
//!
//! This crate is the command line (`streamtable …`, feature `cli`) and `streamtable query`
//! (feature `query`), on top of the crates that are the pipeline's floors, each depending only
//! on the ones below it:
//!
//! 1. `streamtable-model` ([`spec`], [`schema`], [`decode`], [`checkpoint`], [`esm`], …): what
//!    flows and its rules, pure;
//! 2. `streamtable-process` ([`process`]): the SQL planner and the operators on Arrow batches
//!    and partition state, no I/O;
//! 3. `streamtable-pipeline` ([`ingest`], [`commit`], [`compact`], [`maintenance`],
//!    [`scheduled`], and the adapters [`store`], [`catalog`], [`storage`]): the stages;
//! 4. this crate, `functions/ingest` and `functions/scheduled` (the Lambda binaries) and
//!    `crates/bench` (the benchmarks).
//!
//! Everything below is re-exported here, so `streamtable::ingest::Ingestor` names the same type
//! as `streamtable_pipeline::ingest::Ingestor`.

#![warn(missing_docs)]

pub use streamtable_pipeline::*;

#[cfg(feature = "query")]
pub mod audit;
#[cfg(all(feature = "cli", feature = "kafka"))]
pub mod broker;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "query")]
pub mod query;
