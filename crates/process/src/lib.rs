//! streamtable's processing: derived tables defined in SQL, planned with DataFusion and run on
//! Arrow batches and partition state. No I/O: no storage, no catalog, no state store; what it
//! needs from them comes in (decoded batches, partition states, reference tables through
//! [`reference::ReferenceSource`]) and goes out (rows, new states) through the pipeline crate.
//!
//! A derived table is `SELECT <expressions> FROM <topic's table> [JOIN <reference table> ON
//! <keys>] [WHERE <predicate>]`, a window over one topic's table, or an interval join of two.
//! It is planned when the spec loads ([`Planner`], the spec's [`spec::SqlPlanner`] seam) and
//! again when ingest starts ([`Processor`] holds the plans). Each batch of decoded rows of a
//! topic's table runs through every derived table fed by it, in the ingest Lambda, and the
//! derived files ride in the same pending batch and the same conditional checkpoint write as
//! the topic's own table. A row that fails a derived table's expression (a division by zero, a
//! failed cast) is a dead letter naming that table; the topic's table and the other derived
//! tables still get it.
//!
//! Planning:
//! - `context.rs`: DataFusion's SQL front end, functions and physical expressions, without a
//!   session or an execution engine;
//! - `planner.rs`: SQL → logical plan → the supported shape (rows, a window, an interval join);
//! - `refuse.rs`: everything else, refused with the construct named and where it is;
//! - `interval_join.rs`: the interval join between two topics, planned here and run by the
//!   commit stage.
//!
//! Running:
//! - `run.rs`: a row plan evaluated on a batch, row by row where the batch fails;
//! - `lookup.rs`: the lookup join against an in-memory reference table; [`reference`]: the
//!   loaded copies, refreshed on an interval;
//! - [`window`]: event-time windows (tumbling, hopping, sessions) and their aggregates;
//! - `dedup.rs`: dedup by key within an event-time bound;
//! - `stateful.rs`: a source's stateful tables, partition by partition;
//! - `processor.rs`: [`Processor`], all of a pipeline's derived tables.
//!
//! State: [`partition_state`] (what a partition keeps between invocations and its stored
//! layouts), [`value`] (a value kept in state), [`sketch`] (`approx_distinct`'s HyperLogLog).
//!
//! Built with feature `sql` (DataFusion); without it, state still reads and a spec with derived
//! tables is refused when it loads.

#![warn(missing_docs)]

#[cfg(feature = "sql")]
mod context;
#[cfg(feature = "sql")]
mod dedup;
#[cfg(feature = "sql")]
#[doc(hidden)]
pub mod fuzz;
#[cfg(feature = "sql")]
pub mod guard;
#[cfg(feature = "sql")]
mod interval_join;
#[cfg(feature = "sql")]
mod lookup;
pub mod partition_state;
#[cfg(feature = "sql")]
mod planner;
#[cfg(feature = "sql")]
pub mod reference;
#[cfg(feature = "sql")]
mod refuse;
#[cfg(feature = "sql")]
mod run;
pub mod sketch;
#[cfg(feature = "sql")]
mod stateful;
pub mod value;
#[cfg(feature = "sql")]
pub mod window;

#[cfg(feature = "sql")]
mod processor;
#[cfg(feature = "sql")]
pub use planner::{
    MAX_EXPR_DEPTH, MAX_PLANNED_DEPTH, MAX_PLANNED_TERMS, MAX_SQL_BYTES, MAX_SQL_TOKENS,
};
#[cfg(feature = "sql")]
pub use processor::{Derived, Processor};
#[cfg(not(feature = "sql"))]
mod without_sql;
#[cfg(not(feature = "sql"))]
pub use without_sql::{Derived, Processor};

/// DataFusion's crates, under the names the `datafusion` crate gives them (the planner links
/// them, not the engine: see `context.rs`).
#[cfg(feature = "sql")]
mod df {
    pub use datafusion_common as common;
    pub use datafusion_common::arrow;
    pub use datafusion_expr as logical_expr;
    pub use datafusion_physical_expr as physical_expr;
    pub use datafusion_sql as sql;
}

#[cfg(feature = "sql")]
use streamtable_model::{clock, kafka};
#[cfg(test)]
use streamtable_model::{decode, generate};
use streamtable_model::{error, schema, spec};

pub use crate::spec::{Inferred, PARTIALS_PLACEHOLDER, SqlError};

/// Whether this build plans SQL (the `sql` feature): a crate that runs what the planner
/// plans checks that it was built the same way.
pub const SQL: bool = cfg!(feature = "sql");
use crate::spec::{ReferenceSpec, SqlPlanner, TableSpec};

/// The processing stage's planner (DataFusion), as the spec loader asks for it: planning a
/// derived table's SQL gives its source, its columns, or why it cannot run on a stream.
#[derive(Debug, Clone, Copy, Default)]
pub struct Planner;

impl SqlPlanner for Planner {
    fn infer(
        &self,
        tables: &[TableSpec],
        references: &[ReferenceSpec],
        sql: &str,
    ) -> Result<Inferred, SqlError> {
        infer(tables, references, sql)
    }

    fn infer_within(
        &self,
        tables: &[TableSpec],
        references: &[ReferenceSpec],
        sql: &str,
        settings: &streamtable_model::spec::Settings,
    ) -> Result<Inferred, SqlError> {
        infer_with_limits(tables, references, sql, settings.max_record_bytes)
    }
}

/// Plans `sql` over the topics' `tables` and the `references`: its source, its columns, or
/// why it cannot run on a stream.
pub fn infer(
    tables: &[TableSpec],
    references: &[ReferenceSpec],
    sql: &str,
) -> Result<Inferred, SqlError> {
    infer_with_limits(
        tables,
        references,
        sql,
        streamtable_model::spec::DEFAULT_MAX_RECORD_BYTES,
    )
}

/// [`infer`] for a pipeline whose records are at most `max_record_bytes`: a call whose
/// constant arguments make larger values is refused.
pub fn infer_with_limits(
    tables: &[TableSpec],
    references: &[ReferenceSpec],
    sql: &str,
    max_record_bytes: usize,
) -> Result<Inferred, SqlError> {
    #[cfg(feature = "sql")]
    {
        let limits = guard::Limits::for_records(max_record_bytes);
        let p = planner::plan(tables, references, sql, limits)?;
        Ok(Inferred {
            source: p.source().to_string(),
            references: p.references(),
            columns: p.columns()?,
            view: p.view_sql(),
            view_columns: p.view_columns(),
            join: p.join(),
        })
    }
    #[cfg(not(feature = "sql"))]
    {
        let _ = max_record_bytes;
        streamtable_model::spec::NoSql.infer(tables, references, sql)
    }
}

#[cfg(all(test, feature = "sql"))]
mod tests;
