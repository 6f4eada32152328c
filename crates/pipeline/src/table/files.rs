//! What a snapshot holds: its manifests and their entries, loaded concurrently.

use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::ArrowFileReader;
use iceberg::io::FileMetadata;
use iceberg::spec::{ManifestContentType, ManifestEntryRef, ManifestFile, SnapshotRef};
use iceberg::table::Table;
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use crate::error::{Error, Result};

/// Manifests loaded at once.
const CONCURRENT_MANIFESTS: usize = 16;

/// A manifest entry with the partition spec of the manifest holding it.
#[derive(Debug, Clone)]
pub struct FileEntry {
    /// The partition spec the entry's manifest was written with.
    pub spec_id: i32,
    /// The manifest entry.
    pub entry: ManifestEntryRef,
}

/// The manifests of one snapshot, with the entries of its data manifests.
#[derive(Debug, Clone, Default)]
pub struct SnapshotFiles {
    /// Every manifest in the snapshot's manifest list.
    pub manifests: Vec<ManifestFile>,
    /// Entries of the data manifests, in manifest order (alive and deleted).
    pub data_entries: Vec<FileEntry>,
}

impl SnapshotFiles {
    /// Entries of files that are part of the snapshot (status added or existing).
    pub fn live(&self) -> impl Iterator<Item = &FileEntry> {
        self.data_entries.iter().filter(|e| e.entry.is_alive())
    }

    /// Manifests holding deletes (carried unchanged by rewrites).
    pub fn delete_manifests(&self) -> impl Iterator<Item = &ManifestFile> {
        self.manifests
            .iter()
            .filter(|m| m.content == ManifestContentType::Deletes)
    }
}

/// Loads the manifests of `snapshot` (sequence numbers inherited, as the spec requires).
pub async fn load(table: &Table, snapshot: &SnapshotRef) -> Result<SnapshotFiles> {
    let name = table.identifier().to_string();
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(|e| Error::iceberg(format!("manifest list of {name}"), e))?;
    let manifests: Vec<ManifestFile> = list.entries().to_vec();
    let file_io = table.file_io().clone();
    let data_manifests: Vec<ManifestFile> = manifests
        .iter()
        .filter(|m| m.content == ManifestContentType::Data)
        .cloned()
        .collect();
    let loads: Vec<_> = data_manifests
        .into_iter()
        .map(|m| load_entries(file_io.clone(), m))
        .collect();
    let loaded: Vec<Vec<FileEntry>> = futures::stream::iter(loads)
        .buffered(CONCURRENT_MANIFESTS)
        .try_collect()
        .await?;
    Ok(SnapshotFiles {
        manifests,
        data_entries: loaded.into_iter().flatten().collect(),
    })
}

async fn load_entries(file_io: iceberg::io::FileIO, m: ManifestFile) -> Result<Vec<FileEntry>> {
    let manifest = m
        .load_manifest(&file_io)
        .await
        .map_err(|e| Error::iceberg(format!("manifest {}", m.manifest_path), e))?;
    let spec_id = m.partition_spec_id;
    Ok(manifest
        .entries()
        .iter()
        .map(|entry| FileEntry {
            spec_id,
            entry: entry.clone(),
        })
        .collect())
}

/// The live entries of the snapshot's delete manifests (position and equality delete files).
pub async fn live_delete_files(table: &Table, files: &SnapshotFiles) -> Result<Vec<FileEntry>> {
    let loads: Vec<_> = files
        .delete_manifests()
        .cloned()
        .map(|m| load_entries(table.file_io().clone(), m))
        .collect();
    let loaded: Vec<Vec<FileEntry>> = futures::stream::iter(loads)
        .buffered(CONCURRENT_MANIFESTS)
        .try_collect()
        .await?;
    Ok(loaded
        .into_iter()
        .flatten()
        .filter(|e| e.entry.is_alive())
        .collect())
}

/// The current snapshot's files, or nothing for a table without snapshots.
pub async fn load_current(table: &Table) -> Result<SnapshotFiles> {
    match table.metadata().current_snapshot() {
        Some(s) => load(table, s).await,
        None => Ok(SnapshotFiles::default()),
    }
}

/// A Parquet file of the table (`size` bytes, from its manifest entry), opened for reading by
/// range through the table's storage.
pub async fn open_parquet(
    table: &Table,
    path: &str,
    size: u64,
) -> Result<ParquetRecordBatchStreamBuilder<ArrowFileReader>> {
    let reader = table
        .file_io()
        .new_input(path)
        .map_err(|e| Error::iceberg(path.to_string(), e))?
        .reader()
        .await
        .map_err(|e| Error::iceberg(format!("open {path}"), e))?;
    ParquetRecordBatchStreamBuilder::new(ArrowFileReader::new(FileMetadata { size }, reader))
        .await
        .map_err(|e| Error::Internal(format!("read {path}: {e}")))
}
