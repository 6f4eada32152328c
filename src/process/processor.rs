//! The derived tables of a pipeline, planned, with the reference tables they join to.

use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;

use super::lookup::LookupIndex;
use super::plan::{SqlPlan, plan};
use super::reference::{ReferenceSource, References};
use super::run::evaluate;
use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::spec::PipelineSpec;

/// What one derived table got from a batch of its source's rows.
pub struct Derived {
    /// The derived table.
    pub table: String,
    /// Its layout.
    pub layout: Arc<TableLayout>,
    /// Its rows (`None`: the batch gave it none).
    pub rows: Option<RecordBatch>,
    /// Source rows (indices into the batch) that failed its SQL, with the reason.
    pub failures: Vec<(usize, String)>,
}

struct DerivedTable {
    name: String,
    source: String,
    layout: Arc<TableLayout>,
    plan: SqlPlan,
    /// The lookup index, built for one generation of the reference table's rows.
    index: Mutex<Option<(u64, Arc<LookupIndex>)>>,
}

/// Every derived table of a pipeline, planned once (at cold start).
pub struct Processor {
    tables: Vec<DerivedTable>,
    references: References,
}

impl Processor {
    /// Plans the derived tables of `spec`.
    pub fn new(spec: &PipelineSpec) -> Result<Processor> {
        let mut tables = Vec::with_capacity(spec.derived.len());
        for d in &spec.derived {
            let plan = plan(&spec.tables, &spec.references, &d.sql).map_err(|e| {
                Error::Spec(format!(
                    "{}:{}: derived table {:?}: {}",
                    spec.origin.display(),
                    d.line,
                    d.table.name,
                    e.message
                ))
            })?;
            tables.push(DerivedTable {
                name: d.table.name.clone(),
                source: d.source.clone(),
                layout: Arc::new(TableLayout::for_table(&d.table)?),
                plan,
                index: Mutex::new(None),
            });
        }
        let mut used = Vec::new();
        for r in &spec.references {
            if spec.derived.iter().any(|d| d.references.contains(&r.name)) {
                used.push((r.clone(), Arc::new(TableLayout::for_reference(r)?)));
            }
        }
        Ok(Processor {
            tables,
            references: References::new(used),
        })
    }

    /// Reads reference tables from `source`.
    pub fn with_reference_source(mut self, source: Arc<dyn ReferenceSource>) -> Processor {
        self.references.set_source(source);
        self
    }

    /// The layouts of the derived tables.
    pub fn layouts(&self) -> impl Iterator<Item = &Arc<TableLayout>> {
        self.tables.iter().map(|t| &t.layout)
    }

    /// How derived table `name` runs, in a few words (for `streamtable check`).
    pub fn describe(&self, name: &str) -> Option<String> {
        let t = self.tables.iter().find(|t| t.name == name)?;
        let mut steps = Vec::new();
        if let Some(l) = &t.plan.lookup {
            steps.push(format!(
                "{} lookup join to reference table {} on {} key{}",
                if l.inner { "inner" } else { "left" },
                l.reference,
                l.source_keys.len(),
                if l.source_keys.len() == 1 { "" } else { "s" }
            ));
        }
        if t.plan.filter.is_some() {
            steps.push("filter".into());
        }
        steps.push(format!("{} columns", t.plan.projection.len()));
        Some(format!(
            "stateless, per batch in the ingest function: {}; lands with each batch of {}, exactly once",
            steps.join(", "),
            t.source
        ))
    }

    /// Reads the reference tables not read yet, and those due for a refresh.
    pub async fn refresh(&self, now_ms: i64) -> Result<()> {
        self.references.refresh(now_ms).await
    }

    /// Runs every derived table fed by table `source` on `rows` (rows of `source`'s layout).
    pub fn derive(&self, source: &str, rows: &RecordBatch) -> Result<Vec<Derived>> {
        let mut out = Vec::new();
        for t in self.tables.iter().filter(|t| t.source == source) {
            let index = match &t.plan.lookup {
                Some(lookup) => Some(self.index(t, &lookup.reference)?),
                None => None,
            };
            let e = evaluate(&t.plan, &t.layout, rows, index.as_deref());
            out.push(Derived {
                table: t.name.clone(),
                layout: t.layout.clone(),
                rows: e.rows,
                failures: e.failures,
            });
        }
        Ok(out)
    }

    fn index(&self, t: &DerivedTable, reference: &str) -> Result<Arc<LookupIndex>> {
        let (generation, rows) = self.references.get(reference).ok_or_else(|| {
            Error::Internal(format!(
                "reference table {reference} was not loaded before derived table {} ran",
                t.name
            ))
        })?;
        let mut slot = t
            .index
            .lock()
            .map_err(|_| Error::Internal("lookup index poisoned".into()))?;
        if let Some((g, index)) = slot.as_ref()
            && *g == generation
        {
            return Ok(index.clone());
        }
        let lookup = t
            .plan
            .lookup
            .as_ref()
            .ok_or_else(|| Error::Internal(format!("{} has no lookup", t.name)))?;
        let index = Arc::new(
            LookupIndex::build(lookup, rows.as_ref().clone()).map_err(|e| {
                Error::Config(format!(
                    "derived table {}: cannot index reference table {reference}: {e}",
                    t.name
                ))
            })?,
        );
        *slot = Some((generation, index.clone()));
        Ok(index)
    }
}
