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
pub(crate) mod plan;
mod run;
mod session;
pub(crate) mod tvf;

pub(crate) use run::{PartitionInput, run};
pub(crate) use tvf::WindowKind;

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::physical_expr::PhysicalExpr;

use super::plan::column_type;
use crate::process::sketch::MERGE_SKETCHES;
use crate::spec::ColumnType;

/// An aggregate function a window computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AggFn {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    /// `approx_distinct`: a HyperLogLog sketch per partial row, merged by the view.
    ApproxDistinct,
}

impl AggFn {
    /// The name recorded in a state's plan (stable across releases).
    pub(crate) fn sig_name(self) -> &'static str {
        match self {
            AggFn::Count => "count",
            AggFn::Sum => "sum",
            AggFn::Min => "min",
            AggFn::Max => "max",
            AggFn::Avg => "avg",
            AggFn::ApproxDistinct => "approx_distinct",
        }
    }
}

/// One aggregate of a window.
pub(crate) struct AggPlan {
    pub func: AggFn,
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
    /// `streamtable query` (DataFusion, with [`MERGE_SKETCHES`] registered).
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

/// The columns one output contributes to a partial row.
fn partial_of(
    name: &str,
    out: Output,
    ty: ColumnType,
    plan: &WindowPlan,
) -> Vec<(String, ColumnType)> {
    match out {
        Output::Agg(i) if plan.aggs[i].func == AggFn::Avg => vec![
            (format!("{name}__sum"), ColumnType::Double),
            (format!("{name}__count"), ColumnType::Long),
        ],
        Output::Agg(i) if plan.aggs[i].func == AggFn::Count => {
            vec![(name.to_string(), ColumnType::Long)]
        }
        Output::Agg(i) if plan.aggs[i].func == AggFn::ApproxDistinct => {
            vec![(format!("{name}{SKETCH_SUFFIX}"), ColumnType::String)]
        }
        _ => vec![(name.to_string(), ty)],
    }
}

impl WindowPlan {
    /// What this plan keeps in a partition's state, as recorded with it (`dedup`: the dedup
    /// key's part, if any).
    pub(crate) fn sig(&self, dedup: Vec<String>) -> crate::process::state::PlanSig {
        let names = (0..self.aggs.len())
            .map(|i| {
                self.outputs
                    .iter()
                    .find(|(_, o, _)| *o == Output::Agg(i))
                    .map(|(n, _, _)| n.clone())
                    .unwrap_or_default()
            })
            .collect();
        crate::process::state::PlanSig {
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
            if let Output::Agg(i) = o
                && matches!(self.aggs[*i].func, AggFn::Sum | AggFn::Min | AggFn::Max)
                && column_type(&self.aggs[*i].result).is_none()
            {
                return Err(format!(
                    "{name}: a {} cannot be stored",
                    self.aggs[*i].result
                ));
            }
            out.extend(partial_of(name, *o, *ty, self));
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
                    Output::Agg(i) => match (self.aggs[*i].func, ty) {
                        (AggFn::Count | AggFn::ApproxDistinct, _) => "bigint".into(),
                        (AggFn::Avg, _) => "double".into(),
                        (AggFn::Sum, ColumnType::Decimal { scale, .. }) => {
                            format!("decimal(38,{scale})")
                        }
                        (AggFn::Sum, ColumnType::Int | ColumnType::Long) => "bigint".into(),
                        (AggFn::Sum, _) => "double".into(),
                        (AggFn::Min | AggFn::Max, t) => trino_type(*t),
                    },
                };
                (name.clone(), t)
            })
            .collect()
    }

    /// The view that merges the partial rows of the table named
    /// [`crate::process::PARTIALS_PLACEHOLDER`] into one row per window and key, in `dialect`
    /// (they differ only in how sketches merge).
    pub fn view_sql(&self, dialect: ViewDialect) -> String {
        let q = |n: &str| format!("\"{n}\"");
        let mut select = Vec::new();
        let mut group = Vec::new();
        for (name, o, _) in &self.outputs {
            match o {
                Output::Agg(i) => select.push(match self.aggs[*i].func {
                    AggFn::Count | AggFn::Sum => format!("SUM({}) AS {}", q(name), q(name)),
                    AggFn::Min => format!("MIN({}) AS {}", q(name), q(name)),
                    AggFn::Max => format!("MAX({}) AS {}", q(name), q(name)),
                    AggFn::Avg => format!(
                        "SUM({}) / SUM({}) AS {}",
                        q(&format!("{name}__sum")),
                        q(&format!("{name}__count")),
                        q(name)
                    ),
                    AggFn::ApproxDistinct => {
                        let sketch = q(&format!("{name}{SKETCH_SUFFIX}"));
                        match dialect {
                            ViewDialect::DataFusion => {
                                format!("{MERGE_SKETCHES}({sketch}) AS {}", q(name))
                            }
                            ViewDialect::Athena => format!(
                                "cardinality(merge(CAST(from_base64({sketch}) AS HyperLogLog))) AS {}",
                                q(name)
                            ),
                        }
                    }
                }),
                _ => {
                    select.push(q(name));
                    group.push(q(name));
                }
            }
        }
        format!(
            "SELECT {} FROM {} GROUP BY {}",
            select.join(", "),
            crate::process::PARTIALS_PLACEHOLDER,
            group.join(", ")
        )
    }
}

#[cfg(test)]
mod tests;
