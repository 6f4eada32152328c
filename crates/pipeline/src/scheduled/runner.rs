//! The runner of the scheduled stage's units of work: each unit (a table's part of a commit
//! round, an interval join's round, a partition's compaction, a table's maintenance) runs on a
//! task of its own, at most [`Runner::concurrency`] at once, so that a multi-threaded runtime
//! spreads them over every core. Units never share mutable state: each gets what it uses, its
//! result comes back to the coordinator in the units' order, and a unit that panics is reported
//! as that unit's failure while the others go on.
//!
//! Commits of two units to one table are serialized by [`crate::table::lock`], so units of one
//! process never race for a table's pointer; units of other processes still meet at the
//! catalog's compare-and-set.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;
use tokio::task::JoinSet;

/// Runs units of work in parallel.
#[derive(Debug, Clone)]
pub struct Runner {
    concurrency: usize,
    counters: Option<Arc<UnitCounters>>,
}

/// What the units of a runner (and its clones) did, counted as they end.
#[derive(Debug, Default)]
pub struct UnitCounters {
    run: AtomicU64,
    panicked: AtomicU64,
    busy_us: AtomicU64,
    longest_us: AtomicU64,
}

/// What a run's units did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UnitStats {
    /// Units that ended (with a result or an error).
    pub run: u64,
    /// Units that panicked (a bug; reported as their failure).
    pub panicked: u64,
    /// The runner's limit of units at once.
    pub concurrency: usize,
    /// Time the units took, added up.
    pub busy_ms: f64,
    /// The longest unit.
    pub longest_ms: f64,
}

impl UnitCounters {
    fn record(&self, started: Instant) {
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.run.fetch_add(1, Ordering::Relaxed);
        self.busy_us.fetch_add(us, Ordering::Relaxed);
        self.longest_us.fetch_max(us, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn stats(&self, concurrency: usize) -> UnitStats {
        UnitStats {
            run: self.run.load(Ordering::Relaxed),
            panicked: self.panicked.load(Ordering::Relaxed),
            concurrency,
            busy_ms: self.busy_us.load(Ordering::Relaxed) as f64 / 1e3,
            longest_ms: self.longest_us.load(Ordering::Relaxed) as f64 / 1e3,
        }
    }
}

/// A unit that panicked: its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitPanic(pub String);

impl std::fmt::Display for UnitPanic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the unit of work panicked: {} (a bug)", self.0)
    }
}

impl Runner {
    /// A runner of at most `concurrency` units at once (at least 1).
    pub fn new(concurrency: usize) -> Runner {
        Runner {
            concurrency: concurrency.max(1),
            counters: None,
        }
    }

    /// This runner, counting its units (and its clones') into the counters returned.
    pub fn counted(self) -> (Runner, Arc<UnitCounters>) {
        let counters = Arc::new(UnitCounters::default());
        (
            Runner {
                counters: Some(counters.clone()),
                ..self
            },
            counters,
        )
    }

    /// This runner counting into `counters`.
    pub fn counting_into(self, counters: &Arc<UnitCounters>) -> Runner {
        Runner {
            counters: Some(counters.clone()),
            ..self
        }
    }

    /// One unit per core of this machine (what the runtime's threads use).
    pub fn per_core() -> Runner {
        Runner::new(default_concurrency())
    }

    /// Most units at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// `work` of every unit, at most [`Runner::concurrency`] at once, started in the units'
    /// order; the results in that order.
    pub async fn run<U, R, F, Fut>(&self, units: Vec<U>, work: F) -> Vec<Result<R, UnitPanic>>
    where
        F: Fn(U) -> Fut,
        Fut: Future<Output = R> + Send + 'static,
        R: Send + 'static,
    {
        let total = units.len();
        let mut results: Vec<Option<Result<R, UnitPanic>>> = (0..total).map(|_| None).collect();
        let mut set = JoinSet::new();
        let mut ids = std::collections::HashMap::new();
        let mut pending = units.into_iter().enumerate();
        loop {
            while set.len() < self.concurrency {
                let Some((i, unit)) = pending.next() else {
                    break;
                };
                let unit = work(unit);
                let counters = self.counters.clone();
                let handle = set.spawn(async move {
                    let started = Instant::now();
                    let result = unit.await;
                    if let Some(c) = counters {
                        c.record(started);
                    }
                    result
                });
                ids.insert(handle.id(), i);
            }
            let Some(done) = set.join_next_with_id().await else {
                break;
            };
            let (id, result) = match done {
                Ok((id, r)) => (id, Ok(r)),
                Err(e) => {
                    let id = e.id();
                    if let Some(c) = &self.counters {
                        c.panicked.fetch_add(1, Ordering::Relaxed);
                    }
                    let message = if e.is_panic() {
                        let payload = e.into_panic();
                        payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "(no message)".into())
                    } else {
                        "cancelled".into()
                    };
                    (id, Err(UnitPanic(message)))
                }
            };
            if let Some(i) = ids.remove(&id) {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(UnitPanic("never finished".into()))))
            .collect()
    }
}

/// The cores this process may use (1 when unknown).
pub fn default_concurrency() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn units_run_at_most_concurrency_at_once_and_results_keep_their_order() {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let runner = Runner::new(3);
        let results = runner
            .run((0..20u64).collect(), |n| {
                let (running, most) = (running.clone(), most.clone());
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    // Later units finish first: the order comes from the units, not the ends.
                    tokio::time::sleep(std::time::Duration::from_millis(20 - n)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    n * 10
                }
            })
            .await;
        let values: Vec<u64> = results.into_iter().map(|r| r.expect("no panic")).collect();
        assert_eq!(values, (0..20).map(|n| n * 10).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_unit_that_panics_is_its_own_failure_and_the_others_finish() {
        let results = Runner::new(2)
            .run(vec![1, 2, 3], |n| async move {
                if n == 2 {
                    panic!("unit {n} broke");
                }
                n
            })
            .await;
        assert_eq!(results[0], Ok(1));
        assert_eq!(results[1], Err(UnitPanic("unit 2 broke".into())));
        assert_eq!(results[2], Ok(3));
        let (runner, counters) = Runner::new(2).counted();
        runner
            .run(vec![1u64, 2, 3], |n| async move {
                tokio::time::sleep(std::time::Duration::from_millis(n * 10)).await;
            })
            .await;
        let stats = counters.stats(2);
        assert_eq!((stats.run, stats.panicked), (3, 0));
        assert!(
            stats.longest_ms >= 30.0 && stats.busy_ms >= 60.0,
            "{stats:?}"
        );
        assert_eq!(
            Runner::new(0).concurrency(),
            1,
            "a concurrency of 0 runs one unit at a time"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cpu_bound_units_use_more_than_one_thread() {
        let threads = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        Runner::new(2)
            .run(vec![(); 8], |()| {
                let threads = threads.clone();
                async move {
                    let started = std::time::Instant::now();
                    // Busy, never yielding: only another thread can run the other unit.
                    while started.elapsed() < std::time::Duration::from_millis(50) {
                        std::hint::spin_loop();
                    }
                    if let Ok(mut t) = threads.lock() {
                        t.insert(std::thread::current().id());
                    }
                }
            })
            .await;
        let used = threads.lock().map(|t| t.len()).unwrap_or(0);
        assert!(used >= 2, "the units ran on {used} thread(s)");
    }
}
