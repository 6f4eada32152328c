//! State kept between invocations, behind small traits, with one adapter per backend: DynamoDB
//! on AWS ([`DynamoStateStore`], feature `aws`), SQLite on the embedded backend
//! ([`SqliteStateStore`]).
//!
//! - [`CheckpointStore`]: each topic-partition's checkpoint and the pending batches ingest
//!   records with it (one conditional write), read back by the commit stage;
//! - [`CommitLog`]: the commit stage's intent, so a crashed commit is finished, not repeated;
//! - [`Locks`]: leases that keep two replays of one partition apart;
//! - [`StateStore`]: all three, plus status documents and the upgrade of state an earlier
//!   release wrote.

#[cfg(feature = "aws")]
pub mod dynamodb;
pub mod sqlite;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{
    Advance, BatchKey, Checkpoint, PendingBatch, PendingPage, SourceAdvance, SourcePartition,
    StoredState,
};
use crate::error::Result;
#[cfg(feature = "aws")]
pub use dynamodb::DynamoStateStore;
pub use sqlite::SqliteStateStore;

/// Checkpoints and pending batches.
#[async_trait]
pub trait CheckpointStore: Send + Sync {
    /// The checkpoint of a partition ([`Checkpoint::INITIAL`] if none).
    async fn checkpoint(&self, source: &SourcePartition) -> Result<Checkpoint>;

    /// The checkpoints of `sources`, in their order.
    async fn checkpoints(&self, sources: &[SourcePartition]) -> Result<Vec<Checkpoint>> {
        let mut out = Vec::with_capacity(sources.len());
        for s in sources {
            out.push(self.checkpoint(s).await?);
        }
        Ok(out)
    }

    /// The partitions of `topic` that have a checkpoint, ascending.
    async fn partitions(&self, topic: &str) -> Result<Vec<i32>>;

    /// The stored state of the stateful derived tables of `sources`, in their order (`None`:
    /// none yet). Written by [`CheckpointStore::advance`] with the checkpoint.
    async fn partition_states(
        &self,
        sources: &[SourcePartition],
    ) -> Result<Vec<Option<StoredState>>>;

    /// The largest encoded section a stored state should hold inline (larger ones go to a
    /// state file); the ingest's own option applies below it.
    fn max_inline_state_bytes(&self) -> usize {
        usize::MAX
    }

    /// Whether the commit stage reads rows carried in state files
    /// ([`crate::checkpoint::CarriedRows`]); until it does, ingest writes every file on its own.
    async fn reads_carried_rows(&self) -> Result<bool> {
        Ok(true)
    }

    /// Every partition of `topic` with a checkpoint, and its stored state (`None`: none).
    async fn topic_states(
        &self,
        topic: &str,
    ) -> Result<Vec<(SourcePartition, Option<StoredState>)>> {
        let sources: Vec<SourcePartition> = self
            .partitions(topic)
            .await?
            .into_iter()
            .map(|p| SourcePartition::new(topic, p))
            .collect();
        let states = self.partition_states(&sources).await?;
        Ok(sources.into_iter().zip(states).collect())
    }

    /// How the consecutive `sources` of one invocation are split into advances: the length of
    /// each group, in order (a store whose transactions are bounded splits; the default takes
    /// them all at once). `stateful[i]`: source `i`'s advance writes a state too.
    async fn groups(&self, sources: &[SourcePartition], _stateful: &[bool]) -> Result<Vec<usize>> {
        Ok(if sources.is_empty() {
            Vec::new()
        } else {
            vec![sources.len()]
        })
    }

    /// Moves every checkpoint of `advances` and records `batch`, atomically, if and only if
    /// each checkpoint is still at its `from` version (and each state given is still at its
    /// previous `seq`); otherwise changes nothing. An advance that keeps `next_offset` and
    /// writes a state (an idle partition's windows closed) is fenced by the state's `seq`.
    async fn advance(&self, advances: &[SourceAdvance], batch: &PendingBatch) -> Result<Advance>;

