//! Turns at committing to a table, among the units of one run. The scheduled stage runs its
//! units in parallel ([`crate::scheduled::runner`]); two of them may commit to one table (an
//! interval join's late rows and the round's own dead letters; two partitions' compactions).
//! Each commit builds on the table's current metadata and swaps the pointer with
//! compare-and-set, so a race is never wrong, but the loser redoes its work: holding the
//! table's turn around the load-build-swap makes the units of a run take turns instead.
//!
//! The turns belong to one run (one commit round, one compaction step), not to the process:
//! another committer — an overlapping run, a trigger, a zombie — never waits for them and
//! meets this one at the catalog's compare-and-set, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// The turns of one run's units, by table (cheap to clone: clones share the turns).
#[derive(Debug, Clone, Default)]
pub struct Turns {
    tables: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Turns {
    /// Waits for the turn of table `name`, held until the guard drops.
    pub async fn take(&self, name: &str) -> OwnedMutexGuard<()> {
        let lock = {
            // A poisoned map only means a unit panicked while inserting: the map is intact.
            let mut map = self.tables.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(name.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn units_of_a_run_take_turns_at_a_table_and_not_at_others() {
        let turns = Turns::default();
        let held = turns.take("orders").await;
        let (a, b) = (turns.clone(), turns.clone());
        let same = tokio::spawn(async move {
            let _g = a.take("orders").await;
        });
        let other = tokio::spawn(async move {
            let _g = b.take("payments").await;
        });
        tokio::time::timeout(Duration::from_secs(5), other)
            .await
            .expect("another table's turn is free")
            .expect("joined");
        // Another run's turns are its own.
        tokio::time::timeout(Duration::from_secs(5), Turns::default().take("orders"))
            .await
            .expect("another run does not wait");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!same.is_finished(), "the same table waits for the holder");
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), same)
            .await
            .expect("released")
            .expect("joined");
    }
}
