//! Processing: derived tables defined in SQL, run on each batch between decoding and encoding.
//!
//! A derived table is `SELECT <expressions> FROM <topic's table> [JOIN <reference table> ON
//! <keys>] [WHERE <predicate>]`, planned once with DataFusion when the spec loads
//! ([`infer`] gives its columns; [`Processor`] holds the plans). Each batch of decoded rows of a
//! topic's table is run through every derived table fed by it, in the ingest Lambda, and the
//! derived files ride in the same pending batch and the same conditional checkpoint write as
//! the topic's own table: exactly once with no state of their own. A row that fails a derived
//! table's expression (a division by zero, a failed cast) is a dead letter naming that table;
//! the topic's table and the other derived tables still get it.
//!
//! - `plan.rs`: SQL → logical plan → the supported shape;
//! - `refuse.rs`: everything else, refused with the construct named and where it is;
//! - `lookup.rs`: the lookup join against an in-memory reference table;
//! - `reference.rs`: reading reference tables from the catalog, refreshed on an interval;
//! - `run.rs`: a plan evaluated on a batch, row by row where the batch fails.
//!
//! Built only with feature `sql` (DataFusion); without it a spec with derived tables is
//! refused when it loads.

pub mod cell;
#[cfg(feature = "sql")]
mod dedup;
#[cfg(feature = "sql")]
mod join;
#[cfg(feature = "sql")]
mod lookup;
#[cfg(feature = "sql")]
mod plan;
#[cfg(feature = "sql")]
pub mod reference;
#[cfg(feature = "sql")]
mod refuse;
#[cfg(feature = "sql")]
mod run;
pub mod sketch;
pub mod state;
#[cfg(feature = "sql")]
mod stateful;
#[cfg(feature = "sql")]
pub mod window;

#[cfg(feature = "sql")]
mod processor;
#[cfg(feature = "sql")]
pub use processor::{Derived, Processor};
#[cfg(not(feature = "sql"))]
mod without_sql;
#[cfg(not(feature = "sql"))]
pub use without_sql::{Derived, Processor};

use crate::spec::{ColumnType, ReferenceSpec, TableSpec};

/// Why a derived table's SQL was refused, and where in the SQL (a byte offset) if known.
#[derive(Debug, Clone)]
pub struct SqlError {
    /// What is wrong and what to do instead.
    pub message: String,
    /// Byte offset into the SQL of the construct, when it can be located.
    pub at: Option<usize>,
}

/// What planning a derived table's SQL tells the spec.
#[derive(Debug, Clone)]
pub struct Inferred {
    /// The topic's table it reads.
    pub source: String,
    /// The reference tables it joins to.
    pub references: Vec<String>,
    /// Its columns and their types, in order (the Kafka columns come on top). For a windowed
    /// table, the columns of its partial rows.
    pub columns: Vec<(String, ColumnType)>,
    /// For a windowed table: the SQL of the view that merges its partial rows, over the table
    /// named [`PARTIALS_PLACEHOLDER`], for `streamtable query` and for Athena.
    pub view: Option<(String, String)>,
    /// The view's columns and their Athena (Trino) types.
    pub view_columns: Vec<(String, String)>,
    /// For an interval join between two topics' tables: how it runs.
    pub join: Option<crate::spec::IntervalJoin>,
}

/// Stands for the partial table's name in [`Inferred::view`].
pub const PARTIALS_PLACEHOLDER: &str = "{partials}";

/// Plans `sql` over the topics' `tables` and the `references`: its source, its columns, or
/// why it cannot run on a stream.
pub fn infer(
    tables: &[TableSpec],
    references: &[ReferenceSpec],
    sql: &str,
) -> Result<Inferred, SqlError> {
    #[cfg(feature = "sql")]
    {
        let p = plan::plan(tables, references, sql)?;
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
        let _ = (tables, references, sql);
        Err(SqlError {
            message: "this build of streamtable has no SQL processing (feature `sql`); use a build with it, or remove [[derived_tables]]".into(),
            at: None,
        })
    }
}

#[cfg(all(test, feature = "sql"))]
mod tests;
