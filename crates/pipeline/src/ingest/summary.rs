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
    /// The topics' records dead-lettered, by kind.
    pub dead_letters_by_kind: BTreeMap<String, u64>,
    /// Rows written to derived tables.
    pub derived_rows: u64,
    /// Records a derived table dead-lettered (late for its window, its SQL failed on them):
    /// they landed in their topic's table all the same.
    pub derived_dead_lettered: u64,
    /// Those, by kind.
    pub derived_dead_letters_by_kind: BTreeMap<String, u64>,
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
        self.derived_dead_lettered += o.derived_dead_lettered;
        self.deduplicated += o.deduplicated;
        self.key_deletes += o.key_deletes;
        self.state_bytes_max = self.state_bytes_max.max(o.state_bytes_max);
        self.newest_timestamp_ms = self.newest_timestamp_ms.max(o.newest_timestamp_ms);
        for (k, n) in &o.dead_letters_by_kind {
            *self.dead_letters_by_kind.entry(k.clone()).or_default() += n;
        }
        for (k, n) in &o.derived_dead_letters_by_kind {
            *self
                .derived_dead_letters_by_kind
                .entry(k.clone())
                .or_default() += n;
        }
    }

    /// Dead letters of `kind` written, the topics' and the derived tables'.
    pub fn dead_letters_of(&self, kind: &str) -> u64 {
        self.dead_letters_by_kind.get(kind).copied().unwrap_or(0)
            + self
                .derived_dead_letters_by_kind
                .get(kind)
                .copied()
                .unwrap_or(0)
    }

    /// One line for humans: the records, then what became of them. The topics' dead letters
    /// (records that did not land in their table) are apart from the derived tables' (records
    /// that landed, but that a derived table could not take), each with its kinds.
    pub fn line(&self) -> String {
        let kinds = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        // Each record is one of: accepted, an upsert table's key delete, already seen, a
        // dead letter.
        let mut line = format!("records={} accepted={}", self.records, self.accepted);
        if self.key_deletes > 0 {
            line.push_str(&format!(" key_deletes={}", self.key_deletes));
        }
        line.push_str(&format!(
            " already_seen={} dead_lettered={}",
            self.already_seen, self.dead_lettered
        ));
        if !self.dead_letters_by_kind.is_empty() {
            line.push_str(&format!(" ({})", kinds(&self.dead_letters_by_kind)));
        }
        line.push_str(&format!(
            " files_written={} bytes_written={} partitions={}",
            self.files_written, self.bytes_written, self.partitions
        ));
        if self.derived_rows > 0 || self.derived_dead_lettered > 0 || self.deduplicated > 0 {
            line.push_str(&format!(
                "; derived tables: rows={} deduplicated={} dead_lettered={}",
                self.derived_rows, self.deduplicated, self.derived_dead_lettered
            ));
            if !self.derived_dead_letters_by_kind.is_empty() {
                line.push_str(&format!(" ({})", kinds(&self.derived_dead_letters_by_kind)));
            }
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_keeps_the_topics_dead_letters_apart_from_the_derived_tables() {
        let mut s = IngestSummary {
            records: 10_003,
            accepted: 9_794,
            dead_lettered: 206,
            derived_rows: 9_000,
            derived_dead_lettered: 5_922,
            key_deletes: 3,
            ..IngestSummary::default()
        };
        s.dead_letters_by_kind.insert("invalid_json".into(), 206);
        s.derived_dead_letters_by_kind.insert("late".into(), 5_922);
        let line = s.line();
        assert!(
            line.starts_with("records=10003 accepted=9794 key_deletes=3 already_seen=0 dead_lettered=206 (invalid_json=206) "),
            "{line}"
        );
        assert!(
            line.ends_with(
                "; derived tables: rows=9000 deduplicated=0 dead_lettered=5922 (late=5922)"
            ),
            "{line}"
        );
        assert_eq!(s.accepted + s.key_deletes + s.dead_lettered, s.records);
        assert_eq!(s.dead_letters_of("late"), 5_922);
    }
}
