//! The commit intent and the named leases of the SQLite state store.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::{SqliteStateStore, db_error};
use crate::error::{Error, Result};
use crate::store::{CommitIntent, CommitLog, Locks};

#[async_trait]
impl CommitLog for SqliteStateStore {
    async fn commit_intent(&self) -> Result<Option<CommitIntent>> {
        self.with_conn(|conn, path| {
            let row = conn
                .query_row(
                    "SELECT id, created_at_ms, batches FROM commit_intent WHERE slot = 1",
                    [],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, String>(2)?,
                        ))
                    },
                )
                .optional()
                .map_err(|e| db_error("read commit intent", path, e))?;
            row.map(|(id, created_at_ms, batches)| {
                let batches = serde_json::from_str(&batches).map_err(|e| Error::State {
                    op: "read commit intent",
                    message: format!("{}: commit intent {id} is corrupt: {e}", path.display()),
                    retryable: false,
                })?;
                Ok(CommitIntent {
                    id,
                    created_at_ms,
                    batches,
                })
            })
            .transpose()
        })
        .await
    }
    async fn begin_commit(&self, intent: &CommitIntent) -> Result<bool> {
        let batches = serde_json::to_string(&intent.batches)
            .map_err(|e| Error::Internal(format!("serialize commit intent: {e}")))?;
        let (id, at) = (intent.id.clone(), intent.created_at_ms);
        self.with_conn(move |conn, path| {
            conn.execute(
                "INSERT OR IGNORE INTO commit_intent (slot, id, created_at_ms, batches) VALUES (1, ?1, ?2, ?3)",
                params![id, at, batches],
            )
            .map(|n| n == 1)
            .map_err(|e| db_error("write commit intent", path, e))
        })
        .await
    }
    async fn finish_commit(&self, intent: &CommitIntent) -> Result<()> {
        let intent = intent.clone();
        self.with_conn(move |conn, path| {
            let err = |op| move |e| db_error(op, path, e);
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err("begin"))?;
            for b in &intent.batches {
                tx.execute(
                    "DELETE FROM pending WHERE topic = ?1 AND partition = ?2 AND first_offset = ?3",
                    params![b.source.topic, b.source.partition, b.first_offset],
                )
                .map_err(err("remove pending batch"))?;
            }
            tx.execute(
                "DELETE FROM commit_intent WHERE slot = 1 AND id = ?1",
                params![intent.id],
            )
            .map_err(err("remove commit intent"))?;
            tx.commit().map_err(err("commit"))
        })
        .await
    }
}

#[async_trait]
impl Locks for SqliteStateStore {
    async fn try_lock(
        &self,
        name: &str,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool> {
        let (name, holder) = (name.to_string(), holder.to_string());
        self.with_conn(move |conn, path| {
            conn.execute(
                "INSERT INTO locks (name, holder, expires_at_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms
                 WHERE locks.expires_at_ms < ?4 OR locks.holder = excluded.holder",
                params![name, holder, expires_at_ms, now_ms],
            )
            .map(|n| n == 1)
            .map_err(|e| db_error("take lock", path, e))
        })
        .await
    }
    async fn unlock(&self, name: &str, holder: &str) -> Result<()> {
        let (name, holder) = (name.to_string(), holder.to_string());
        self.with_conn(move |conn, path| {
            conn.execute(
                "DELETE FROM locks WHERE name = ?1 AND holder = ?2",
                params![name, holder],
            )
            .map(|_| ())
            .map_err(|e| db_error("release lock", path, e))
        })
        .await
    }
}
