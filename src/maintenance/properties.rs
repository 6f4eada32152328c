//! The retention maintenance applies, written into each table's properties, so that other
//! engines' clean-up agrees with ours: Athena's `VACUUM` reads `vacuum_max_snapshot_age_seconds`
//! and `vacuum_min_snapshots_to_keep`; Spark's `expire_snapshots` the `history.expire.*` ones.

use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::MaintenanceOptions;
use crate::config::Backend;
use crate::error::{Error, Result};

/// The properties that state `options`' retention.
pub fn retention_properties(options: &MaintenanceOptions) -> Vec<(String, String)> {
    let keep = options.keep_last_snapshots.max(1).to_string();
    let age_ms = options.snapshot_retention_ms.max(0);
    vec![
        (
            "history.expire.max-snapshot-age-ms".into(),
            age_ms.to_string(),
        ),
        ("history.expire.min-snapshots-to-keep".into(), keep.clone()),
        (
            "vacuum_max_snapshot_age_seconds".into(),
            (age_ms / 1000).to_string(),
        ),
        ("vacuum_min_snapshots_to_keep".into(), keep),
    ]
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
