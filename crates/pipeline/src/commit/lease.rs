//! The commit lease: one committer at a time, whoever it is — the scheduled run, a commit
//! triggered by landed batches, a command-line commit.
//!
//! A committer takes the `commit` lease before its first round; while it holds it, a heartbeat
//! renews it every [`HEARTBEAT`], and each round starts with a renewal: a committer that finds
//! the lease taken over (it stalled past the lease's end and another took it) stops before
//! starting another round. A lease lasts [`HOLD_MS`] past its last renewal, so a committer that
//! died (a timeout, out of memory) holds the others back that long at most. The lease is not
//! what makes a commit exactly once — every swap re-checks the commit id against the table's
//! history (see [`crate::catalog::TableCatalog::commit_metadata`]), so even a committer that lost
//! its lease mid-round cannot land a commit id twice — but it keeps two committers from doing
//! the same work side by side (the interval join's round, in particular).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::Result;

/// Name of the lease.
pub const LEASE: &str = "commit";

/// How long a lease lasts after its last renewal, ms.
pub const HOLD_MS: i64 = 60_000;

/// How often a held lease is renewed.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Holders of this process whose release failed (the store did not answer): the lease may
/// still be theirs, and the next committer of this process takes it over at once instead of
/// waiting for it to expire.
static ABANDONED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A held commit lease; renewed in the background until released or dropped.
#[derive(Debug)]
pub struct Lease {
    holder: String,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

async fn take(backend: &Backend, holder: &str) -> Result<bool> {
    let now = backend.clock.now_ms();
    backend
        .state
        .try_lock(LEASE, holder, now, now.saturating_add(HOLD_MS))
        .await
}

impl Lease {
    /// Takes the lease for `who` (`scheduled`, `trigger`, …), waiting for it until `deadline`;
    /// `None` when another committer held it all that time. A store that does not answer is
    /// asked again with the same holder (a take whose answer was lost is this committer's).
    pub async fn acquire(backend: &Backend, who: &str, deadline: Instant) -> Result<Option<Lease>> {
        let abandoned = ABANDONED.lock().ok().and_then(|mut a| a.pop());
        // A holder taken over is kept, never dropped for another (it may hold the lease).
        let mut reused = abandoned.is_some();
        let mut holder = abandoned.unwrap_or_else(|| {
            format!(
                "{who}-{}-{:x}",
                std::process::id(),
                crate::clock::jitter(u64::MAX / 2).as_nanos()
            )
        });
        // Whether a take by `holder` may have been applied with its answer lost (it then holds
        // the lease, and must keep asking as itself).
        let mut maybe_holds = false;
        loop {
            // A holder of this process abandoned meanwhile (its release failed) may be the one
            // in the way: take it over instead of waiting for it to expire.
            if !maybe_holds
                && !reused
                && let Some(abandoned) = ABANDONED.lock().ok().and_then(|mut a| a.pop())
            {
                holder = abandoned;
                reused = true;
            }
            match take(backend, &holder).await {
                Ok(true) => {
                    let heartbeat = {
                        let (backend, holder) = (backend.clone(), holder.clone());
                        tokio::spawn(async move {
                            loop {
                                tokio::time::sleep(HEARTBEAT).await;
                                match take(&backend, &holder).await {
                                    Ok(true) => {}
                                    Ok(false) => {
                                        tracing::warn!(holder, "the commit lease was taken over");
                                        return;
                                    }
                                    Err(e) => {
                                        tracing::warn!(holder, error = %e, "the commit lease was not renewed; trying again");
                                    }
                                }
                            }
                        })
                    };
                    return Ok(Some(Lease { holder, heartbeat }));
                }
                Ok(false) => {}
                Err(e) if Instant::now() + Duration::from_millis(200) > deadline => {
                    Self::abandon(holder);
                    return Err(e);
                }
                Err(e) => {
                    maybe_holds = true;
                    tracing::warn!(holder, error = %e, "taking the commit lease failed; trying again");
                }
            }
            if Instant::now() + Duration::from_millis(200) > deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100) + crate::clock::jitter(100)).await;
        }
    }

    /// A holder that may hold the lease without anyone using it.
    fn abandon(holder: String) {
        if let Ok(mut a) = ABANDONED.lock() {
            a.push(holder);
        }
    }

    /// Extends the lease if this committer still holds it (or it is free); `false` when
    /// another committer has taken it over.
    pub async fn renew(&self, backend: &Backend) -> Result<bool> {
        take(backend, &self.holder).await
    }

    /// Who holds it (logs).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Releases the lease. A release the store did not answer is not an error: the lease
    /// expires by itself, and this process's next committer takes it over at once.
    pub async fn release(self, backend: &Backend) {
        self.heartbeat.abort();
        if let Err(e) = backend.state.unlock(LEASE, &self.holder).await {
            tracing::warn!(holder = %self.holder, error = %e, "the commit lease was not released; it expires by itself");
            Self::abandon(self.holder.clone());
        }
    }
}
