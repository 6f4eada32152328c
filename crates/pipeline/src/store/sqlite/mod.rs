//! Checkpoints and pending batches in SQLite (the embedded backend's `state.db`).
//!
//! The conditional advance is one `BEGIN IMMEDIATE` transaction: read the version, compare,
//! update the checkpoint, insert the pending batch. SQLite's file lock serialises writers across
//! processes, so concurrent `streamtable ingest` runs on one home behave like concurrent Lambdas.

mod intents;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::checkpoint::{
    Advance, BatchKey, Checkpoint, PendingBatch, PendingPage, SourceAdvance, SourcePartition,
    StoredState, decode_ranges, encode_ranges,
};
use crate::error::{Error, Result};
use crate::ledger::Delivery;
use crate::store::{CheckpointStore, StateStore};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS checkpoints (
    topic         TEXT    NOT NULL,
    partition     INTEGER NOT NULL,
    next_offset   INTEGER NOT NULL,
    version       INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS pending (
    topic         TEXT    NOT NULL,
    partition     INTEGER NOT NULL,
    first_offset  INTEGER NOT NULL,
    last_offset   INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    files         TEXT    NOT NULL,
    files_location TEXT,
    sort_key      TEXT,
    more          TEXT,
    delivered     TEXT,
    PRIMARY KEY (topic, partition, first_offset)
);
CREATE TABLE IF NOT EXISTS partition_state (
    topic         TEXT    NOT NULL,
    partition     INTEGER NOT NULL,
    next_offset   INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    body          BLOB,
    location      TEXT,
    bytes         INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS status (
    key           TEXT    PRIMARY KEY,
    value         TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS locks (
    name          TEXT    PRIMARY KEY,
    holder        TEXT    NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS commit_intent (
    slot          INTEGER PRIMARY KEY CHECK (slot = 1),
    id            TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    batches       TEXT    NOT NULL
);
";

/// SQLite state store.
#[derive(Debug, Clone)]
pub struct SqliteStateStore {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

fn db_error(op: &'static str, path: &Path, e: rusqlite::Error) -> Error {
    let busy = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    Error::State {
        op,
        message: format!("{}: {e}", path.display()),
        retryable: busy,
    }
}

impl SqliteStateStore {
    /// Opens (creating if needed) the state database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io("create state directory", dir, e))?;
        }
        let conn = Connection::open(path).map_err(|e| db_error("open", path, e))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(|e| db_error("configure", path, e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| db_error("configure", path, e))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| db_error("configure", path, e))?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| db_error("create schema", path, e))?;
        upgrade_schema(&conn).map_err(|e| db_error("upgrade schema", path, e))?;
        Ok(SqliteStateStore {
            path: path.to_path_buf(),
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` on the connection in the blocking pool.
    async fn with_conn<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Path) -> Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| Error::Internal("state database lock poisoned".into()))?;
            f(&mut guard, &path)
        })
        .await
        .map_err(|e| Error::Internal(format!("state task failed: {e}")))?
    }
}

/// Brings a state database of an earlier release to this one's schema: pending batches gained
/// a `sort_key` (oldest first, see [`BatchKey::sort_key`]) with an index for bounded reads.
fn upgrade_schema(conn: &Connection) -> rusqlite::Result<()> {
    let has_sort_key: bool = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('pending') WHERE name = 'sort_key'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_sort_key {
        conn.execute_batch("ALTER TABLE pending ADD COLUMN sort_key TEXT")?;
    }
    let has_more: bool = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('pending') WHERE name = 'more'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_more {
        conn.execute_batch("ALTER TABLE pending ADD COLUMN more TEXT")?;
    }
    let has_newest: bool = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('checkpoints') WHERE name = 'newest_ms'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_newest {
        conn.execute_batch(
            "ALTER TABLE checkpoints ADD COLUMN newest_ms INTEGER;
             ALTER TABLE checkpoints ADD COLUMN first_offset INTEGER;",
        )?;
    }
    let has_delivered: bool = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('pending') WHERE name = 'delivered'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_delivered {
        conn.execute_batch("ALTER TABLE pending ADD COLUMN delivered TEXT")?;
    }
    conn.execute_batch(
        "UPDATE pending SET sort_key = printf('%015d#%s#%010d#%020d', max(created_at_ms, 0), topic, partition, first_offset)
           WHERE sort_key IS NULL;
         CREATE INDEX IF NOT EXISTS pending_by_age ON pending (sort_key);",
    )
}

/// Reads pending rows (`topic, partition, first_offset, last_offset, created_at_ms, files,
/// files_location`) into a page; rows whose file list cannot be read are reported unreadable.
fn read_page(
    stmt: &mut rusqlite::Statement<'_>,
    params: impl rusqlite::Params,
    path: &Path,
) -> Result<PendingPage> {
    let err = |e| db_error("read pending", path, e);
    let rows = stmt
        .query_map(params, |r| {
            Ok((
                SourcePartition::new(r.get::<_, String>(0)?, r.get(1)?),
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, Option<String>>(6)?,
                r.get::<_, Option<String>>(7)?,
                r.get::<_, Option<String>>(8)?,
            ))
        })
        .map_err(err)?;
    let mut page = PendingPage::default();
    for row in rows {
        let (
            source,
            first_offset,
            last_offset,
            created_at_ms,
            files,
            files_location,
            more,
            delivered,
        ) = row.map_err(err)?;
        // The counts only feed the audit: unreadable ones must not hold the batch's rows back.
        let delivery = Delivery::decode(delivered.as_deref()).unwrap_or_else(|why| {
            tracing::warn!(%source, first_offset, %why, "pending batch's delivered counts unreadable; taken as whole");
            Delivery::default()
        });
        let more = match more.as_deref().map(decode_ranges).transpose() {
            Ok(m) => m.unwrap_or_default(),
            Err(why) => {
                let key = BatchKey {
                    source,
                    first_offset,
                    created_at_ms,
                };
                page.unreadable
                    .push((key, format!("{}: {why}", path.display())));
                continue;
            }
        };
        match serde_json::from_str(&files) {
            Ok(files) => page.batches.push(PendingBatch {
                source,
                first_offset,
                last_offset,
                more,
                created_at_ms,
                files,
                files_location,
                delivery,
            }),
            Err(e) => {
                let key = BatchKey {
                    source,
                    first_offset,
                    created_at_ms,
                };
                page.unreadable.push((
                    key,
                    format!("{}: file list is corrupt: {e}", path.display()),
                ));
            }
        }
    }
    Ok(page)
}

#[async_trait]
impl CheckpointStore for SqliteStateStore {
    async fn checkpoint(&self, source: &SourcePartition) -> Result<Checkpoint> {
        let source = source.clone();
        self.with_conn(move |conn, path| {
            conn.query_row(
                "SELECT next_offset, version, newest_ms, first_offset FROM checkpoints WHERE topic = ?1 AND partition = ?2",
                params![source.topic, source.partition],
                |r| {
                    Ok(Checkpoint {
                        next_offset: r.get(0)?,
                        version: r.get::<_, i64>(1)? as u64,
                        newest_ms: r.get::<_, Option<i64>>(2)?.unwrap_or(-1),
                        first_offset: r.get::<_, Option<i64>>(3)?.unwrap_or(-1),
                    })
                },
            )
            .optional()
            .map(|c| c.unwrap_or(Checkpoint::INITIAL))
            .map_err(|e| db_error("read checkpoint", path, e))
        })
        .await
    }
    async fn partitions(&self, topic: &str) -> Result<Vec<i32>> {
        let topic = topic.to_string();
        self.with_conn(move |conn, path| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT partition FROM checkpoints WHERE topic = ?1 ORDER BY partition",
                )
                .map_err(|e| db_error("list partitions", path, e))?;
            let rows = stmt
                .query_map([&topic], |r| r.get::<_, i32>(0))
                .map_err(|e| db_error("list partitions", path, e))?;
            rows.collect::<std::result::Result<Vec<i32>, _>>()
                .map_err(|e| db_error("list partitions", path, e))
        })
        .await
    }

    async fn partition_states(
        &self,
        sources: &[SourcePartition],
    ) -> Result<Vec<Option<StoredState>>> {
        let sources = sources.to_vec();
        self.with_conn(move |conn, path| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT next_offset, seq, body, location, bytes, updated_at_ms FROM partition_state
                     WHERE topic = ?1 AND partition = ?2",
                )
                .map_err(|e| db_error("read partition state", path, e))?;
            let mut out = Vec::with_capacity(sources.len());
            for s in &sources {
                out.push(
                    stmt.query_row(params![s.topic, s.partition], |r| {
                        Ok(StoredState {
                            next_offset: r.get(0)?,
                            seq: r.get::<_, i64>(1)? as u64,
                            body: r.get(2)?,
                            location: r.get(3)?,
                            bytes: r.get::<_, i64>(4)? as u64,
                            updated_at_ms: r.get(5)?,
                        })
                    })
                    .optional()
                    .map_err(|e| db_error("read partition state", path, e))?,
                );
            }
            Ok(out)
        })
        .await
    }

    async fn advance(&self, advances: &[SourceAdvance], batch: &PendingBatch) -> Result<Advance> {
        let advances = advances.to_vec();
        let batch = batch.clone();
        let files = serde_json::to_string(&batch.files)
            .map_err(|e| Error::Internal(format!("serialize pending files: {e}")))?;
        let more = (!batch.more.is_empty()).then(|| encode_ranges(&batch.more));
        let delivered = batch.delivery.encode();
        self.with_conn(move |conn, path| {
            let err = |op| move |e| db_error(op, path, e);
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err("begin"))?;
            for a in &advances {
                let current: Option<i64> = tx
                    .query_row(
                        "SELECT version FROM checkpoints WHERE topic = ?1 AND partition = ?2",
                        params![a.source.topic, a.source.partition],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(err("read checkpoint"))?;
                if current.unwrap_or(0) as u64 != a.from.version {
                    return Ok(Advance::Conflict);
                }
                if let Some(state) = &a.state {
                    let seq: Option<i64> = tx
                        .query_row(
                            "SELECT seq FROM partition_state WHERE topic = ?1 AND partition = ?2",
                            params![a.source.topic, a.source.partition],
                            |r| r.get(0),
                        )
                        .optional()
                        .map_err(err("read partition state"))?;
                    if seq.unwrap_or(0) as u64 + 1 != state.seq {
                        return Ok(Advance::Conflict);
                    }
                    tx.execute(
                        "INSERT INTO partition_state (topic, partition, next_offset, seq, body, location, bytes, updated_at_ms)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                         ON CONFLICT (topic, partition) DO UPDATE SET
                           next_offset = excluded.next_offset, seq = excluded.seq, body = excluded.body,
                           location = excluded.location, bytes = excluded.bytes, updated_at_ms = excluded.updated_at_ms",
                        params![a.source.topic, a.source.partition, state.next_offset, state.seq as i64,
                            state.body, state.location, state.bytes as i64, state.updated_at_ms],
                    )
                    .map_err(err("write partition state"))?;
                }
                let next = a.to();
                if next.next_offset == a.from.next_offset && a.state.is_some() {
                    // Only the state moves (an idle partition's windows closed).
                    continue;
                }
                tx.execute(
                    "INSERT INTO checkpoints (topic, partition, next_offset, version, updated_at_ms, newest_ms, first_offset)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (topic, partition) DO UPDATE SET
                       next_offset = excluded.next_offset, version = excluded.version,
                       updated_at_ms = excluded.updated_at_ms,
                       newest_ms = max(coalesce(newest_ms, -1), excluded.newest_ms),
                       first_offset = coalesce(first_offset, excluded.first_offset)",
                    params![a.source.topic, a.source.partition, next.next_offset, next.version as i64, batch.created_at_ms, next.newest_ms, next.first_offset],
                )
                .map_err(err("write checkpoint"))?;
            }
            tx.execute(
                "INSERT INTO pending (topic, partition, first_offset, last_offset, created_at_ms, files, files_location, sort_key, more, delivered)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![batch.source.topic, batch.source.partition, batch.first_offset, batch.last_offset,
                    batch.created_at_ms, files, batch.files_location, batch.key().sort_key(), more, delivered],
            )
            .map_err(err("record pending files"))?;
            tx.commit().map_err(err("commit"))?;
            Ok(Advance::Advanced)
        })
        .await
    }

    async fn pending_page(&self, after: Option<&str>, limit: usize) -> Result<PendingPage> {
        let after = after.unwrap_or_default().to_string();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_conn(move |conn, path| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT topic, partition, first_offset, last_offset, created_at_ms, files, files_location, more, delivered
                     FROM pending WHERE sort_key > ?1 ORDER BY sort_key LIMIT ?2",
                )
                .map_err(|e| db_error("read pending", path, e))?;
            let mut page = read_page(&mut stmt, params![after, limit], path)?;
            let read = (page.batches.len() + page.unreadable.len()) as i64;
            if read == limit {
                let last = page
                    .batches
                    .iter()
                    .map(PendingBatch::key)
                    .chain(page.unreadable.iter().map(|(k, _)| k.clone()))
                    .map(|k| k.sort_key())
                    .max();
                page.next = last;
            }
            Ok(page)
        })
        .await
    }
    async fn batches(&self, keys: &[BatchKey]) -> Result<PendingPage> {
        let keys = keys.to_vec();
        self.with_conn(move |conn, path| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT topic, partition, first_offset, last_offset, created_at_ms, files, files_location, more, delivered
                     FROM pending WHERE topic = ?1 AND partition = ?2 AND first_offset = ?3",
                )
                .map_err(|e| db_error("read pending", path, e))?;
            let mut out = PendingPage::default();
            for k in &keys {
                let page = read_page(
                    &mut stmt,
                    params![k.source.topic, k.source.partition, k.first_offset],
                    path,
                )?;
                out.batches.extend(page.batches);
                out.unreadable.extend(page.unreadable);
            }
            out.batches.sort_by_key(|b| b.key().sort_key());
            Ok(out)
        })
        .await
    }
    async fn add_pending(&self, batch: &PendingBatch, lock: &str, holder: &str) -> Result<bool> {
        let batch = batch.clone();
        let files = serde_json::to_string(&batch.files)
            .map_err(|e| Error::Internal(format!("serialize pending files: {e}")))?;
        let (lock, holder) = (lock.to_string(), holder.to_string());
        self.with_conn(move |conn, path| {
            let err = |op| move |e| db_error(op, path, e);
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err("begin"))?;
            let held: Option<String> = tx
                .query_row("SELECT holder FROM locks WHERE name = ?1", params![lock], |r| r.get(0))
                .optional()
                .map_err(err("read lock"))?;
            if held.as_deref() != Some(holder.as_str()) {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO pending (topic, partition, first_offset, last_offset, created_at_ms, files, files_location, sort_key, delivered)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![batch.source.topic, batch.source.partition, batch.first_offset, batch.last_offset,
                    batch.created_at_ms, files, batch.files_location, batch.key().sort_key(), batch.delivery.encode()],
            )
            .map_err(err("record pending files"))?;
            tx.commit().map_err(err("commit"))?;
            Ok(true)
        })
        .await
    }
}

#[async_trait]
impl StateStore for SqliteStateStore {
    async fn put_status(&self, key: &str, json: &str) -> Result<()> {
        let (key, json) = (key.to_string(), json.to_string());
        self.with_conn(move |conn, path| {
            conn.execute(
                "INSERT INTO status (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, json],
            )
            .map(|_| ())
            .map_err(|e| db_error("write status", path, e))
        })
        .await
    }

    async fn status(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        self.with_conn(move |conn, path| {
            conn.query_row(
                "SELECT value FROM status WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| db_error("read status", path, e))
        })
        .await
    }
}
