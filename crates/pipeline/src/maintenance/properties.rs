//! The retention maintenance applies, kept in each table's properties
//! ([`crate::table::properties::retention_properties`]) so that other engines' clean-up agrees
//! with ours.

use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::MaintenanceOptions;
use crate::backend::Backend;
use crate::error::{Error, Result};

/// The properties that state `options`' retention.
pub fn retention_properties(options: &MaintenanceOptions) -> Vec<(String, String)> {
    crate::table::properties::retention_properties(
        options.keep_last_snapshots,
        options.snapshot_retention_ms,
    )
}

/// Sets the retention properties of table `ident` where they differ from `options` (a table
/// created before them, or options changed since); returns whether it committed.
pub async fn sync_retention(
    backend: &Backend,
    ident: &iceberg::TableIdent,
    options: &MaintenanceOptions,
) -> Result<bool> {
    let Some((table, _)) = backend.catalog.load(ident).await? else {
        return Ok(false);
    };
    let have = table.metadata().properties();
    let stale: Vec<(String, String)> = retention_properties(options)
        .into_iter()
        .filter(|(k, v)| have.get(k) != Some(v))
        .collect();
    if stale.is_empty() {
        return Ok(false);
    }
    let tx = Transaction::new(&table);
    let action = stale
        .into_iter()
        .fold(tx.update_table_properties(), |a, (k, v)| a.set(k, v));
    let tx = action
        .apply(tx)
        .map_err(|e| Error::iceberg(format!("set retention properties of {ident}"), e))?;
    tx.commit(&backend.catalog)
        .await
        .map_err(|e| Error::iceberg(format!("set retention properties of {ident}"), e))?;
    tracing::info!(table = %ident, "retention properties set for other engines' clean-up");
    Ok(true)
}
