//! The commit lease: one committer at a time, whoever it is — the scheduled run, a commit
//! triggered by landed batches, a command-line commit.
//!
//! A committer takes the `commit` lease before its first round and renews it before every
//! round after; a committer that finds the lease taken over (it stalled past the lease's end
//! and another took it) stops before starting another round. The lease is not what makes a
//! commit exactly once — every swap re-checks the commit id against the table's history (see
//! [`crate::catalog::TableCatalog::commit_metadata`]), so even a committer that lost its lease
//! mid-round cannot land a commit id twice — but it keeps two committers from doing the same
//! work side by side (the interval join's round, in particular).

use std::time::{Duration, Instant};

use crate::config::Backend;
use crate::error::Result;

/// Name of the lease.
pub const LEASE: &str = "commit";

/// How long after its deadline a committer's lease lasts (a committer that crashed holds it
/// this long past the time it meant to finish).
const MARGIN_MS: i64 = 60_000;

/// A held commit lease.
#[derive(Debug)]
pub struct Lease {
    holder: String,
    /// How long each take or renewal holds it, ms.
    hold_ms: i64,
}

impl Lease {
    /// Takes the lease for `who` (`scheduled`, `trigger`, …), waiting for it until `deadline`;
    /// `None` when another committer held it all that time. The lease lasts until the
    /// deadline plus a margin, and each [`Lease::renew`] extends it by as much.
    pub async fn acquire(backend: &Backend, who: &str, deadline: Instant) -> Result<Option<Lease>> {
        let started = Instant::now();
        let hold_ms = i64::try_from(deadline.saturating_duration_since(started).as_millis())
            .unwrap_or(i64::MAX / 4)
            .saturating_add(MARGIN_MS);
        let lease = Lease {
            holder: format!(
                "{who}-{}-{:x}",
                std::process::id(),
                crate::clock::jitter(u64::MAX / 2).as_nanos()
            ),
            hold_ms,
        };
        loop {
            if lease.renew(backend).await? {
                return Ok(Some(lease));
            }
            if Instant::now() + Duration::from_millis(200) > deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100) + crate::clock::jitter(100)).await;
        }
    }

    /// Extends the lease if this committer still holds it (or it is free); `false` when
    /// another committer has taken it over.
    pub async fn renew(&self, backend: &Backend) -> Result<bool> {
        let now = backend.clock.now_ms();
        backend
            .state
            .try_lock(LEASE, &self.holder, now, now.saturating_add(self.hold_ms))
            .await
    }

    /// Who holds it (logs).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Releases the lease (if still held).
    pub async fn release(self, backend: &Backend) -> Result<()> {
        backend.state.unlock(LEASE, &self.holder).await
    }
}
