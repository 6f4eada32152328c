//! The derived tables of a pipeline, planned, with the reference tables they join to.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;

use super::lookup::LookupIndex;
use super::partition_state::{Acc, Adoption, PartitionState, PlanSig, TableState, adopt};
use super::planner::{Plan, plan};
use super::reference::{ReferenceSource, References};
use super::run::evaluate;
use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::spec::{Dedup, PipelineSpec};

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
    /// Source rows later than a window's allowed lateness, with the reason (dead letters of
    /// kind `late`).
    pub late: Vec<(usize, String)>,
    /// Source rows whose event time is too far ahead of their Kafka timestamp for a stateful
    /// table to believe it (dead letters of kind `future`).
    pub future: Vec<(usize, String)>,
    /// Source rows dropped as duplicates by the table's dedup.
    pub deduplicated: u64,
}

pub(super) struct DerivedTable {
    pub name: String,
    pub source: String,
    pub layout: Arc<TableLayout>,
    pub plan: Plan,
    /// Dedup before the SQL, with the key columns' indices in the source's rows.
    pub dedup: Option<(Dedup, Vec<usize>)>,
    /// How long after a window closed a record still corrects it, ms.
    pub lateness_ms: i64,
    /// What the table keeps in a partition's state (recorded with it), and the empty
    /// accumulator of each aggregate.
    pub sig: PlanSig,
    pub fresh: Vec<Acc>,
    /// The lookup index, built for one generation of the reference table's rows.
    index: Mutex<Option<(u64, Arc<LookupIndex>)>>,
}

impl DerivedTable {
    /// Whether the table keeps state per partition (windows, dedup).
    pub fn is_stateful(&self) -> bool {
        self.dedup.is_some() || matches!(self.plan, Plan::Window(_))
    }

    /// Brings a partition's stored state of this table to its plan (see
    /// [`super::partition_state::adopt`]), logging what changed.
    pub fn adopt(&self, partition: i32, state: &mut TableState) -> Adoption {
        let a = adopt(state, &self.sig, &self.fresh);
        if !a.restarted.is_empty() {
            tracing::warn!(table = %self.name, partition, windows_dropped = a.windows_dropped,
                keys_dropped = a.keys_dropped, reasons = %a.restarted.join("; "),
                carried = %a.carried.join("; "),
                "the table's SQL changed: state the new plan cannot read was dropped");
        } else if !a.carried.is_empty() {
            tracing::info!(table = %self.name, partition, windows = a.windows_kept,
                changes = %a.carried.join("; "), "the table's SQL changed: state carried over");
        }
        a
    }
}

/// A source's event time: its column in the source's rows, the out-of-orderness, and how far
/// ahead of its Kafka timestamp an event time is believed, µs.
#[derive(Debug, Clone, Copy)]
pub(super) struct SourceTime {
    pub column: usize,
    pub out_of_orderness_us: i64,
    pub max_ahead_us: i64,
}

/// Every derived table of a pipeline, planned once (at cold start).
pub struct Processor {
    pub(super) tables: Vec<DerivedTable>,
    references: References,
    /// Event time of the sources that have a watermark, by table name.
    pub(super) times: HashMap<String, SourceTime>,
    /// The interval joins (run by the scheduled stage, not here), by table name.
    joins: Vec<(String, crate::spec::IntervalJoin)>,
    /// The source tables planned with their `kafka_headers` column (the spec asks for it).
    headers: HashSet<String>,
    /// What an evaluation may make ([`crate::guard`]).
    pub(super) limits: crate::guard::Limits,
}

