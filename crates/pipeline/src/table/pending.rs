//! A pending batch's files as the commit stage and orphan clean-up read them: the list in the
//! state item, and the list ingest spilled to the warehouse when it was too large for one.

use crate::backend::Backend;
use crate::checkpoint::{PendingBatch, PendingFile};
use crate::error::{Error, Result};

/// The batch's files, reading a spilled file list from the warehouse.
pub async fn resolve_files(backend: &Backend, batch: &PendingBatch) -> Result<Vec<PendingFile>> {
    let mut files = batch.files.clone();
    if let Some(location) = &batch.files_location {
        let bytes = backend.warehouse.read(location).await?;
        let spilled: Vec<PendingFile> =
            serde_json::from_slice(&bytes).map_err(|e| Error::State {
                op: "read pending files",
                message: format!("{location}: {e}"),
                retryable: false,
            })?;
        files.extend(spilled);
    }
    Ok(files)
}
