//! streamtable's model: what flows through the pipeline and what it must look like. Pure
//! logic, no I/O beyond reading a spec file, no AWS, no SQL engine, no catalog.
//!
//! In the order data meets them:
//! - [`esm`]: the MSK event-source-mapping batch, the input contract;
//! - [`spec`]: the pipeline spec (topics to tables, columns, partitioning), validated at load;
//!   a derived table's SQL is planned through the [`spec::SqlPlanner`] seam, which the
//!   processing crate implements;
//! - [`kafka`]: the Kafka columns every topic's table carries, defined once;
//! - [`schema`]: spec to Iceberg schema, partition spec and Arrow schema;
//! - [`decode`]: one Kafka record to a typed row, or a dead letter with the reason;
//! - [`checkpoint`]: the exactly-once state machine of a topic-partition (a pure `plan`);
//! - [`partition`]: partition values as safe directory names;
//! - [`clock`]: time, and times as text;
//! - [`error`]: the library's error, with whether it is retryable;
//! - [`generate`]: synthetic sources (orders, payments, readings) for the demo, tests and
//!   benchmarks.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod clock;
pub mod decode;
pub mod error;
pub mod esm;
pub mod generate;
pub mod kafka;
pub mod ledger;
pub mod partition;
pub mod schema;
pub mod spec;

pub use error::{Error, Result};
