//! Fault injection driven by a seeded schedule: wrappers around the state store, the catalog's
//! pointer store, the warehouse's object store and the Iceberg `FileIO` storage. Each call may
//! fail before it does anything (an error, throttling or a timeout: the caller sees a retryable
//! error), or, for a call that changes something, be applied and then fail (the answer was
//! lost). The same seed gives the same faults for the same sequence of calls.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use iceberg::spec::TableMetadata;
use streamtable::catalog::{Pointer, PointerStore};
use streamtable::checkpoint::{
    Advance, BatchKey, Checkpoint, PendingBatch, PendingPage, SourceAdvance, SourcePartition,
    StoredState,
};
use streamtable::generate::Rng;
use streamtable::storage::{ObjectInfo, ObjectStore};
use streamtable::store::{CheckpointStore, CommitIntent, CommitLog, Locks, StateStore};
use streamtable::{Error, Result};

/// When an injected fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strike {
    /// Nothing happened; the caller gets a retryable error.
    Before,
    /// The call was applied; its answer is lost (the caller gets a retryable error).
    After,
}

/// The schedule: a seeded generator and a fault rate, shared by every wrapper of one backend.
pub struct Chaos {
    rng: Mutex<Rng>,
    per_mille: u64,
    enabled: AtomicBool,
    /// Faults injected so far.
    pub injected: AtomicU64,
}

impl Chaos {
    pub fn new(seed: u64, per_mille: u64) -> Arc<Self> {
        Arc::new(Chaos {
            rng: Mutex::new(Rng::new(seed)),
            per_mille,
            enabled: AtomicBool::new(true),
            injected: AtomicU64::new(0),
        })
    }

    /// Stops injecting faults (the schedule's end: the system must then recover on its own).
    pub fn disable(&self) {
        self.enabled.store(false, Ordering::SeqCst);
    }

    /// Decides one call's fate. `mutating` calls may also strike after being applied.
    pub fn roll(&self, mutating: bool) -> Option<Strike> {
        if !self.enabled.load(Ordering::SeqCst) {
            return None;
        }
        let mut rng = self.rng.lock().expect("rng");
        if rng.below(1000) >= self.per_mille {
            return None;
        }
        self.injected.fetch_add(1, Ordering::Relaxed);
        Some(if mutating && rng.below(2) == 0 {
            Strike::After
        } else {
            Strike::Before
        })
    }

    fn error(op: &'static str, strike: Strike) -> Error {
        let what = match strike {
            Strike::Before => "injected fault (throttled, timed out or refused)",
            Strike::After => "injected fault: applied, the answer was lost",
        };
        Error::State {
            op,
            message: what.into(),
            retryable: true,
        }
    }

    fn iceberg_error(op: &str, strike: Strike) -> iceberg::Error {
        iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            format!("{op}: {}", Self::error("file io", strike)),
        )
        .with_retryable(true)
    }
}

/// Runs `call` under the schedule: maybe fail before it, maybe after it.
macro_rules! chaotic {
    ($chaos:expr, $op:literal, mutating, $call:expr) => {{
        match $chaos.roll(true) {
            Some(Strike::Before) => Err(Chaos::error($op, Strike::Before)),
            Some(Strike::After) => {
                let _ = $call.await;
                Err(Chaos::error($op, Strike::After))
            }
            None => $call.await,
        }
    }};
    ($chaos:expr, $op:literal, $call:expr) => {{
        match $chaos.roll(false) {
            Some(s) => Err(Chaos::error($op, s)),
            None => $call.await,
        }
    }};
}

/// The state store under the schedule.
pub struct ChaosState {
    pub inner: Arc<dyn StateStore>,
    pub chaos: Arc<Chaos>,
}

