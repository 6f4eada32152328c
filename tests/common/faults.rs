//! A state store wrapper that injects crashes and races around the conditional advance, on top
//! of a real store.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use streamtable::checkpoint::{
    Advance, BatchKey, Checkpoint, PendingBatch, PendingPage, SourceAdvance, SourcePartition,
    StoredState,
};
use streamtable::store::{CheckpointStore, CommitIntent, CommitLog, Locks, StateStore};
use streamtable::{Error, Result};

pub type Hook = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// What to do at the next advance.
pub enum Fault {
    /// Die after the files were written, before the transaction.
    CrashBeforeAdvance,
    /// Die after the transaction committed, before the response.
    CrashAfterAdvance,
    /// Run something (another invocation) between reading the checkpoint and advancing.
    Before(Hook),
    /// Die after every table was committed, before the pending batches are removed.
    CrashBeforeFinishCommit,
}

pub struct FaultyState {
    pub inner: Arc<dyn StateStore>,
    pub faults: Mutex<Vec<Fault>>,
}

impl FaultyState {
    pub fn new(inner: Arc<dyn StateStore>, faults: Vec<Fault>) -> Arc<Self> {
        Arc::new(FaultyState {
            inner,
            faults: Mutex::new(faults),
        })
    }
}

fn crash_error() -> Error {
    Error::State {
        op: "advance checkpoint",
        message: "injected crash".into(),
        retryable: true,
    }
}

#[async_trait]
impl CheckpointStore for FaultyState {
    async fn partitions(&self, topic: &str) -> Result<Vec<i32>> {
        self.inner.partitions(topic).await
    }
    async fn checkpoint(&self, source: &SourcePartition) -> Result<Checkpoint> {
        self.inner.checkpoint(source).await
    }
    async fn groups(&self, sources: &[SourcePartition], stateful: &[bool]) -> Result<Vec<usize>> {
        self.inner.groups(sources, stateful).await
    }
    fn max_inline_state_bytes(&self) -> usize {
        self.inner.max_inline_state_bytes()
    }
    async fn partition_states(
        &self,
        sources: &[SourcePartition],
    ) -> Result<Vec<Option<StoredState>>> {
        self.inner.partition_states(sources).await
    }
    async fn advance(&self, advances: &[SourceAdvance], batch: &PendingBatch) -> Result<Advance> {
        let fault = {
            let mut faults = self.faults.lock().expect("faults");
            if faults.is_empty() {
                None
            } else {
                Some(faults.remove(0))
            }
        };
        match fault {
            None => self.inner.advance(advances, batch).await,
            Some(Fault::CrashBeforeAdvance) => Err(crash_error()),
            Some(Fault::CrashAfterAdvance) => {
                self.inner.advance(advances, batch).await?;
                Err(crash_error())
            }
            Some(Fault::Before(hook)) => {
                hook().await;
                self.inner.advance(advances, batch).await
            }
            Some(other) => {
                self.faults.lock().expect("faults").insert(0, other);
                self.inner.advance(advances, batch).await
            }
        }
    }
    async fn pending_page(&self, after: Option<&str>, limit: usize) -> Result<PendingPage> {
        self.inner.pending_page(after, limit).await
    }
    async fn batches(&self, keys: &[BatchKey]) -> Result<PendingPage> {
        self.inner.batches(keys).await
    }
    async fn add_pending(&self, batch: &PendingBatch, lock: &str, holder: &str) -> Result<bool> {
        self.inner.add_pending(batch, lock, holder).await
    }
}

#[async_trait]
impl CommitLog for FaultyState {
    async fn commit_intent(&self) -> Result<Option<CommitIntent>> {
        self.inner.commit_intent().await
    }
    async fn begin_commit(&self, intent: &CommitIntent) -> Result<bool> {
        self.inner.begin_commit(intent).await
    }
    async fn finish_commit(&self, intent: &CommitIntent) -> Result<()> {
        let crash = {
            let mut faults = self.faults.lock().expect("faults");
            match faults.first() {
                Some(Fault::CrashBeforeFinishCommit) => {
                    faults.remove(0);
                    true
                }
                _ => false,
            }
        };
        if crash {
            return Err(crash_error());
        }
        self.inner.finish_commit(intent).await
    }
}

