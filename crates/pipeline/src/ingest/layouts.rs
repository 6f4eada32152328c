//! The layouts ingest writes with, resolved against the catalog at start: a table the catalog
//! has is first evolved to the spec, and its files then carry the table's own field ids (which
//! after a rename, a drop or an added column are no longer the spec's positions). A table the
//! catalog does not have yet is written with the spec's layout, whose ids are those its
//! creation assigns.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Ingestor, Planned};
use crate::backend::Backend;
use crate::checkpoint::SourcePartition;
use crate::error::{Error, Result};
use crate::esm::EsmRecord;
use iceberg::table::Table;

use crate::schema::TableLayout;
use crate::spec::PipelineSpec;
use crate::tables::{TableSet, check_partition_spec, evolve_table};

/// What the catalog said about each table.
#[derive(Debug, Default)]
pub struct Resolved {
    /// The layout of each table the catalog has (after evolving it to the spec).
    pub layouts: BTreeMap<String, Arc<TableLayout>>,
    /// Tables the catalog refused (a schema change it cannot make), with the reason.
    pub refused: BTreeMap<String, String>,
}

impl TableSet {
    /// Evolves every existing table to the spec and returns its layout as the catalog has it.
    /// Retryable failures (the catalog unreachable) are errors; refusals are reported per table.
    pub async fn resolve_layouts(&self, backend: &Backend) -> Result<Resolved> {
        let mut out = Resolved::default();
        for (name, def) in &self.tables {
            let Some(spec) = &def.spec else { continue };
            let ident = self.ident(name);
            let Some((table, _)) = backend.catalog.load(&ident).await? else {
                continue;
            };
            let evolved = match check_partition_spec(name, &table, &def.layout) {
                Ok(()) => evolve_table(backend, &ident, spec, table).await,
                Err(e) => Err(e),
            };
            out.record(self, name, evolved)?;
        }
        Ok(out)
    }
}

impl Resolved {
    /// Records what the catalog said of table `name` (the table as evolved, or why not): its
    /// layout, or its refusal. Retryable failures (the catalog unreachable) are returned.
    pub fn record(&mut self, tables: &TableSet, name: &str, table: Result<Table>) -> Result<()> {
        let refused = match table.and_then(|t| tables.catalog_layout(name, &t)) {
            Ok(layout) => {
                self.layouts.insert(name.to_string(), Arc::new(layout));
                return Ok(());
            }
            Err(e) if e.is_retryable() => return Err(e),
            Err(e) => e,
        };
        tracing::error!(table = %name, error = %refused, "table refused: its topic is not ingested until the spec and the table agree");
        let why = match refused {
            Error::SchemaRefused { reasons, .. } => reasons,
            other => other.to_string(),
        };
        self.refused.insert(name.to_string(), why);
        Ok(())
    }
}

impl Ingestor {
    /// An ingestor for `spec` on `backend` whose files carry the catalog's field ids: existing
    /// tables are evolved to the spec first. What a Lambda builds at cold start.
    pub async fn connect(spec: &PipelineSpec, backend: &Backend) -> Result<Ingestor> {
        let tables = TableSet::new(spec, &backend.namespace)?;
        let resolved = tables.resolve_layouts(backend).await?;
        let mut ingestor = Ingestor::new(spec, backend)?;
        ingestor.use_layouts(&resolved);
        Ok(ingestor)
    }

    /// Writes with `resolved`'s layouts, and refuses the topics of refused tables.
    pub fn use_layouts(&mut self, resolved: &Resolved) {
        for layout in resolved.layouts.values() {
            // A topic's table may have `kafka_headers` its spec no longer asks for: its rows are
            // built with the column (NULL), and the derived tables' SQL runs without it.
            for t in self.topics.values_mut() {
                if t.spec.name == layout.name && layout.fits(&t.layout) {
                    t.layout = layout.clone();
                }
            }
            self.processor.use_layout(layout);
            if let Some(l) = self.layouts.get_mut(&layout.name)
                && layout.fits(l)
            {
                *l = layout.clone();
            }
        }
        let sources: Vec<(String, String)> = self
            .processor
            .sources()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect();
        for (table, why) in &resolved.refused {
            let source = sources
                .iter()
                .find(|(n, _)| n == table)
                .map_or(table.as_str(), |(_, s)| s.as_str());
            for t in self.topics.values() {
                if t.spec.name == source {
                    self.refused
                        .insert(t.spec.topic.clone(), (table.clone(), why.clone()));
                }
            }
        }
    }

    /// The partitions of topics that feed no refused table, and the error for the others
    /// (which are left for the event source mapping to retry).
    pub(super) fn without_refused<'e>(
        &self,
        groups: impl IntoIterator<Item = (SourcePartition, Vec<&'e EsmRecord>)>,
    ) -> (Vec<(SourcePartition, Vec<&'e EsmRecord>)>, Option<Error>) {
        let mut error = None;
        let mut kept = Vec::new();
        for (source, records) in groups {
            match self.check_refused_topic(&source.topic) {
                Ok(()) => kept.push((source, records)),
                Err(e) => {
                    tracing::error!(error = %e, partition = %source, "partition not landed: its table is refused");
                    error.get_or_insert(e);
                }
            }
        }
        (kept, error)
    }

    /// Whether some topic is refused (its table could not be resolved against the catalog).
    pub fn has_refused(&self) -> bool {
        !self.refused.is_empty()
    }

    pub(super) fn check_refused_topic(&self, topic: &str) -> Result<()> {
        match self.refused.get(topic) {
            Some((table, why)) => Err(Error::SchemaRefused {
                table: table.clone(),
                reasons: format!(
                    "{why}; records of topic {topic} wait (the event source mapping retries them) until the spec is fixed and deployed — `streamtable check` shows the plan"
                ),
            }),
            None => Ok(()),
        }
    }

    /// Fails when a planned partition's topic feeds a refused table.
    pub(super) fn check_refused(&self, planned: &[Planned<'_>]) -> Result<()> {
        for p in planned {
            self.check_refused_topic(&p.source.topic)?;
        }
        Ok(())
    }
}