#[async_trait]
impl CheckpointStore for ChaosState {
    async fn partitions(&self, topic: &str) -> Result<Vec<i32>> {
        chaotic!(self.chaos, "list partitions", self.inner.partitions(topic))
    }
    async fn checkpoint(&self, source: &SourcePartition) -> Result<Checkpoint> {
        chaotic!(self.chaos, "read checkpoint", self.inner.checkpoint(source))
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
        chaotic!(
            self.chaos,
            "read partition state",
            self.inner.partition_states(sources)
        )
    }
    async fn advance(&self, advances: &[SourceAdvance], batch: &PendingBatch) -> Result<Advance> {
        chaotic!(
            self.chaos,
            "advance checkpoints",
            mutating,
            self.inner.advance(advances, batch)
        )
    }
    async fn checkpoints(&self, sources: &[SourcePartition]) -> Result<Vec<Checkpoint>> {
        chaotic!(
            self.chaos,
            "read checkpoints",
            self.inner.checkpoints(sources)
        )
    }
    async fn pending_page(&self, after: Option<&str>, limit: usize) -> Result<PendingPage> {
        chaotic!(
            self.chaos,
            "read pending",
            self.inner.pending_page(after, limit)
        )
    }
    async fn batches(&self, keys: &[BatchKey]) -> Result<PendingPage> {
        chaotic!(self.chaos, "read batches", self.inner.batches(keys))
    }
    async fn add_pending(&self, batch: &PendingBatch, lock: &str, holder: &str) -> Result<bool> {
        chaotic!(
            self.chaos,
            "add pending",
            mutating,
            self.inner.add_pending(batch, lock, holder)
        )
    }
}

#[async_trait]
impl CommitLog for ChaosState {
    async fn commit_intent(&self) -> Result<Option<CommitIntent>> {
        chaotic!(self.chaos, "read intent", self.inner.commit_intent())
    }
    async fn begin_commit(&self, intent: &CommitIntent) -> Result<bool> {
        chaotic!(
            self.chaos,
            "write intent",
            mutating,
            self.inner.begin_commit(intent)
        )
    }
    async fn finish_commit(&self, intent: &CommitIntent) -> Result<()> {
        chaotic!(
            self.chaos,
            "finish commit",
            mutating,
            self.inner.finish_commit(intent)
        )
    }
}

#[async_trait]
impl Locks for ChaosState {
    async fn try_lock(&self, name: &str, holder: &str, now_ms: i64, until: i64) -> Result<bool> {
        chaotic!(
            self.chaos,
            "take lock",
            mutating,
            self.inner.try_lock(name, holder, now_ms, until)
        )
    }
    async fn unlock(&self, name: &str, holder: &str) -> Result<()> {
        chaotic!(
            self.chaos,
            "release lock",
            mutating,
            self.inner.unlock(name, holder)
        )
    }
}

#[async_trait]
impl StateStore for ChaosState {
    async fn put_status(&self, key: &str, json: &str) -> Result<()> {
        chaotic!(
            self.chaos,
            "write status",
            mutating,
            self.inner.put_status(key, json)
        )
    }
    async fn status(&self, key: &str) -> Result<Option<String>> {
        chaotic!(self.chaos, "read status", self.inner.status(key))
    }

    async fn upgrade(&self, now_ms: i64) -> Result<u64> {
        chaotic!(self.chaos, "upgrade", mutating, self.inner.upgrade(now_ms))
    }
}

/// The catalog's pointers under the schedule.
#[derive(Debug)]
pub struct ChaosPointers {
    pub inner: Arc<dyn PointerStore>,
    pub chaos: Arc<ChaosHandle>,
}

/// `Chaos` behind a `Debug` handle (the pointer store must be `Debug`).
pub struct ChaosHandle(pub Arc<Chaos>);

impl std::fmt::Debug for ChaosHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Chaos")
    }
}

impl std::ops::Deref for ChaosHandle {
    type Target = Chaos;
    fn deref(&self) -> &Chaos {
        &self.0
    }
}

