//! The integration tests on the AWS backend, on the moto server that `scripts/test` starts (S3,
//! DynamoDB, Glue; a second one enforces IAM): one test binary, one module per area. Scenarios
//! shared with the other backend are in `tests/common/`.

#[path = "../common/mod.rs"]
mod common;

mod analyst;
mod derived;
mod evolution;
mod formats;
mod iam;
mod ingest;
mod joins;
mod reliability;
mod tables;
mod trino;
mod upsert_property;
mod windows;
