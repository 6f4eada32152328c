//! A snapshot built by hand on the table's current one (iceberg-rust 0.10 commits appends only):
//! the manifests it writes, those it carries, its manifest list, its summary — what the
//! `replace` commit ([`super::replace`]) and the upsert commit ([`crate::upsert`]) share.
//!
//! Entries keep what the spec requires: an existing entry its original snapshot id and sequence
//! numbers, a deleted entry its original sequence numbers, an added one the new snapshot's
//! (inherited). The summary's counts come from the entries written, its six `total-*` fields
//! are the previous totals plus added minus removed, and properties that move only with their
//! own commits (a join's state, an upsert table's key index) are carried over.

use std::collections::HashMap;

use iceberg::spec::{
    DataFile, ManifestContentType, ManifestEntryRef, ManifestFile, ManifestListWriter,
    ManifestWriterBuilder, Operation, Snapshot, SnapshotSummaryCollector, Summary,
};
use iceberg::table::Table;

use crate::error::{Error, Result};

/// One entry of a manifest being written.
pub(crate) enum Entry {
    /// A live file kept as it is.
    Existing(ManifestEntryRef),
    /// A live file removed by the snapshot.
    Deleted(ManifestEntryRef),
    /// A file the snapshot adds.
    Added(Box<DataFile>),
}

/// A snapshot under construction.
pub(crate) struct SnapshotBuild<'a> {
    table: &'a Table,
    /// The new snapshot's id (fresh, positive, unused by the table).
    pub snapshot_id: i64,
    commit: uuid::Uuid,
    manifests: Vec<ManifestFile>,
    summary: SnapshotSummaryCollector,
    /// Every object written for the snapshot: deleted again when its commit loses.
    pub written: Vec<String>,
}

impl<'a> SnapshotBuild<'a> {
    /// A snapshot to follow the table's current one.
    pub fn new(table: &'a Table) -> Self {
        SnapshotBuild {
            table,
            snapshot_id: new_snapshot_id(table),
            commit: uuid::Uuid::new_v4(),
            manifests: Vec::new(),
            summary: SnapshotSummaryCollector::default(),
            written: Vec::new(),
        }
    }

    /// A name unique to this snapshot, for the objects it writes.
    pub fn commit(&self) -> uuid::Uuid {
        self.commit
    }

    /// Carries a manifest of the current snapshot unchanged.
    pub fn carry(&mut self, manifest: ManifestFile) {
        self.manifests.push(manifest);
    }

    /// Writes one manifest of `content` for partition spec `spec_id` holding `entries`; added
    /// and deleted entries count in the summary. On failure, every object written for the
    /// snapshot so far is deleted (the snapshot will never be committed).
    pub async fn manifest(
        &mut self,
        spec_id: i32,
        content: ManifestContentType,
        entries: Vec<Entry>,
    ) -> Result<()> {
        let result = self.write_manifest(spec_id, content, entries).await;
        if result.is_err() {
            self.discard().await;
        }
        result
    }

    /// Deletes every object written for the snapshot.
    async fn discard(&mut self) {
        for path in std::mem::take(&mut self.written) {
            let _ = self.table.file_io().delete(&path).await;
        }
    }

