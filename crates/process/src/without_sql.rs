//! A build without feature `sql`: a spec with derived tables is refused when it loads, so the
//! processor never has a table to run.

use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::spec::PipelineSpec;

/// What one derived table got from a batch of its source's rows.
pub struct Derived {
    /// The derived table.
    pub table: String,
    /// Its layout.
    pub layout: Arc<TableLayout>,
    /// Its rows.
    pub rows: Option<RecordBatch>,
    /// Source rows that failed its SQL, with the reason.
    pub failures: Vec<(usize, String)>,
    /// Source rows later than a window's allowed lateness.
    pub late: Vec<(usize, String)>,
    /// Source rows whose event time is too far ahead of their Kafka timestamp.
    pub future: Vec<(usize, String)>,
    /// Source rows dropped as duplicates.
    pub deduplicated: u64,
}

/// The derived tables of a pipeline: none in a build without SQL.
pub struct Processor;

impl Processor {
    /// Refuses a spec with derived tables.
    pub fn new(spec: &PipelineSpec) -> Result<Processor> {
        if spec.derived.is_empty() {
            Ok(Processor)
        } else {
            Err(Error::Spec(
                "derived tables need a build with feature `sql`".into(),
            ))
        }
    }

    /// No layouts.
    pub fn layouts(&self) -> impl Iterator<Item = &Arc<TableLayout>> {
        std::iter::empty()
    }

    /// No derived table.
    pub fn sources(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::empty()
    }

    /// No derived table to take a layout.
    pub fn use_layout(&mut self, _layout: &Arc<TableLayout>) -> bool {
        false
    }

    /// No derived table to describe.
    pub fn describe(&self, _name: &str) -> Option<String> {
        None
    }

    /// Nothing to read.
    pub async fn refresh(&self, _now_ms: i64) -> Result<()> {
        Ok(())
    }

    /// No dedup.
    pub fn dedup_within_us(&self, _table: &str) -> Option<u64> {
        None
    }

    /// No state.
    pub fn is_stateful(&self, _source: &str) -> bool {
        false
    }

    /// No window to close.
    pub fn close_all(
        &self,
        _source: &str,
        _partition: i32,
        _last_offset: i64,
        _state: &mut crate::partition_state::PartitionState,
    ) -> Result<Vec<Derived>> {
        Ok(Vec::new())
    }

    /// No window to close.
    pub fn advance_watermark(
        &self,
        _source: &str,
        _partition: i32,
        _last_offset: i64,
        _state: &mut crate::partition_state::PartitionState,
        _watermark: i64,
    ) -> Result<Vec<Derived>> {
        Ok(Vec::new())
    }

    /// No derived table.
    pub fn derive(
        &self,
        _source: &str,
        _rows: &RecordBatch,
        _states: &mut std::collections::BTreeMap<i32, crate::partition_state::PartitionState>,
        _now_ms: i64,
    ) -> Result<Vec<Derived>> {
        Ok(Vec::new())
    }
}