#[async_trait]
impl PointerStore for ChaosPointers {
    async fn ensure_namespace(&self, namespace: &str) -> Result<()> {
        chaotic!(
            self.chaos,
            "ensure namespace",
            mutating,
            self.inner.ensure_namespace(namespace)
        )
    }
    async fn list_namespaces(&self) -> Result<Vec<String>> {
        chaotic!(self.chaos, "list namespaces", self.inner.list_namespaces())
    }
    async fn list_tables(&self, namespace: &str) -> Result<Vec<String>> {
        chaotic!(self.chaos, "list tables", self.inner.list_tables(namespace))
    }
    async fn get(&self, namespace: &str, table: &str) -> Result<Option<Pointer>> {
        chaotic!(self.chaos, "get pointer", self.inner.get(namespace, table))
    }
    async fn create(
        &self,
        namespace: &str,
        table: &str,
        location: &str,
        metadata: &TableMetadata,
    ) -> Result<bool> {
        chaotic!(
            self.chaos,
            "create table",
            mutating,
            self.inner.create(namespace, table, location, metadata)
        )
    }
    async fn swap(
        &self,
        namespace: &str,
        table: &str,
        expected: &Pointer,
        new_location: &str,
        metadata: &TableMetadata,
    ) -> Result<bool> {
        chaotic!(
            self.chaos,
            "swap pointer",
            mutating,
            self.inner
                .swap(namespace, table, expected, new_location, metadata)
        )
    }
    async fn drop_table(&self, namespace: &str, table: &str) -> Result<()> {
        chaotic!(
            self.chaos,
            "drop table",
            mutating,
            self.inner.drop_table(namespace, table)
        )
    }
}

/// The warehouse's object store under the schedule.
#[derive(Debug)]
pub struct ChaosStore {
    pub inner: Arc<dyn ObjectStore>,
    pub chaos: Arc<ChaosHandle>,
}

#[async_trait]
impl ObjectStore for ChaosStore {
    async fn write(&self, location: &str, bytes: Bytes) -> Result<()> {
        chaotic!(
            self.chaos,
            "write object",
            mutating,
            self.inner.write(location, bytes.clone())
        )
    }
    async fn read(&self, location: &str) -> Result<Bytes> {
        chaotic!(self.chaos, "read object", self.inner.read(location))
    }
    async fn delete(&self, location: &str) -> Result<()> {
        chaotic!(
            self.chaos,
            "delete object",
            mutating,
            self.inner.delete(location)
        )
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        chaotic!(self.chaos, "list objects", self.inner.list(prefix))
    }
    async fn stat(&self, location: &str) -> Result<Option<ObjectInfo>> {
        chaotic!(self.chaos, "stat object", self.inner.stat(location))
    }
}

mod storage;
use storage::ChaosStorageFactory;

/// `backend` with every adapter under `chaos`.
pub fn backend(
    backend: &streamtable::backend::Backend,
    chaos: &Arc<Chaos>,
) -> streamtable::backend::Backend {
    let handle = Arc::new(ChaosHandle(chaos.clone()));
    let file_io = iceberg::io::FileIOBuilder::new(Arc::new(ChaosStorageFactory {
        inner: Some(Arc::new(iceberg::io::LocalFsStorageFactory)),
        chaos: Some(handle.clone()),
    }))
    .build();
    let warehouse = streamtable::storage::Warehouse::with_parts(
        backend.warehouse.root(),
        file_io.clone(),
        Arc::new(ChaosStore {
            inner: backend.warehouse.store().clone(),
            chaos: handle.clone(),
        }),
    );
    let catalog = streamtable::catalog::TableCatalog::new(
        Arc::new(ChaosPointers {
            inner: backend.catalog.pointers().clone(),
            chaos: handle,
        }),
        file_io,
        backend.warehouse.root(),
    );
    streamtable::backend::Backend {
        warehouse,
        state: Arc::new(ChaosState {
            inner: backend.state.clone(),
            chaos: chaos.clone(),
        }),
        catalog,
        namespace: backend.namespace.clone(),
        clock: backend.clock.clone(),
        glue_schemas: backend.glue_schemas.clone(),
    }
}
