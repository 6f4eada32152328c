//! Before a group of partitions is decoded: the writer schemas its Avro and Protobuf records
//! name, fetched
//! from the registry once per process.

use std::collections::BTreeSet;

use futures::StreamExt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::{Ingestor, Planned};
use crate::decode::framing::frame;
use crate::error::{Error, Result};
use crate::registry::Lookup;
use crate::registry::mapping::of_schema;

/// Base64 characters that hold the longest registry header (Glue: 18 bytes).
const HEADER_CHARS: usize = 24;

/// Most schema ids one group fetches from the registry: a batch of values naming thousands of
/// distinct ids (garbage, or an attack on a shared registry) fetches this many, remembers the
/// answers, and fails retryably, so every retry makes progress and none outlasts the function.
pub const MAX_FETCHES_PER_GROUP: usize = 256;
/// Lookups so far in this process: turns the order in which ids asked before are asked again.
static LOOKUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Registry requests in flight at once.
const FETCH_CONCURRENCY: usize = 8;

impl Ingestor {
    /// Fetches every schema the Avro records of `planned` name and their decoders do not have.
    /// A registry that cannot answer fails the group (nothing lands, the batch is retried); an
    /// id it does not have leaves those records to be dead letters that say so.
    pub(super) async fn resolve_schemas(&self, planned: &[Planned<'_>]) -> Result<()> {
        for p in planned {
            let Some(table) = self.topics.get(&p.source.topic) else {
                continue;
            };
            let Some(values) = table.decoder.registry() else {
                continue;
            };
            self.resolve_ids(p, table, values, false, |r| r.value.as_deref())
                .await?;
            // An Avro upsert table's keys too, where they name a row to delete: a tombstone's,
            // and on a Debezium table any record's (a delete without `before`).
            if let Some(keys) = &table.key_decoder {
                let debezium = table
                    .spec
                    .upsert
                    .as_ref()
                    .is_some_and(|u| u.envelope.is_some());
                self.resolve_ids(p, table, keys.as_ref(), true, |r| {
                    r.key.as_deref().filter(|_| debezium || r.value.is_none())
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Fetches the schemas that the part of `p`'s records `part` picks (value, or key when
    /// `keys`) names and `decoder` does not have. Ids never asked come first: past
    /// [`MAX_FETCHES_PER_GROUP`] of those the group fails (and its retry asks the next); ids the
    /// registry lacked at an earlier lookup are asked again only within the limit, and else stay
    /// missing (their records dead letters that say so), so a batch always makes progress.
    async fn resolve_ids(
        &self,
        p: &Planned<'_>,
        table: &super::TopicTable,
        decoder: &dyn crate::decode::RegistryDecoder,
        keys: bool,
        part: impl Fn(&crate::esm::EsmRecord) -> Option<&str>,
    ) -> Result<()> {
        let mut wanted = BTreeSet::new();
        let round = LOOKUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut header = [0u8; 18];
        for record in &p.records {
            let Some(value) = part(record) else {
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
                // Ids asked before in a turning order, so that each gets its turn again.
                let turn = xxhash_rust::xxh3::xxh3_64(format!("{id}#{round}").as_bytes());
                wanted.insert((decoder.was_missing(&id), turn, id));
            }
        }
        let unknown = wanted.iter().filter(|(missing, _, _)| !missing).count();
        let ids = wanted.into_iter().map(|(_, _, id)| id);
        let fetches = futures::stream::iter(ids.take(MAX_FETCHES_PER_GROUP))
            .map(|id| async move {
                let started = std::time::Instant::now();
                let found = self.registries.fetch(&id).await;
                (id, started, found)
            })
            .buffer_unordered(FETCH_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let mut failed = None;
        for (id, started, found) in fetches {
            let found = match found {
                Ok(found) => found,
                Err(e) => {
                    failed.get_or_insert(e);
                    continue;
                }
            };
            match found {
                Lookup::Found { schema, kind } => {
                    if !keys {
                        self.check_new_fields(table, &id, &schema)?;
                    }
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
        // What was learned is kept (above); the group fails only now.
        if let Some(e) = failed {
            return Err(e);
        }
        if unknown > MAX_FETCHES_PER_GROUP {
            return Err(Error::Registry {
                registry: "schema ids".into(),
                message: format!(
                    "topic {}: the batch names {unknown} schema ids this process does not know, more than {MAX_FETCHES_PER_GROUP} (the limit per batch); fetched {MAX_FETCHES_PER_GROUP}, the retry fetches the next",
                    p.source.topic
                ),
                retryable: true,
            });
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
