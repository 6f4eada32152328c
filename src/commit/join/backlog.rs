//! The backlog of an interval join: the data files of rounds that could not run, joined by a
//! later round.
//!
//! A round that fails (or dies twice) commits an empty snapshot to the join table under its
//! commit id whose state names a backlog object: every side file of every deferred round, and
//! which of them already had their late rows dead-lettered (the attempt that failed may have
//! committed them before the join table). The object is immutable and content-named; the
//! snapshot summary carries only its name, so a long outage does not grow every snapshot.
//! Maintenance keeps the files a backlog names while it waits (expiry and orphan clean-up would
//! otherwise delete them once compaction replaced them), and a backlog file that is gone anyway
//! is skipped and counted, never a join stopped for good.

use std::collections::BTreeSet;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::config::Backend;
use crate::error::{Error, Result};

/// The files of deferred rounds, per side.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Backlog {
    /// The left side's files, in the order their rounds were deferred.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<String>,
    /// The right side's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub right: Vec<String>,
    /// Files whose late rows the failed attempt already dead-lettered: the round that joins
    /// them judges them against the same watermark (a deferral does not move the state), and
    /// writes no dead letter for them again.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub judged: BTreeSet<String>,
}

impl Backlog {
    /// The backlog the object at `location` holds (none: empty).
    pub async fn read(backend: &Backend, location: Option<&str>) -> Result<Backlog> {
        let Some(location) = location else {
            return Ok(Backlog::default());
        };
        let bytes = backend.warehouse.read(location).await?;
        serde_json::from_slice(&bytes).map_err(|e| Error::State {
            op: "read join backlog",
            message: format!("{location}: {e}"),
            retryable: false,
        })
    }

    /// Writes the backlog as a content-named object of join `table`; its location.
    pub async fn write(&self, backend: &Backend, table: &str, intent: &str) -> Result<String> {
        let json = serde_json::to_vec(self).map_err(|e| Error::Internal(e.to_string()))?;
        let hash = xxhash_rust::xxh3::xxh3_64(&json);
        let location = format!(
            "{}/_state/join/{table}/{intent}-backlog-{hash:016x}.json",
            backend.warehouse.root().trim_end_matches('/')
        );
        backend
            .warehouse
            .write(&location, Bytes::from(json))
            .await?;
        Ok(location)
    }

    /// Every file it names.
    pub fn files(&self) -> impl Iterator<Item = &String> {
        self.left.iter().chain(self.right.iter())
    }
}
