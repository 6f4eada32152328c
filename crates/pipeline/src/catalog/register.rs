//! Registering a table whose files are in the warehouse but whose catalog entry is gone (a Glue
//! database deleted with an old stack, a lost `catalog.db`): `streamtable register`.
//!
//! Which metadata file is the table's head is decided by version number, never by time: every
//! commit writes version `head + 1`, so the newest version is the head — unless several files
//! share it, which happens when a commit attempt lost its swap after writing (its file is never
//! referenced). Then registering either could resurrect a commit that did not happen or drop one
//! that did, so the choice is refused and the files are listed, for the operator to pick
//! (`--metadata`) after looking at them.

use iceberg::spec::TableMetadata;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// What registering one table did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// The catalog already has the table (nothing changed).
    AlreadyThere(String),
    /// The table now points at this metadata file.
    Registered(String),
}

/// The metadata files of `table` in the warehouse, with their versions, newest first.
pub async fn metadata_files(
    backend: &Backend,
    namespace: &str,
    table: &str,
) -> Result<Vec<(u64, String)>> {
    let dir = format!(
        "{}/metadata/",
        backend.warehouse.table_location(namespace, table)
    );
    let mut files: Vec<(u64, String)> = backend
        .warehouse
        .list(&dir)
        .await?
        .into_iter()
        .filter(|o| o.location.ends_with(".metadata.json"))
        .filter_map(|o| {
            let name = o.location.rsplit('/').next()?;
            let version = name.split('-').next()?.parse().ok()?;
            Some((version, o.location))
        })
        .collect();
    files.sort_by(|a, b| b.cmp(a));
    Ok(files)
}

/// Points the catalog entry of `table` at its head metadata file in the warehouse (or at
/// `choose`, one of its metadata files), unless the catalog has the table already.
pub async fn register(
    backend: &Backend,
    namespace: &str,
    table: &str,
    choose: Option<&str>,
) -> Result<Registered> {
    if let Some(p) = backend.catalog.pointers().get(namespace, table).await? {
        return Ok(Registered::AlreadyThere(p.metadata_location));
    }
    let files = metadata_files(backend, namespace, table).await?;
    let location = match choose {
        Some(c) => files
            .iter()
            .find(|(_, l)| l == c || l.ends_with(&format!("/{c}")))
            .map(|(_, l)| l.clone())
            .ok_or_else(|| {
                Error::Config(format!(
                    "table {table}: {c} is not one of its metadata files ({})",
                    files
                        .iter()
                        .map(|(_, l)| l.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?,
        None => {
            let Some((newest, _)) = files.first() else {
                return Err(Error::Config(format!(
                    "table {table}: no metadata file under {}/metadata/; nothing to register",
                    backend.warehouse.table_location(namespace, table)
                )));
            };
            let heads: Vec<&String> = files
                .iter()
                .filter(|(v, _)| v == newest)
                .map(|(_, l)| l)
                .collect();
            if heads.len() > 1 {
                return Err(Error::Config(format!(
                    "table {table}: {} metadata files share the newest version {newest} (a commit attempt lost its swap after writing one of them): {}; look at their snapshots and pass the table's with --metadata",
                    heads.len(),
                    heads
                        .iter()
                        .map(|l| l.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            heads[0].clone()
        }
    };
    let metadata = TableMetadata::read_from(backend.catalog.file_io(), &location)
        .await
        .map_err(|e| Error::iceberg(format!("read {location}"), e))?;
    backend
        .catalog
        .pointers()
        .ensure_namespace(namespace)
        .await?;
    backend
        .catalog
        .pointers()
        .create(namespace, table, &location, &metadata)
        .await?;
    tracing::info!(table, %location, "table registered");
    Ok(Registered::Registered(location))
}
