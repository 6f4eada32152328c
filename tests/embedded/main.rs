//! The integration tests on the embedded backend (SQLite and a local directory), and the properties
//! that need no backend: one test binary, one module per area. Scenarios shared with the other
//! backend are in `tests/common/`.

#[path = "../common/mod.rs"]
mod common;

mod analyst;
mod chaos;
mod derived;
mod evolution;
mod exactly_once_property;
mod formats;
mod fuzz_properties;
mod ingest;
mod joins;
mod kafka;
mod reliability;
mod tables;
mod upsert_property;
mod windows;