#[async_trait]
impl Locks for FaultyState {
    async fn try_lock(&self, name: &str, holder: &str, now_ms: i64, until: i64) -> Result<bool> {
        self.inner.try_lock(name, holder, now_ms, until).await
    }
    async fn unlock(&self, name: &str, holder: &str) -> Result<()> {
        self.inner.unlock(name, holder).await
    }
}

#[async_trait]
impl StateStore for FaultyState {
    async fn put_status(&self, key: &str, json: &str) -> Result<()> {
        self.inner.put_status(key, json).await
    }

    async fn status(&self, key: &str) -> Result<Option<String>> {
        self.inner.status(key).await
    }

    async fn upgrade(&self, now_ms: i64) -> Result<u64> {
        self.inner.upgrade(now_ms).await
    }
}

/// A pointer store whose swaps fail (not retryably: a crash) on chosen calls.
#[derive(Debug)]
pub struct FaultyPointers {
    pub inner: Arc<dyn streamtable::catalog::PointerStore>,
    /// Swap calls (0-based) that fail.
    pub fail_swaps: Mutex<Vec<usize>>,
    pub swaps: std::sync::atomic::AtomicUsize,
    /// Swap calls (0-based) that are applied but answer with an error (the answer was lost).
    pub lose_answers: Mutex<Vec<usize>>,
}

impl FaultyPointers {
    /// Wraps `inner`; `fail` swaps fail before anything happens, `lose` swaps happen but fail.
    pub fn new(
        inner: Arc<dyn streamtable::catalog::PointerStore>,
        fail: Vec<usize>,
        lose: Vec<usize>,
    ) -> Arc<Self> {
        Arc::new(FaultyPointers {
            inner,
            fail_swaps: Mutex::new(fail),
            swaps: std::sync::atomic::AtomicUsize::new(0),
            lose_answers: Mutex::new(lose),
        })
    }

    /// A backend like `backend` whose catalog goes through these pointers.
    pub fn backend(
        self: &Arc<Self>,
        backend: &streamtable::backend::Backend,
    ) -> streamtable::backend::Backend {
        streamtable::backend::Backend {
            catalog: streamtable::catalog::TableCatalog::new(
                self.clone(),
                backend.warehouse.file_io().clone(),
                backend.warehouse.root(),
            ),
            ..backend.clone()
        }
    }
}

#[async_trait]
impl streamtable::catalog::PointerStore for FaultyPointers {
    async fn ensure_namespace(&self, namespace: &str) -> Result<()> {
        self.inner.ensure_namespace(namespace).await
    }
    async fn list_namespaces(&self) -> Result<Vec<String>> {
        self.inner.list_namespaces().await
    }
    async fn list_tables(&self, namespace: &str) -> Result<Vec<String>> {
        self.inner.list_tables(namespace).await
    }
    async fn get(
        &self,
        namespace: &str,
        table: &str,
    ) -> Result<Option<streamtable::catalog::Pointer>> {
        self.inner.get(namespace, table).await
    }
    async fn create(
        &self,
        namespace: &str,
        table: &str,
        location: &str,
        metadata: &iceberg::spec::TableMetadata,
    ) -> Result<bool> {
        self.inner
            .create(namespace, table, location, metadata)
            .await
    }
    async fn swap(
        &self,
        namespace: &str,
        table: &str,
        expected: &streamtable::catalog::Pointer,
        new_location: &str,
        metadata: &iceberg::spec::TableMetadata,
    ) -> Result<bool> {
        let n = self.swaps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fail_swaps.lock().expect("faults").contains(&n) {
            return Err(Error::Config(format!(
                "injected crash at swap {n} of {table}"
            )));
        }
        let applied = self
            .inner
            .swap(namespace, table, expected, new_location, metadata)
            .await?;
        if self.lose_answers.lock().expect("faults").contains(&n) {
            return Err(Error::State {
                op: "swap table pointer",
                message: format!(
                    "injected: swap {n} of {table} applied ({applied}), its answer lost"
                ),
                retryable: true,
            });
        }
        Ok(applied)
    }
    async fn drop_table(&self, namespace: &str, table: &str) -> Result<()> {
        self.inner.drop_table(namespace, table).await
    }
}

/// What a [`HookedPointers`] runs before each swap (table, the metadata swapped to): an error
/// fails the swap (nothing applied), `Ok` lets it through.
pub type BeforeSwap = Box<
    dyn Fn(&str, &iceberg::spec::TableMetadata) -> Pin<Box<dyn Future<Output = Result<()>> + Send>>
        + Send
        + Sync,
