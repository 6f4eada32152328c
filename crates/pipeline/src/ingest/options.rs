//! Ingest's knobs.

use super::{MAX_ATTEMPTS, MAX_INLINE_FILES_BYTES, MAX_PARTITIONS_PER_BATCH};
use crate::error::{Error, Result};
use crate::spec::PipelineSpec;

/// Knobs of ingest, read the same way by the Lambda and `streamtable ingest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestOptions {
    /// Record values larger than this (decoded) are dead-lettered as `oversize`; from the
    /// spec's `max_record_bytes`.
    pub max_record_bytes: usize,
    /// Re-plans of a partition after losing its conditional checkpoint write.
    pub max_attempts: u32,
    /// A pending batch's file list larger than this (bytes of JSON) is written to the
    /// warehouse, and the state item refers to it.
    pub max_inline_files_bytes: usize,
    /// ZSTD level of the micro-files (compaction rewrites them later).
    pub zstd_level: i32,
    /// Most topic-partitions of one invocation landed as one batch (one file set, one
    /// transaction); more are split into several batches.
    pub max_partitions_per_batch: usize,
    /// A partition's section that adds no dedup keys is kept in its state item when it encodes
    /// to at most this many bytes; otherwise (and whenever it adds keys) it goes into the
    /// batch's state file in the warehouse, and the item names the file.
    pub max_inline_state_bytes: usize,
    /// A derived table's file of at most this many bytes rides in the batch's state file
    /// (when the batch writes one, and the commit stage reads carried rows) instead of being
    /// written on its own: the commit stage writes the round's into the table. 0: never.
    pub max_carried_file_bytes: usize,
}

impl IngestOptions {
    /// The defaults for `spec`.
    pub fn for_spec(spec: &PipelineSpec) -> IngestOptions {
        IngestOptions {
            max_record_bytes: spec.settings.max_record_bytes,
            max_attempts: MAX_ATTEMPTS,
            max_inline_files_bytes: MAX_INLINE_FILES_BYTES,
            zstd_level: 1,
            max_partitions_per_batch: MAX_PARTITIONS_PER_BATCH,
            max_inline_state_bytes: super::state_files::MAX_INLINE_STATE_BYTES,
            max_carried_file_bytes: super::pending::MAX_CARRIED_FILE_BYTES,
        }
    }

    /// The defaults for `spec`, overridden by `STREAMTABLE_INGEST_MAX_ATTEMPTS`,
    /// `STREAMTABLE_INGEST_ZSTD_LEVEL` (1 to 22) and `STREAMTABLE_CARRIED_FILE_BYTES` (0 to
    /// 262,144; 0 writes every file on its own).
    pub fn from_env(spec: &PipelineSpec) -> Result<IngestOptions> {
        Self::from_lookup(spec, |k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// [`IngestOptions::from_env`] through `var` (for tests).
    pub fn from_lookup(
        spec: &PipelineSpec,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<IngestOptions> {
        let mut o = Self::for_spec(spec);
        let num = |k: &str, range: std::ops::RangeInclusive<i64>| -> Result<Option<i64>> {
            match var(k) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<i64>() {
                    Ok(n) if range.contains(&n) => Ok(Some(n)),
                    _ => Err(Error::Config(format!(
                        "{k}={v:?} is not a whole number from {} to {}",
                        range.start(),
                        range.end()
                    ))),
                },
            }
        };
        if let Some(n) = num("STREAMTABLE_INGEST_MAX_ATTEMPTS", 1..=100)? {
            o.max_attempts = n as u32;
        }
        if let Some(n) = num("STREAMTABLE_INGEST_ZSTD_LEVEL", 1..=22)? {
            o.zstd_level = n as i32;
        }
        if let Some(n) = num(
            "STREAMTABLE_CARRIED_FILE_BYTES",
            0..=super::pending::MAX_CARRIED_BATCH_BYTES as i64,
        )? {
            o.max_carried_file_bytes = n as usize;
        }
        Ok(o)
    }
}
