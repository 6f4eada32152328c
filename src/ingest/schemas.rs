//! Before a group of partitions is decoded: the writer schemas its Avro and Protobuf records
//! name, fetched
//! from the registry once per process.

use std::collections::BTreeSet;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::{Ingestor, Planned};
use crate::decode::framing::frame;
use crate::error::{Error, Result};
use crate::registry::Lookup;
use crate::registry::columns::of_schema;

/// Base64 characters that hold the longest registry header (Glue: 18 bytes).
const HEADER_CHARS: usize = 24;

impl Ingestor {
    /// Fetches every schema the Avro records of `planned` name and their decoders do not have.
    /// A registry that cannot answer fails the group (nothing lands, the batch is retried); an
    /// id it does not have leaves those records to be dead letters that say so.
    pub(super) async fn resolve_schemas(&self, planned: &[Planned<'_>]) -> Result<()> {
        for p in planned {
            let Some(table) = self.topics.get(&p.source.topic) else {
                continue;
            };
            let Some(decoder) = table.decoder.registry() else {
                continue;
            };
            let mut wanted = BTreeSet::new();
            let mut header = [0u8; 18];
            for record in &p.records {
                let Some(value) = record.value.as_deref() else {
                    continue;
                };
                let Some(prefix) = value.get(..value.len().min(HEADER_CHARS)) else {
                    continue;
                };
                let Ok(n) = STANDARD.decode_slice(prefix, &mut header) else {
                    continue;
                };
                let id = header.get(..n).and_then(|h| frame(h).ok()).map(|f| f.id);
                if let Some(id) = id.filter(|id| !decoder.knows(id)) {
                    wanted.insert(id);
                }
            }
            for id in wanted {
                let started = std::time::Instant::now();
                match self.registries.fetch(&id).await? {
                    Lookup::Found { schema, kind } => {
                        self.check_new_fields(table, &id, &schema)?;
                        decoder.add_schema(id, &kind, &schema);
                        tracing::info!(topic = %p.source.topic, schema = %id,
                            ms = started.elapsed().as_millis() as u64, "fetched a writer schema");
                    }
                    Lookup::Missing(reason) => {
                        tracing::warn!(topic = %p.source.topic, schema = %id, %reason,
                            "schema not in the registry; its records become dead letters");
                        decoder.add_missing(id, reason);
                    }
                }
            }
        }
        Ok(())
    }

    /// For a table whose columns come from the registry: a writer schema with fields the table
    /// has no columns for fails the group (once per table and schema in this process), so that
    /// the spec is read again and the table gains them before any of its records land.
    fn check_new_fields(
        &self,
        table: &super::TopicTable,
        id: &crate::registry::SchemaId,
        schema: &str,
    ) -> Result<()> {
        if table.spec.registry_subject.is_none() {
            return Ok(());
        }
        let Ok(columns) = of_schema(
            table.spec.format,
            schema,
            table.spec.registry_message.as_deref(),
        ) else {
            return Ok(()); // the decoder says what is wrong with it, per record
        };
        let new: Vec<String> = columns
            .columns
            .into_iter()
            .filter(|c| !table.spec.columns.iter().any(|t| t.name == c.name))
            .map(|c| c.name)
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let key = (table.spec.name.clone(), id.to_string());
        let first = self
            .registry_reloads
            .lock()
            .map(|mut seen| seen.insert(key))
            .unwrap_or(false);
        if !first {
            tracing::warn!(table = %table.spec.name, schema = %id, columns = ?new,
                "the registry's latest version still lacks these fields: they do not land");
            return Ok(());
        }
        Err(Error::RegistryColumnsGrew {
            table: table.spec.name.clone(),
            schema: id.to_string(),
            columns: new.join(", "),
        })
    }
}
