//! When each topic-partition's newest committed batch landed: the commit stage's own record,
//! rewritten after every round, that `streamtable status` shows as a partition's last landing
//! once its pending batches are gone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::checkpoint::PendingBatch;
use crate::error::{Error, Result};

/// Key of the landings in the state store's status items.
pub const LANDED_KEY: &str = "landed";
/// Most topic-partitions the landings keep (the least recently landed are dropped past it).
pub const LANDED_LIMIT: usize = 10_000;

/// When each topic-partition's newest committed batch landed, and the offset after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Landings {
    /// `topic/partition` → (next offset, landed at, epoch ms).
    pub partitions: BTreeMap<String, (i64, i64)>,
}

impl Landings {
    /// Takes in the batches of a committed round.
    pub fn add(&mut self, batches: &[PendingBatch]) {
        for b in batches {
            for r in b.ranges() {
                let key = format!("{}/{}", r.source.topic, r.source.partition);
                let seen = (r.last_offset + 1, b.created_at_ms);
                let e = self.partitions.entry(key).or_insert(seen);
                if seen.1 > e.1 || (seen.1 == e.1 && seen.0 > e.0) {
                    *e = seen;
                }
            }
        }
        if self.partitions.len() > LANDED_LIMIT {
            let mut by_age: Vec<(i64, String)> = self
                .partitions
                .iter()
                .map(|(k, v)| (v.1, k.clone()))
                .collect();
            by_age.sort();
            let excess = self.partitions.len() - LANDED_LIMIT;
            for (_, k) in by_age.into_iter().take(excess) {
                self.partitions.remove(&k);
            }
        }
    }

    /// The landings the state store has.
    pub async fn load(backend: &Backend) -> Result<Landings> {
        match backend.state.status(LANDED_KEY).await? {
            None => Ok(Landings::default()),
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| Error::Internal(format!("landings status: {e}"))),
        }
    }
}

/// Records the batches of a committed round (never fails the commit: a status that cannot be
/// written is logged).
pub async fn record_committed(backend: &Backend, batches: &[PendingBatch]) {
    if batches.is_empty() {
        return;
    }
    let written = async {
        let mut landings = Landings::load(backend).await?;
        landings.add(batches);
        let json = serde_json::to_string(&landings).map_err(|e| Error::Internal(e.to_string()))?;
        backend.state.put_status(LANDED_KEY, &json).await
    };
    if let Err(e) = written.await {
        tracing::warn!(error = %e, "landing times not recorded (`streamtable status` shows older ones)");
    }
}
