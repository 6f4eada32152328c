//! Event-time windows: tumbling and hopping windows grouped by keys, run per Kafka partition
//! with their accumulators in the partition's state.
//!
//! Semantics (Flink SQL's window TVFs): windows are [start, end); a partition's watermark is the
//! highest event time it has seen minus the table's out-of-orderness; when it passes a window's
//! end, the partition emits its **partial row** for that window and key and forgets it. A later
//! record of that window, while the watermark has not passed the window's end plus the allowed
//! lateness, is emitted as a **correction** (a partial row of its own). A record later than
//! that is a dead letter of kind `late` naming the window and the watermark. Whether a record
//! is late depends only on the records before it in its partition, so re-deliveries and other
//! batch boundaries give the same answer.
//!
//! Partial rows of every partition and every correction add up: the view registered under the
//! derived table's name (`SUM` of counts and sums, `MIN`/`MAX`, `SUM(sum)/SUM(count)`) is one
//! row per window and key with the exact totals (and, for `approx_distinct`, the estimate of the
//! union of every partial row's sketch).

mod acc;
pub(crate) mod aggregate;
pub(crate) mod plan;
mod run;
mod session;
pub(crate) mod tvf;

pub(crate) use aggregate::Aggregate;
pub(crate) use run::{PartitionInput, run};
pub(crate) use tvf::WindowKind;

use std::sync::Arc;

use crate::df::arrow::datatypes::{DataType, SchemaRef};
use crate::df::physical_expr::PhysicalExpr;

use crate::spec::ColumnType;

/// One aggregate of a window.
pub(crate) struct AggPlan {
    pub func: &'static dyn Aggregate,
    /// The argument (`None`: `count(*)`).
    pub arg: Option<Arc<dyn PhysicalExpr>>,
    /// The argument's type.
    pub arg_type: DataType,
    /// The aggregate's type in SQL.
    pub result: DataType,
    /// What it computes, as planned (`sum(t.amount) of Int64`): how its stored accumulator is
    /// recognised when the SQL changes.
    pub text: String,
}

/// Where an output column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    WindowStart,
    WindowEnd,
    /// A `GROUP BY` key (index into [`WindowPlan::keys`]).
    Key(usize),
    /// An aggregate (index into [`WindowPlan::aggs`]).
    Agg(usize),
}

/// A windowed derived table, planned.
pub(crate) struct WindowPlan {
    /// The topic's table it reads.
    pub source: String,
    pub window: WindowKind,
    /// The source's columns, then `window_start` and `window_end` (NULL while evaluating).
    pub input_schema: SchemaRef,
    pub filter: Option<Arc<dyn PhysicalExpr>>,
    /// `GROUP BY` expressions besides the window.
    pub keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The same, as planned (`t.country`).
    pub key_names: Vec<String>,
    /// The `WHERE`, as planned.
    pub filter_text: Option<String>,
    pub aggs: Vec<AggPlan>,
    /// The output columns: name, source, type.
    pub outputs: Vec<(String, Output, ColumnType)>,
}

/// The suffix of the partial column holding an `approx_distinct`'s sketch (base64 of the
/// layout Athena casts to `HyperLogLog`).
pub const SKETCH_SUFFIX: &str = "__hll";

/// Which engine a view's SQL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewDialect {
    /// `streamtable query` (DataFusion, with [`crate::sketch::MERGE_SKETCHES`] registered).
    DataFusion,
    /// Athena (Trino): sketches merge with `merge(CAST(… AS HyperLogLog))`.
    Athena,
}

/// The Trino type Athena reads a column of `t` as (Iceberg timestamps are microseconds).
pub(crate) fn trino_type(t: ColumnType) -> String {
    match t {
        ColumnType::String => "varchar".into(),
        ColumnType::Int => "integer".into(),
        ColumnType::Long => "bigint".into(),
        ColumnType::Float => "real".into(),
        ColumnType::Double => "double".into(),
        ColumnType::Boolean => "boolean".into(),
        ColumnType::Date => "date".into(),
        ColumnType::Timestamp => "timestamp(6)".into(),
        ColumnType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
        // Window outputs are primitive; a struct's Trino type needs its fields.
        ColumnType::Struct => "row()".into(),
    }
}

impl WindowPlan {
    /// What this plan keeps in a partition's state, as recorded with it (`dedup`: the dedup
    /// key's part, if any).
    pub(crate) fn sig(&self, dedup: Vec<String>) -> crate::partition_state::PlanSig {
        let names = (0..self.aggs.len())
            .map(|i| {
                self.outputs
                    .iter()
                    .find(|(_, o, _)| *o == Output::Agg(i))
                    .map(|(n, _, _)| n.clone())
                    .unwrap_or_default()
            })
            .collect();
        crate::partition_state::PlanSig {
            window: Some(self.window.sig()),
            keys: self.key_names.clone(),
            aggs: self.aggs.iter().map(|a| a.text.clone()).collect(),
            names,
            filter: self.filter_text.clone(),
            dedup,
        }
    }

    /// The columns of the partial rows, in order.
    pub fn partial_columns(&self) -> Result<Vec<(String, ColumnType)>, String> {
        let mut out = Vec::new();
        for (name, o, ty) in &self.outputs {
            match o {
                Output::Agg(i) => {
                    let agg = &self.aggs[*i];
                    if let Some(why) = agg.func.unstorable(&agg.result) {
                        return Err(format!("{name}: {why}"));
                    }
                    out.extend(agg.func.partial_columns(name, *ty));
                }
                _ => out.push((name.clone(), *ty)),
            }
        }
        Ok(out)
    }

    /// The view's columns with the types Athena (Trino) gives them: what a Glue view declares.
    pub fn view_columns(&self) -> Vec<(String, String)> {
        self.outputs
            .iter()
            .map(|(name, o, ty)| {
                let t = match o {
                    Output::WindowStart | Output::WindowEnd => trino_type(ColumnType::Timestamp),
                    Output::Key(_) => trino_type(*ty),
                    Output::Agg(i) => self.aggs[*i].func.view_type(*ty),
                };
                (name.clone(), t)
            })
            .collect()
    }

    /// The view that merges the partial rows of the table named
    /// [`crate::PARTIALS_PLACEHOLDER`] into one row per window and key, in `dialect`
    /// (they differ only in how sketches merge).
    pub fn view_sql(&self, dialect: ViewDialect) -> String {
        let q = |n: &str| format!("\"{n}\"");
        let mut select = Vec::new();
        let mut group = Vec::new();
        for (name, o, _) in &self.outputs {
            match o {
                Output::Agg(i) => select.push(self.aggs[*i].func.merge_sql(name, dialect)),
                _ => {
                    select.push(q(name));
                    group.push(q(name));
                }
            }
        }
        format!(
            "SELECT {} FROM {} GROUP BY {}",
            select.join(", "),
            crate::PARTIALS_PLACEHOLDER,
            group.join(", ")
        )
    }
}

#[cfg(test)]
mod tests;
