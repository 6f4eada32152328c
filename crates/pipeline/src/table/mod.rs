//! What every writer of a table shares: the commit stage, compaction, maintenance, the interval
//! joins and the reference tables all write Parquet data files ([`encode`]) projected to the
//! table's schema ([`project`]), read a snapshot's files ([`files`]), build `replace` snapshots
//! by hand ([`replace`], on `snapshot`), find a pending batch's files ([`pending`]), and mark their snapshots
//! with the [`properties`] by which a commit is recognised after a crash.

pub mod encode;
pub mod files;
pub mod lock;
pub mod pending;
pub mod project;
pub mod properties;
pub mod replace;
pub(crate) mod snapshot;
pub(crate) mod split;
pub mod tuning;

pub use properties::{
    COMMIT_ID_PROPERTY, JOIN_STATE_PROPERTY, KEY_INDEX_PROPERTY, KEY_INDEX_RUNS_PROPERTY,
    OFFSET_PROPERTY_PREFIX, PRIMARY_KEY_PROPERTY, REPLACE_ID_PROPERTY,
};
