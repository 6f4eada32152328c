//! Commits triggered by landed batches: fresher tables than the schedule alone gives, and at
//! most one commit per `interval`.
//!
//! On AWS the state table's stream invokes the scheduled function for every new pending item
//! (its event source mapping batches them for the same interval); on the embedded backend the
//! caller triggers after each landed batch. A triggered commit takes the commit lease
//! ([`super::lease`], waiting for it: no two committers commit side by side), waits until `interval` has passed
//! since the last commit (triggered or scheduled, kept as a status document), and commits one
//! round: one snapshot per table. Whatever lands meanwhile is taken by the next trigger.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::lease::Lease;
use super::{CommitOptions, CommitReport, commit_rounds};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::tables::TableSet;

/// Status key of the last commit's time.
pub const LAST_COMMIT_KEY: &str = "commit.last";
/// Default: least time between two triggered commits.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Serialize, Deserialize)]
struct LastCommit {
    at_ms: i64,
}

/// When the last commit that committed something finished (epoch ms; 0 if never).
pub async fn last_commit_ms(backend: &Backend) -> Result<i64> {
    match backend.state.status(LAST_COMMIT_KEY).await? {
        None => Ok(0),
        Some(json) => serde_json::from_str::<LastCommit>(&json)
            .map(|l| l.at_ms)
            .map_err(|e| Error::Internal(format!("last commit status: {e}"))),
    }
}

/// Records that a commit finished at `at_ms`.
pub async fn record_commit(backend: &Backend, at_ms: i64) -> Result<()> {
    let json = serde_json::to_string(&LastCommit { at_ms })
        .map_err(|e| Error::Internal(format!("last commit status: {e}")))?;
    backend.state.put_status(LAST_COMMIT_KEY, &json).await
}

/// What a triggered commit did.
#[derive(Debug, Default)]
pub struct Triggered {
    /// The commit, unless the deadline came first.
    pub report: Option<CommitReport>,
    /// Time spent waiting for the lock and the interval before committing.
    pub waited: Duration,
}

/// Commits one round once `interval` has passed since the last commit, unless `deadline`
/// comes first (then the next trigger or the schedule commits).
pub async fn commit_when_due(
    backend: &Backend,
    tables: &TableSet,
    options: &CommitOptions,
    deadline: Instant,
) -> Result<Triggered> {
    let interval = options.min_interval;
    let started = Instant::now();
    let Some(lease) = Lease::acquire(backend, "trigger", deadline).await? else {
        return Ok(Triggered {
            report: None,
            waited: started.elapsed(),
        });
    };
    let mut waited = started.elapsed();
    let result = async {
        let last = last_commit_ms(backend).await?;
        let due = last.saturating_add(i64::try_from(interval.as_millis()).unwrap_or(i64::MAX));
        let wait = Duration::from_millis(u64::try_from(due - backend.clock.now_ms()).unwrap_or(0));
        if Instant::now() + wait > deadline {
            return Ok(None);
        }
        tokio::time::sleep(wait).await;
        waited = started.elapsed();
        let one_round = CommitOptions {
            max_rounds: 1,
            ..options.clone()
        };
        let report = commit_rounds(backend, tables, &one_round, Some(deadline), &lease).await?;
        if report.files() > 0 {
            record_commit(backend, backend.clock.now_ms()).await?;
        }
        Ok(Some(report))
    }
    .await;
    lease.release(backend).await;
    let report = result?;
    Ok(Triggered { report, waited })
}
