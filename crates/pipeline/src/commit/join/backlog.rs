//! The backlog of an interval join: the data files of rounds that could not run, joined by a
//! later round.
//!
//! A round that fails (or dies twice) commits an empty snapshot to the join table under its
//! commit id whose state names a backlog object: every deferred round, with its intent and its
//! files of each side. An attempt that failed may have committed its late rows (those of the
//! backlog before it and its own) before the join table: the round that joins the backlog finds
//! which by the rounds' `{intent}/{table}/late` commits in `dead_letters`, and writes no dead
//! letter for them again. The object is immutable and content-named; the snapshot summary
//! carries only its name, so a long outage does not grow every snapshot.
//! Maintenance keeps the files a backlog names while it waits (expiry and orphan clean-up would
//! otherwise delete them once compaction replaced them), and a backlog file that is gone anyway
//! is skipped and counted, never a join stopped for good.

use std::collections::BTreeSet;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::error::{Error, Result};

/// The files of deferred rounds, in the order they were deferred.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Backlog {
    /// One entry per deferred round.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<Round>,
}

/// One deferred round: its intent and its files of each side.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Round {
    /// The intent that landed the files (its commit id names the round's dead letters).
    pub intent: String,
    /// The left side's files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<String>,
    /// The right side's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub right: Vec<String>,
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
        self.rounds
            .iter()
            .flat_map(|r| r.left.iter().chain(r.right.iter()))
    }

    /// Each side's files, in order.
    pub fn sides(&self) -> (Vec<String>, Vec<String>) {
        let left = self.rounds.iter().flat_map(|r| r.left.clone()).collect();
        let right = self.rounds.iter().flat_map(|r| r.right.clone()).collect();
        (left, right)
    }

    /// The files whose late rows were dead-lettered already: an attempt of round `k` judged
    /// every file of the rounds before it and its own, so every round up to the last one whose
    /// late dead letters (`late_landed`) landed.
    pub fn judged(&self, late_landed: impl Fn(&str) -> bool) -> BTreeSet<String> {
        let Some(last) = self.rounds.iter().rposition(|r| late_landed(&r.intent)) else {
            return BTreeSet::new();
        };
        self.rounds[..=last]
            .iter()
            .flat_map(|r| r.left.iter().chain(r.right.iter()).cloned())
            .collect()
    }
}