    async fn write_manifest(
        &mut self,
        spec_id: i32,
        content: ManifestContentType,
        entries: Vec<Entry>,
    ) -> Result<()> {
        let metadata = self.table.metadata();
        let ident = self.table.identifier();
        let ctx = |what: &str| format!("{what} of {ident}");
        let schema = metadata.current_schema().clone();
        let spec = metadata
            .partition_spec_by_id(spec_id)
            .ok_or_else(|| Error::Internal(ctx(&format!("partition spec {spec_id}"))))?;
        let path = format!(
            "{}/metadata/{}-m{}.avro",
            metadata.location(),
            self.commit,
            self.written.len()
        );
        let output = self
            .table
            .file_io()
            .new_output(&path)
            .map_err(|e| Error::iceberg(ctx("manifest"), e))?;
        let builder = ManifestWriterBuilder::new(
            output,
            Some(self.snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        );
        let mut writer = match content {
            ManifestContentType::Data => builder.build_v2_data(),
            ManifestContentType::Deletes => builder.build_v2_deletes(),
        };
        let bad = |e| Error::iceberg(ctx("manifest entry"), e);
        for entry in entries {
            match entry {
                Entry::Existing(e) => writer
                    .add_existing_file(
                        e.data_file().clone(),
                        e.snapshot_id.unwrap_or(self.snapshot_id),
                        e.sequence_number.unwrap_or(0),
                        e.file_sequence_number.or(e.sequence_number),
                    )
                    .map_err(bad)?,
                Entry::Deleted(e) => {
                    self.summary
                        .remove_file(e.data_file(), schema.clone(), spec.clone());
                    writer
                        .add_delete_file(
                            e.data_file().clone(),
                            e.sequence_number.unwrap_or(0),
                            e.file_sequence_number.or(e.sequence_number),
                        )
                        .map_err(bad)?
                }
                Entry::Added(f) => {
                    self.summary.add_file(&f, schema.clone(), spec.clone());
                    writer.add_file(*f, -1).map_err(bad)?
                }
            }
        }
        self.written.push(path);
        self.manifests.push(
            writer
                .write_manifest_file()
                .await
                .map_err(|e| Error::iceberg(ctx("write manifest"), e))?,
        );
        Ok(())
    }

    /// Writes the manifest list and returns the snapshot (`operation`, with `properties` in its
    /// summary besides the counts) and every object written for it (deleted on failure).
    pub async fn finish(
        mut self,
        operation: Operation,
        properties: &HashMap<String, String>,
    ) -> Result<(Snapshot, Vec<String>)> {
        let list_path = format!(
            "{}/metadata/snap-{}-0-{}.avro",
            self.table.metadata().location(),
            self.snapshot_id,
            self.commit
        );
        // Named before it is written: a list half written is deleted too.
        self.written.push(list_path.clone());
        let manifests = std::mem::take(&mut self.manifests);
        if let Err(e) = write_list(self.table, &list_path, self.snapshot_id, manifests).await {
            self.discard().await;
            return Err(e);
        }
        let SnapshotBuild {
            table,
            snapshot_id,
            summary,
            written,
            ..
        } = self;
        let metadata = table.metadata();
        let sequence_number = metadata.next_sequence_number();

        let mut props = properties.clone();
        props.extend(summary.build());
        let previous = metadata
            .current_snapshot()
            .map(|s| s.summary().additional_properties.clone())
            .unwrap_or_default();
        add_totals(&mut props, &previous);
        // A join table's state moves only with its join's commits, an upsert table's key index
        // with its upserts: carried over unless the snapshot sets them.
        for key in [
            super::JOIN_STATE_PROPERTY,
            super::KEY_INDEX_PROPERTY,
            super::KEY_INDEX_RUNS_PROPERTY,
        ] {
            if let Some(state) = previous.get(key) {
                props
                    .entry(key.to_string())
                    .or_insert_with(|| state.clone());
            }
        }
        let snapshot = Snapshot::builder()
            .with_manifest_list(list_path)
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(metadata.current_snapshot_id())
            .with_sequence_number(sequence_number)
            .with_summary(Summary {
                operation,
                additional_properties: props,
            })
            .with_schema_id(metadata.current_schema_id())
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .build();
        Ok((snapshot, written))
    }
}

/// Writes the manifest list of snapshot `snapshot_id` (on the current one) at `path`.
async fn write_list(
    table: &Table,
    path: &str,
    snapshot_id: i64,
    manifests: Vec<ManifestFile>,
) -> Result<()> {
    let metadata = table.metadata();
    let ident = table.identifier();
    let ctx = |what: &str| format!("{what} of {ident}");
    let out = table
        .file_io()
        .new_output(path)
        .map_err(|e| Error::iceberg(ctx("manifest list"), e))?
        .writer()
        .await
        .map_err(|e| Error::iceberg(ctx("manifest list"), e))?;
    let mut list = ManifestListWriter::v2(
        out,
        snapshot_id,
        metadata.current_snapshot_id(),
        metadata.next_sequence_number(),
    );
    list.add_manifests(manifests.into_iter())
        .map_err(|e| Error::iceberg(ctx("manifest list"), e))?;
    list.close()
        .await
        .map_err(|e| Error::iceberg(ctx("write manifest list"), e))
}

/// The six `total-*` fields: previous totals, plus what was added, minus what was removed.
fn add_totals(props: &mut HashMap<String, String>, previous: &HashMap<String, String>) {
    let get = |m: &HashMap<String, String>, k: &str| {
        m.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0)
    };
    let totals = [
        ("total-records", "added-records", "deleted-records"),
        ("total-data-files", "added-data-files", "deleted-data-files"),
        ("total-files-size", "added-files-size", "removed-files-size"),
        (
            "total-delete-files",
            "added-delete-files",
            "removed-delete-files",
        ),
        (
            "total-position-deletes",
            "added-position-deletes",
            "removed-position-deletes",
        ),
        (
            "total-equality-deletes",
            "added-equality-deletes",
            "removed-equality-deletes",
        ),
    ];
    let values: Vec<(String, String)> = totals
        .iter()
        .map(|(total, plus, minus)| {
            let v = (get(previous, total) + get(props, plus) - get(props, minus)).max(0);
            (total.to_string(), v.to_string())
        })
        .collect();
    props.extend(values);
}

/// A fresh positive snapshot id not used by the table.
fn new_snapshot_id(table: &Table) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) >> 1) as i64;
        if id != 0 && !table.metadata().snapshots().any(|s| s.snapshot_id() == id) {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_previous_plus_added_minus_removed() {
        let previous: HashMap<String, String> = [
            ("total-records", "100"),
            ("total-data-files", "10"),
            ("total-files-size", "5000"),
            ("total-delete-files", "2"),
            ("total-position-deletes", "7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut props: HashMap<String, String> = [
            ("added-records", "40"),
            ("deleted-records", "40"),
            ("added-data-files", "1"),
            ("deleted-data-files", "4"),
            ("added-files-size", "1500"),
            ("removed-files-size", "2000"),
            ("removed-delete-files", "2"),
            ("removed-position-deletes", "7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        add_totals(&mut props, &previous);
        assert_eq!(props["total-records"], "100");
        assert_eq!(props["total-data-files"], "7");
        assert_eq!(props["total-files-size"], "4500");
        assert_eq!(props["total-delete-files"], "0");
        assert_eq!(props["total-position-deletes"], "0");
        assert_eq!(props["total-equality-deletes"], "0");
    }
}
