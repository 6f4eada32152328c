//! What a stage reports when one of its steps fails for one table or partition while the run
//! goes on: the commit, compaction and maintenance stages isolate failures per table, and the
//! scheduled run collects them into its status.

use serde::Serialize;

/// A step of the run that failed for one table or partition (the others went on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Failure {
    /// `commit`, `compaction` or `maintenance`.
    pub stage: String,
    /// The table, when the failure concerns one.
    pub table: Option<String>,
    /// The partition, for a compaction job.
    pub partition: Option<String>,
    /// What went wrong.
    pub error: String,
    /// Whether the next run can be expected to succeed without a fix.
    pub retryable: bool,
}

impl Failure {
    pub(crate) fn new(
        stage: &str,
        table: Option<&str>,
        partition: Option<&str>,
        e: &crate::Error,
    ) -> Self {
        tracing::error!(stage, table = ?table, partition = ?partition, error = %e,
            retryable = e.is_retryable(), "step failed; the rest of the run goes on");
        Failure {
            stage: stage.to_string(),
            table: table.map(str::to_string),
            partition: partition.map(str::to_string),
            error: e.to_string(),
            retryable: e.is_retryable(),
        }
    }
}