>;

/// A pointer store that runs a hook before each swap: holds a committer between its history
/// check and its swap while another commits, or fails a chosen table's swaps.
pub struct HookedPointers {
    pub inner: Arc<dyn streamtable::catalog::PointerStore>,
    pub before_swap: BeforeSwap,
    /// A table whose next reads fail as an outage would (retryably), and how many.
    pub failing_reads: Mutex<Option<(String, u32)>>,
}

impl std::fmt::Debug for HookedPointers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookedPointers")
    }
}

impl HookedPointers {
    pub fn new(
        inner: Arc<dyn streamtable::catalog::PointerStore>,
        before_swap: BeforeSwap,
    ) -> Arc<Self> {
        Arc::new(HookedPointers {
            inner,
            before_swap,
            failing_reads: Mutex::new(None),
        })
    }

    /// The next `times` reads of `table`'s pointer fail retryably (an outage).
    pub fn fail_reads(&self, table: &str, times: u32) {
        *self.failing_reads.lock().expect("reads") = Some((table.to_string(), times));
    }

    /// Runs `hook` (another committer, say) right before the first swap of `table`.
    pub fn holding(
        inner: Arc<dyn streamtable::catalog::PointerStore>,
        table: &str,
        hook: Hook,
    ) -> Arc<Self> {
        let once = Arc::new(Mutex::new(Some((table.to_string(), hook))));
        Self::new(
            inner,
            Box::new(move |t, _| {
                let hook = {
                    let mut slot = once.lock().expect("hold");
                    match slot.take() {
                        Some((name, hook)) if name == t => Some(hook),
                        other => {
                            *slot = other;
                            None
                        }
                    }
                };
                Box::pin(async move {
                    if let Some(hook) = hook {
                        hook().await;
                    }
                    Ok(())
                })
            }),
        )
    }

    /// A backend like `backend` whose catalog goes through these pointers.
    pub fn backend(
        self: &Arc<Self>,
        backend: &streamtable::backend::Backend,
    ) -> streamtable::backend::Backend {
        streamtable::backend::Backend {
            catalog: streamtable::catalog::TableCatalog::new(
                self.clone(),
                backend.warehouse.file_io().clone(),
                backend.warehouse.root(),
            ),
            ..backend.clone()
        }
    }
}

#[async_trait]
impl streamtable::catalog::PointerStore for HookedPointers {
    async fn ensure_namespace(&self, namespace: &str) -> Result<()> {
        self.inner.ensure_namespace(namespace).await
    }
    async fn list_namespaces(&self) -> Result<Vec<String>> {
        self.inner.list_namespaces().await
    }
    async fn list_tables(&self, namespace: &str) -> Result<Vec<String>> {
        self.inner.list_tables(namespace).await
    }
    async fn get(
        &self,
        namespace: &str,
        table: &str,
    ) -> Result<Option<streamtable::catalog::Pointer>> {
        let outage = {
            let mut slot = self.failing_reads.lock().expect("reads");
            match slot.as_mut() {
                Some((t, n)) if t == table && *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        };
        if outage {
            return Err(streamtable::Error::ObjectStore {
                op: "get",
                location: format!("{namespace}.{table}"),
                message: "injected: service unavailable".into(),
                retryable: true,
            });
        }
        self.inner.get(namespace, table).await
    }
    async fn create(
        &self,
        namespace: &str,
        table: &str,
        location: &str,
        metadata: &iceberg::spec::TableMetadata,
    ) -> Result<bool> {
        self.inner
            .create(namespace, table, location, metadata)
            .await
    }
    async fn swap(
        &self,
        namespace: &str,
        table: &str,
        expected: &streamtable::catalog::Pointer,
        new_location: &str,
        metadata: &iceberg::spec::TableMetadata,
    ) -> Result<bool> {
        (self.before_swap)(table, metadata).await?;
        self.inner
            .swap(namespace, table, expected, new_location, metadata)
            .await
    }
    async fn drop_table(&self, namespace: &str, table: &str) -> Result<()> {
        self.inner.drop_table(namespace, table).await
    }
    async fn ensure_view(&self, namespace: &str, view: &streamtable::spec::ViewSpec) -> Result<()> {
        self.inner.ensure_view(namespace, view).await
    }
}