impl Processor {
    /// Plans the derived tables of `spec`.
    pub fn new(spec: &PipelineSpec) -> Result<Processor> {
        let mut tables = Vec::with_capacity(spec.derived.len());
        let mut joins = Vec::new();
        for d in &spec.derived {
            let limits = crate::guard::Limits::for_records(spec.settings.max_record_bytes);
            let plan = plan(&spec.tables, &spec.references, &d.sql, limits).map_err(|e| {
                Error::Spec(format!(
                    "{}:{}: derived table {:?}: {}",
                    spec.origin.display(),
                    d.line,
                    d.table.name,
                    e.message
                ))
            })?;
            if let Plan::Join(j) = &plan {
                joins.push((d.table.name.clone(), j.join.clone()));
                continue;
            }
            let dedup = match &d.dedup {
                Some(dd) => {
                    let source = spec.table(&d.source).ok_or_else(|| {
                        Error::Spec(format!(
                            "derived table {}: no table {}",
                            d.table.name, d.source
                        ))
                    })?;
                    let layout = TableLayout::for_table(source)?;
                    let columns = dd
                        .key
                        .iter()
                        .map(|k| {
                            layout.arrow_schema.index_of(k).map_err(|_| {
                                Error::Spec(format!(
                                    "derived table {}: dedup key {k} is not a column of {}",
                                    d.table.name, d.source
                                ))
                            })
                        })
                        .collect::<Result<Vec<usize>>>()?;
                    Some((dd.clone(), columns))
                }
                None => None,
            };
            let dedup_sig: Vec<String> = match (&dedup, spec.table(&d.source)) {
                (Some((dd, _)), Some(source)) => {
                    let layout = TableLayout::for_table(source)?;
                    dd.key
                        .iter()
                        .map(|k| match layout.arrow_schema.field_with_name(k) {
                            Ok(f) => format!("{k} {}", f.data_type()),
                            Err(_) => k.clone(),
                        })
                        .collect()
                }
                _ => Vec::new(),
            };
            let (sig, fresh) = match &plan {
                Plan::Window(w) => (w.sig(dedup_sig), w.aggs.iter().map(Acc::new).collect()),
                _ => (
                    PlanSig {
                        dedup: dedup_sig,
                        ..Default::default()
                    },
                    Vec::new(),
                ),
            };
            tables.push(DerivedTable {
                name: d.table.name.clone(),
                source: d.source.clone(),
                layout: Arc::new(TableLayout::for_table(&d.table)?),
                plan,
                dedup,
                lateness_ms: d.allowed_lateness_ms,
                sig,
                fresh,
                index: Mutex::new(None),
            });
        }
        let mut times = HashMap::new();
        for t in &spec.tables {
            if let Some(et) = &t.event_time {
                let layout = TableLayout::for_table(t)?;
                if let Ok(column) = layout.arrow_schema.index_of(&et.column) {
                    times.insert(
                        t.name.clone(),
                        SourceTime {
                            column,
                            out_of_orderness_us: et.out_of_orderness_ms.saturating_mul(1000),
                            max_ahead_us: et.max_ahead_ms.saturating_mul(1000),
                        },
                    );
                }
            }
        }
        let mut used = Vec::new();
        for r in &spec.references {
            if spec.derived.iter().any(|d| d.references.contains(&r.name)) {
                used.push((r.clone(), Arc::new(TableLayout::for_reference(r)?)));
            }
        }
        let headers = spec
            .tables
            .iter()
            .filter(|t| t.kafka_headers)
            .map(|t| t.name.clone())
            .collect();
        Ok(Processor {
            tables,
            references: References::new(used),
            times,
            joins,
            headers,
            limits: crate::guard::Limits::for_records(spec.settings.max_record_bytes),
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

    /// Each derived table (run here) with the table it is computed from.
    pub fn sources(&self) -> impl Iterator<Item = (&str, &str)> {
        self.tables
            .iter()
            .map(|t| (t.name.as_str(), t.source.as_str()))
    }

    /// Uses `layout` (the catalog's field ids) for the derived table of its name, when it has
    /// the same columns as the planned one; returns whether it did.
    pub fn use_layout(&mut self, layout: &Arc<TableLayout>) -> bool {
        match self.tables.iter_mut().find(|t| t.name == layout.name) {
            Some(t) if t.layout.same_shape(layout) => {
                t.layout = layout.clone();
                true
            }
            _ => false,
        }
    }

    /// How derived table `name` runs, in a few words (for `streamtable check`).
    pub fn describe(&self, name: &str) -> Option<String> {
        if let Some((_, j)) = self.joins.iter().find(|(n, _)| n == name) {
            return Some(format!(
                "stateful, in the scheduled stage: interval join of {} and {} ({}.{} - {}.{} within [{}, {}]), over the rows each commit lands; rows kept while they can still match, state referenced by the table's snapshot, exactly once",
                j.left.table,
                j.right.table,
                j.right.table,
                j.right.time_column,
                j.left.table,
                j.left.time_column,
                super::window::tvf::human(j.lower_us / 1000),
                super::window::tvf::human(j.upper_us / 1000),
            ));
        }
        let t = self.tables.iter().find(|t| t.name == name)?;
        let mut steps = Vec::new();
        if let Some((d, _)) = &t.dedup {
            steps.push(format!(
                "dedup by {} within {}",
                d.key.join(", "),
                super::window::tvf::human(d.within_ms)
            ));
        }
        let p = match &t.plan {
            Plan::Rows(p) => p,
            Plan::Join(_) => return None,
            Plan::Window(w) => {
                steps.push(format!(
                    "{} windows on event time, {} key{}, {} aggregate{}, allowed lateness {}",
                    w.window,
                    w.keys.len(),
                    if w.keys.len() == 1 { "" } else { "s" },
                    w.aggs.len(),
                    if w.aggs.len() == 1 { "" } else { "s" },
                    super::window::tvf::human(t.lateness_ms)
                ));
                return Some(format!(
                    "stateful, per partition in the ingest function: {}; partial rows in {}, merged by the view; state checkpointed with each batch of {}, exactly once",
                    steps.join(", "),
                    t.name,
                    t.source
                ));
            }
        };
        if let Some(l) = &p.lookup {
            steps.push(format!(
                "{} lookup join to reference table {} on {} key{}",
                if l.inner { "inner" } else { "left" },
                l.reference,
                l.source_keys.len(),
                if l.source_keys.len() == 1 { "" } else { "s" }
            ));
        }
        if p.filter.is_some() {
            steps.push("filter".into());
        }
        steps.push(format!("{} columns", p.projection.len()));
        Some(format!(
            "{}, per batch in the ingest function: {}; lands with each batch of {}, exactly once",
            if t.is_stateful() {
                "stateful (dedup keys checkpointed)"
            } else {
                "stateless"
            },
            steps.join(", "),
            t.source
        ))
    }

    /// Adds to `changes` what the current plans would do with `state`, one partition's state of
    /// table `source`'s stateful tables (nothing is changed: `streamtable check`).
    pub fn state_changes(
        &self,
        source: &str,
        state: &PartitionState,
        changes: &mut super::partition_state::StateChanges,
    ) {
        changes.partitions += 1;
        for (name, table_state) in &state.tables {
            match self
                .tables
                .iter()
                .find(|t| &t.name == name && t.source == source && t.is_stateful())
            {
                Some(t) => {
                    let mut copy = table_state.clone();
                    changes.add(name, &adopt(&mut copy, &t.sig, &t.fresh));
                }
                None => changes.add_unknown(name),
            }
        }
    }

    /// The dedup bound of derived table `table`, µs (`None`: no such table, or no dedup).
    pub fn dedup_within_us(&self, table: &str) -> Option<u64> {
        self.tables
            .iter()
            .find(|t| t.name == table)
            .and_then(|t| t.dedup.as_ref())
            .map(|(d, _)| d.within_ms.saturating_mul(1000).unsigned_abs())
    }

    /// Whether derived tables fed by table `source` keep state per partition.
    pub fn is_stateful(&self, source: &str) -> bool {
        self.tables
            .iter()
            .any(|t| t.source == source && t.is_stateful())
    }

    /// Reads the reference tables not read yet, and those due for a refresh.
    pub async fn refresh(&self, now_ms: i64) -> Result<()> {
        self.references.refresh(now_ms).await
    }

    /// Runs every derived table fed by table `source` on `rows` (rows of `source`'s layout, each
    /// partition's in offset order), with the state of its partitions in `states` (updated;
    /// untouched when no table of `source` is stateful). `now_ms` stamps the states.
    pub fn derive(
        &self,
        source: &str,
        rows: &RecordBatch,
        states: &mut BTreeMap<i32, PartitionState>,
        now_ms: i64,
    ) -> Result<Vec<Derived>> {
        // A table that kept `kafka_headers` after its spec stopped asking for them has the
        // column in its rows, which the SQL was not planned with.
        let without_headers;
        let rows = match rows.schema().index_of(crate::kafka::HEADERS) {
            Ok(i) if !self.headers.contains(source) => {
                let mut r = rows.clone();
                r.remove_column(i);
                without_headers = r;
                &without_headers
            }
            _ => rows,
        };
        let mut out = Vec::new();
        for t in self
            .tables
            .iter()
            .filter(|t| t.source == source && !t.is_stateful())
        {
            let e = self.evaluate_rows(t, rows)?;
            out.push(Derived {
                table: t.name.clone(),
                layout: t.layout.clone(),
                rows: e.rows,
                failures: e.failures,
                late: Vec::new(),
                future: Vec::new(),
                deduplicated: 0,
            });
        }
        if self.is_stateful(source) {
            out.extend(self.derive_stateful(source, rows, states, now_ms)?);
        }
        Ok(out)
    }

    /// A row-by-row table (projection, filter, lookup) on `rows`.
    pub(super) fn evaluate_rows(
        &self,
        t: &DerivedTable,
        rows: &RecordBatch,
    ) -> Result<super::run::Evaluated> {
        let Plan::Rows(plan) = &t.plan else {
            return Err(Error::Internal(format!(
                "{} is not a row-by-row table",
                t.name
            )));
        };
        let index = match &plan.lookup {
            Some(lookup) => Some(self.index(t, &lookup.reference)?),
            None => None,
        };
        Ok(evaluate(
            plan,
            &t.layout,
            rows,
            index.as_deref(),
            self.limits,
        ))
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
        let Plan::Rows(plan) = &t.plan else {
            return Err(Error::Internal(format!("{} has no lookup", t.name)));
        };
        let lookup = plan
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
