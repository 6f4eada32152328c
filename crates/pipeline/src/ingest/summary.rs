//! What one ingest invocation did.

use std::collections::BTreeMap;

use serde::Serialize;

/// What one invocation did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IngestSummary {
    /// Records in the event.
    pub records: u64,
    /// Records written to their table.
    pub accepted: u64,
    /// Records skipped because an earlier invocation already processed them.
    pub already_seen: u64,
    /// Records written to the dead-letter table.
    pub dead_lettered: u64,
    /// Parquet files written (tables and dead letters).
    pub files_written: u64,
    /// Bytes of Parquet written.
    pub bytes_written: u64,
    /// Small derived-table files carried in the batch's state file instead of written on their
    /// own (the commit stage writes their rows; see [`crate::checkpoint::CarriedRows`]).
    pub files_carried: u64,
    /// Topic-partitions in the event.
    pub partitions: u64,
    /// Conditional writes lost to another invocation.
    pub conflicts: u64,
    /// Newest Kafka timestamp seen, epoch milliseconds.
    pub newest_timestamp_ms: Option<i64>,
    /// Dead letters by kind.
    pub dead_letters_by_kind: BTreeMap<String, u64>,
    /// Rows written to derived tables.
    pub derived_rows: u64,
    /// Rows dropped as duplicates by derived tables' dedup.
    pub deduplicated: u64,
    /// Tombstones of upsert tables taken as deletes of their keys.
    pub key_deletes: u64,
    /// Largest encoded state of a partition written (windows, dedup keys), bytes.
    pub state_bytes_max: u64,
}

impl IngestSummary {
    /// Adds another summary's counts to this one.
    pub fn add(&mut self, o: &IngestSummary) {
        self.records += o.records;
        self.accepted += o.accepted;
        self.already_seen += o.already_seen;
        self.dead_lettered += o.dead_lettered;
        self.files_written += o.files_written;
        self.files_carried += o.files_carried;
        self.bytes_written += o.bytes_written;
        self.partitions += o.partitions;
        self.conflicts += o.conflicts;
        self.derived_rows += o.derived_rows;
        self.deduplicated += o.deduplicated;
        self.key_deletes += o.key_deletes;
        self.state_bytes_max = self.state_bytes_max.max(o.state_bytes_max);
        self.newest_timestamp_ms = self.newest_timestamp_ms.max(o.newest_timestamp_ms);
        for (k, n) in &o.dead_letters_by_kind {
            *self.dead_letters_by_kind.entry(k.clone()).or_default() += n;
        }
    }

    /// One line for humans.
    pub fn line(&self) -> String {
        format!(
            "records={} accepted={} already_seen={} dead_lettered={} files_written={} bytes_written={} partitions={}",
            self.records,
            self.accepted,
            self.already_seen,
            self.dead_lettered,
            self.files_written,
            self.bytes_written,
            self.partitions
        )
    }
}
