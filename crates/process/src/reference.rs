//! Reference tables: Iceberg tables in the pipeline's catalog that analysts maintain (with
//! Athena or any engine), read whole into memory at cold start and re-read when their
//! `refresh_seconds` have passed and the table has a new snapshot.
//!
//! A reference table that does not exist yet is empty (a LEFT JOIN yields NULLs, an INNER JOIN
//! no row) and a warning is logged. A failed first read fails the invocation (the batch is
//! retried); a failed refresh keeps the copy already loaded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::df::arrow::array::RecordBatch;
use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::spec::ReferenceSpec;

/// What reading a reference table found.
pub enum Loaded {
    /// The table does not exist.
    Missing,
    /// The table is at the version already loaded.
    Unchanged,
    /// The table's rows (in the declared columns' types) at `version`.
    Rows {
        /// The version read (the table's metadata location).
        version: String,
        /// Every row.
        rows: RecordBatch,
    },
}

/// Where reference tables are read from.
#[async_trait]
pub trait ReferenceSource: Send + Sync {
    /// Reads reference table `spec`, unless it is still at version `known`.
    async fn load(
        &self,
        spec: &ReferenceSpec,
        layout: &TableLayout,
        known: Option<&str>,
    ) -> Result<Loaded>;
}

/// The reference schema with every column nullable: a table maintained elsewhere may hold
/// NULLs where the spec says `required`, and a lookup must not fail on them.
pub fn nullable(layout: &TableLayout) -> crate::df::arrow::datatypes::SchemaRef {
    let fields: Vec<_> = layout
        .arrow_schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(crate::df::arrow::datatypes::Schema::new(fields))
}

struct Cached {
    version: Option<String>,
    rows: Arc<RecordBatch>,
    generation: u64,
    checked_at_ms: i64,
}

/// The loaded copies of the reference tables a pipeline's derived tables join to.
pub(crate) struct References {
    specs: Vec<(ReferenceSpec, Arc<TableLayout>)>,
    source: Option<Arc<dyn ReferenceSource>>,
    cache: Mutex<HashMap<String, Cached>>,
    generations: std::sync::atomic::AtomicU64,
}

impl References {
    pub fn new(specs: Vec<(ReferenceSpec, Arc<TableLayout>)>) -> Self {
        References {
            specs,
            source: None,
            cache: Mutex::new(HashMap::new()),
            generations: std::sync::atomic::AtomicU64::new(1),
        }
    }

    pub fn set_source(&mut self, source: Arc<dyn ReferenceSource>) {
        self.source = Some(source);
    }

    /// Reads every reference table not read yet, and re-reads those whose refresh interval has
    /// passed.
    pub async fn refresh(&self, now_ms: i64) -> Result<()> {
        for (spec, layout) in &self.specs {
            let known = {
                let cache = self.cache.lock().map_err(|_| poisoned())?;
                match cache.get(&spec.name) {
                    Some(c) if now_ms - c.checked_at_ms < spec.refresh_seconds as i64 * 1000 => {
                        continue;
                    }
                    Some(c) => Some(c.version.clone()),
                    None => None,
                }
            };
            let Some(source) = &self.source else {
                return Err(Error::Config(format!(
                    "reference table {} cannot be read: this ingestor has no catalog",
                    spec.name
                )));
            };
            let loaded = source
                .load(spec, layout, known.as_ref().and_then(|v| v.as_deref()))
                .await;
            let mut cache = self.cache.lock().map_err(|_| poisoned())?;
            let generation = self
                .generations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match loaded {
                Ok(Loaded::Unchanged) => {
                    if let Some(c) = cache.get_mut(&spec.name) {
                        c.checked_at_ms = now_ms;
                    }
                }
                Ok(Loaded::Missing) => {
                    if known.as_ref().is_none_or(|v| v.is_some()) {
                        tracing::warn!(table = %spec.name,
                            "reference table does not exist yet; lookups into it find nothing until it is created (`streamtable scheduled`, the scheduled function, creates it empty; fill it with Athena's INSERT INTO)");
                    }
                    let empty = RecordBatch::new_empty(nullable(layout));
                    cache.insert(
                        spec.name.clone(),
                        Cached {
                            version: None,
                            rows: Arc::new(empty),
                            generation,
                            checked_at_ms: now_ms,
                        },
                    );
                }
                Ok(Loaded::Rows { version, rows }) => {
                    tracing::info!(table = %spec.name, rows = rows.num_rows(), "reference table loaded");
                    cache.insert(
                        spec.name.clone(),
                        Cached {
                            version: Some(version),
                            rows: Arc::new(rows),
                            generation,
                            checked_at_ms: now_ms,
                        },
                    );
                }
                Err(e) if known.is_some() => {
                    tracing::warn!(table = %spec.name, error = %e,
                        "reference table could not be re-read; the loaded copy stays in use");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The loaded rows of `name` and their generation (which changes with every new copy).
    pub fn get(&self, name: &str) -> Option<(u64, Arc<RecordBatch>)> {
        let cache = self.cache.lock().ok()?;
        cache.get(name).map(|c| (c.generation, c.rows.clone()))
    }
}

fn poisoned() -> Error {
    Error::Internal("reference table cache poisoned".into())
}