    /// Records `batch` as pending without moving the checkpoint (records replayed from below
    /// it), if and only if `holder` still holds lock `lock`. `Ok(false)` when it does not.
    async fn add_pending(&self, batch: &PendingBatch, lock: &str, holder: &str) -> Result<bool>;

    /// Pending batches in [`BatchKey::sort_key`] order (oldest first), after `after`, at most
    /// `limit` (readable or not).
    async fn pending_page(&self, after: Option<&str>, limit: usize) -> Result<PendingPage>;

    /// Every readable pending batch, oldest first (pages through
    /// [`CheckpointStore::pending_page`]).
    async fn pending(&self) -> Result<Vec<PendingBatch>> {
        all_pending(self, false).await
    }

    /// Every pending batch, oldest first, or an error naming the first one that cannot be read
    /// (damaged, or in a layout of a newer release): for orphan clean-up and replay, which must
    /// see every batch — an unreadable one is not absent, and the files it names not orphans.
    async fn pending_complete(&self) -> Result<Vec<PendingBatch>> {
        all_pending(self, true).await
    }

    /// The given batches, those still pending, oldest first.
    async fn batches(&self, keys: &[BatchKey]) -> Result<PendingPage>;
}

/// Every pending batch of `store`, page by page; with `complete`, an error at the first one
/// that cannot be read instead of leaving it out.
async fn all_pending<S: CheckpointStore + ?Sized>(
    store: &S,
    complete: bool,
) -> Result<Vec<PendingBatch>> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.pending_page(after.as_deref(), 1000).await?;
        if complete && let Some((key, why)) = page.unreadable.first() {
            return Err(crate::error::Error::State {
                op: "read pending",
                message: format!(
                    "pending batch {} cannot be read ({why}); nothing that could be its files \
                     is deleted or replayed until it can (deploy the release that wrote it; \
                     README, \"When something is wrong\")",
                    key.sort_key()
                ),
                retryable: false,
            });
        }
        out.extend(page.batches);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(out),
        }
    }
}

/// A commit about to happen: which pending batches it covers. Written before any table is
/// committed, removed (with the batches) after every table is; a crashed commit is resumed from
/// it. Each table's snapshot carries `{id}/{table}` as its commit id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitIntent {
    /// Unique id; each table's snapshot carries `{id}/{table}`.
    pub id: String,
    /// When the intent was written, epoch milliseconds.
    pub created_at_ms: i64,
    /// The batches the commit covers.
    pub batches: Vec<BatchKey>,
}

/// The commit stage's intent: one at a time.
#[async_trait]
pub trait CommitLog: Send + Sync {
    /// The commit intent left by a commit that has not finished, if any.
    async fn commit_intent(&self) -> Result<Option<CommitIntent>>;

    /// Records `intent` unless one exists already (`Ok(false)`): one commit at a time.
    async fn begin_commit(&self, intent: &CommitIntent) -> Result<bool>;

    /// Removes the intent's pending batches, then the intent itself.
    async fn finish_commit(&self, intent: &CommitIntent) -> Result<()>;
}

/// Named leases.
#[async_trait]
pub trait Locks: Send + Sync {
    /// Takes the named lock for `holder` until `expires_at_ms`, if it is free or expired.
    async fn try_lock(
        &self,
        name: &str,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool>;

    /// Releases the named lock if `holder` still holds it.
    async fn unlock(&self, name: &str, holder: &str) -> Result<()>;
}

/// All the state of a pipeline, in one store.
#[async_trait]
pub trait StateStore: CheckpointStore + CommitLog + Locks {
    /// Records a small status document under `key` (the last scheduled run's outcome, which
    /// `streamtable tables` shows), replacing the previous one.
    async fn put_status(&self, key: &str, json: &str) -> Result<()>;

    /// The status document under `key`, if any.
    async fn status(&self, key: &str) -> Result<Option<String>>;

    /// Brings state written by an earlier release to this release's layout. Idempotent; the
    /// scheduled stage calls it at the start of every run. Returns the items moved.
    async fn upgrade(&self, _now_ms: i64) -> Result<u64> {
        Ok(0)
    }
}
