//! The aggregates a window computes, each defined in one place (in the spirit of DataFusion's
//! `AggregateUDFImpl`): the names SQL calls it by, the accumulator it keeps per open window and
//! how a value or another window's accumulator is added to it, the partial columns it writes,
//! and how the view adds partial rows up in each engine's SQL. Every aggregate is decomposable:
//! adding partial rows gives the exact answer in any order and grouping (for `approx_distinct`,
//! the union of sketches).
//!
//! A new aggregate is one more implementation of [`Aggregate`], listed in [`AGGREGATES`], and,
//! if none of the stored accumulators fits it, a variant of [`Acc`] (the stored form, which
//! releases read from each other's state).

use crate::df::arrow::datatypes::DataType;

use super::{AggPlan, SKETCH_SUFFIX, ViewDialect, trino_type};
use crate::partition_state::Acc;
use crate::sketch::{MERGE_SKETCHES, Sketch};
use crate::spec::ColumnType;
use crate::value::Value;

/// One aggregate function of a window.
pub(crate) trait Aggregate: Sync {
    /// The names SQL calls it by, in lower case; the first is its name in a state's plan
    /// (stable across releases).
    fn names(&self) -> &'static [&'static str];

    /// Whether it takes numbers only (a sum, an average).
    fn numeric(&self) -> bool {
        false
    }

    /// Whether it counts rows, so that `count(1)` is `count(*)`.
    fn counts_rows(&self) -> bool {
        false
    }

    /// The column type of its output, given the planner's (`None`: the table cannot hold it).
    fn output_type(&self, planned: Option<ColumnType>) -> Option<ColumnType> {
        planned
    }

    /// The accumulator of a window that has seen no value, for arguments of `arg_type`.
    fn empty(&self, arg_type: &DataType) -> Acc;

    /// `acc` after one more value (`None` for `count(*)`), `Ok(None)` when it does not change,
    /// or why the value cannot be added (a sum that would leave its type's range).
    fn update(
        &self,
        acc: &Acc,
        value: Option<&Value>,
        plan: &AggPlan,
    ) -> Result<Option<Acc>, String>;

    /// The accumulator of two windows merged into one (sessions that an event joins).
    fn merge(&self, a: &Acc, b: &Acc, plan: &AggPlan) -> Result<Acc, String>;

    /// The partial columns output `name` (of type `ty`) writes.
    fn partial_columns(&self, name: &str, ty: ColumnType) -> Vec<(String, ColumnType)> {
        vec![(name.to_string(), ty)]
    }

    /// The cells of `acc` in its partial columns, in order.
    fn partial(&self, acc: &Acc) -> Vec<Value>;

    /// The view's expression adding up the partial columns of output `name`, in `dialect`.
    fn merge_sql(&self, name: &str, dialect: ViewDialect) -> String;

    /// The Trino type of the view's column for output of type `ty`.
    fn view_type(&self, ty: ColumnType) -> String;

    /// Why a result of `result` cannot be kept in a partial column, if so.
    fn unstorable(&self, _result: &DataType) -> Option<String> {
        None
    }
}

/// Every aggregate a window computes.
pub(crate) const AGGREGATES: [&dyn Aggregate; 6] = [&Count, &Sum, &MIN, &MAX, &Avg, &Distinct];

/// The aggregate SQL calls `name` (lower case), if a window computes it.
pub(crate) fn by_name(name: &str) -> Option<&'static dyn Aggregate> {
    AGGREGATES.into_iter().find(|a| a.names().contains(&name))
}

/// `count, sum, … or approx_distinct`: what a window computes, for messages.
pub(crate) fn listed() -> String {
    let names: Vec<&str> = AGGREGATES.iter().map(|a| a.names()[0]).collect();
    match names.split_last() {
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

fn q(name: &str) -> String {
    format!("\"{name}\"")
}

fn mismatch(acc: &Acc, value: Option<&Value>) -> String {
    format!("{acc:?} cannot take {value:?}")
}

struct Count;

impl Aggregate for Count {
    fn names(&self) -> &'static [&'static str] {
        &["count"]
    }
    fn counts_rows(&self) -> bool {
        true
    }
    fn empty(&self, _: &DataType) -> Acc {
        Acc::Count(0)
    }
    fn update(&self, acc: &Acc, value: Option<&Value>, _: &AggPlan) -> Result<Option<Acc>, String> {
        match (acc, value) {
            (_, Some(Value::Null)) => Ok(None),
            (Acc::Count(n), _) => Ok(Some(Acc::Count(n.saturating_add(1)))),
            (acc, v) => Err(mismatch(acc, v)),
        }
    }
    fn merge(&self, a: &Acc, b: &Acc, _: &AggPlan) -> Result<Acc, String> {
        match (a, b) {
            (Acc::Count(a), Acc::Count(b)) => Ok(Acc::Count(a.saturating_add(*b))),
            (a, b) => Err(format!("{a:?} cannot merge with {b:?}")),
        }
    }
    fn partial_columns(&self, name: &str, _: ColumnType) -> Vec<(String, ColumnType)> {
        vec![(name.to_string(), ColumnType::Long)]
    }
    fn partial(&self, acc: &Acc) -> Vec<Value> {
        match acc {
            Acc::Count(n) => vec![Value::Int(*n)],
            _ => vec![Value::Null],
        }
    }
    fn merge_sql(&self, name: &str, _: ViewDialect) -> String {
        format!("SUM({}) AS {}", q(name), q(name))
    }
    fn view_type(&self, _: ColumnType) -> String {
        "bigint".into()
    }
}

struct Sum;

/// The largest magnitude a sum of type `t` holds.
fn bound(t: &DataType) -> i128 {
    match t {
        DataType::Decimal128(p, _) => 10i128.pow(u32::from(*p).min(38)) - 1,
        DataType::Int32 => i32::MAX.into(),
        _ => i64::MAX.into(),
    }
}

fn add(s: Option<i128>, v: i128, plan: &AggPlan) -> Result<i128, String> {
    let b = bound(&plan.result);
    s.unwrap_or(0)
        .checked_add(v)
        .filter(|r| r.abs() <= b)
        .ok_or_else(|| format!("the sum leaves the range of {}", plan.result))
}

fn add_floats(a: u64, b: u64) -> u64 {
    (f64::from_bits(a) + f64::from_bits(b)).to_bits()
}

/// A result type a partial column cannot hold (sums, minimums and maximums keep the SQL's).
fn unstorable(result: &DataType) -> Option<String> {
    crate::planner::column_type(result)
        .is_none()
        .then(|| format!("a {result} cannot be stored"))
}

impl Aggregate for Sum {
    fn names(&self) -> &'static [&'static str] {
        &["sum"]
    }
    fn numeric(&self) -> bool {
        true
    }
    fn empty(&self, arg_type: &DataType) -> Acc {
        if matches!(arg_type, DataType::Float32 | DataType::Float64) {
            Acc::SumFloat(None)
        } else {
            Acc::SumInt(None)
        }
    }
    fn update(
        &self,
        acc: &Acc,
        value: Option<&Value>,
        plan: &AggPlan,
    ) -> Result<Option<Acc>, String> {
        Ok(Some(match (acc, value) {
            (_, Some(Value::Null)) => return Ok(None),
            (Acc::SumInt(s), Some(Value::Int(v))) => {
                Acc::SumInt(Some(add(*s, i128::from(*v), plan)?))
            }
            (Acc::SumInt(s), Some(Value::Dec(v))) => Acc::SumInt(Some(add(*s, *v, plan)?)),
            (Acc::SumFloat(s), Some(Value::Float(v))) => {
                Acc::SumFloat(Some(add_floats(s.unwrap_or(0.0f64.to_bits()), *v)))
            }
            (acc, v) => return Err(mismatch(acc, v)),
        }))
    }
    fn merge(&self, a: &Acc, b: &Acc, plan: &AggPlan) -> Result<Acc, String> {
        Ok(match (a, b) {
            (Acc::SumInt(Some(a)), Acc::SumInt(Some(b))) => {
                Acc::SumInt(Some(add(Some(*a), *b, plan)?))
            }
            (Acc::SumInt(a), Acc::SumInt(b)) => Acc::SumInt(a.or(*b)),
            (Acc::SumFloat(Some(a)), Acc::SumFloat(Some(b))) => {
                Acc::SumFloat(Some(add_floats(*a, *b)))
            }
            (Acc::SumFloat(a), Acc::SumFloat(b)) => Acc::SumFloat(a.or(*b)),
            (a, b) => return Err(format!("{a:?} cannot merge with {b:?}")),
        })
    }
    fn partial(&self, acc: &Acc) -> Vec<Value> {
        match acc {
            Acc::SumInt(s) => vec![s.map_or(Value::Null, Value::Dec)],
            Acc::SumFloat(s) => vec![s.map_or(Value::Null, Value::Float)],
            _ => vec![Value::Null],
        }
    }
    fn merge_sql(&self, name: &str, _: ViewDialect) -> String {
        format!("SUM({}) AS {}", q(name), q(name))
    }
    fn view_type(&self, ty: ColumnType) -> String {
        match ty {
            ColumnType::Decimal { scale, .. } => format!("decimal(38,{scale})"),
            ColumnType::Int | ColumnType::Long => "bigint".into(),
            _ => "double".into(),
        }
    }
    fn unstorable(&self, result: &DataType) -> Option<String> {
        unstorable(result)
    }
}

/// `min` and `max`: the least or greatest value so far.
struct Extreme {
    names: &'static [&'static str],
    /// How a new value must compare to the kept one to replace it.
    wins: std::cmp::Ordering,
}

const MIN: Extreme = Extreme {
    names: &["min"],
    wins: std::cmp::Ordering::Less,
};

const MAX: Extreme = Extreme {
    names: &["max"],
    wins: std::cmp::Ordering::Greater,
};

impl Extreme {
    fn wrap(&self, v: Value) -> Acc {
        match self.wins {
            std::cmp::Ordering::Less => Acc::Min(v),
            _ => Acc::Max(v),
        }
    }

    fn kept<'a>(&self, acc: &'a Acc) -> Option<&'a Value> {
        match (acc, self.wins) {
            (Acc::Min(v), std::cmp::Ordering::Less) => Some(v),
            (Acc::Max(v), std::cmp::Ordering::Greater) => Some(v),
            _ => None,
        }
    }
}

impl Aggregate for Extreme {
    fn names(&self) -> &'static [&'static str] {
        self.names
    }
    fn empty(&self, _: &DataType) -> Acc {
        self.wrap(Value::Null)
    }
    fn update(&self, acc: &Acc, value: Option<&Value>, _: &AggPlan) -> Result<Option<Acc>, String> {
        match (self.kept(acc), value) {
            (_, Some(Value::Null)) => Ok(None),
            (Some(m), Some(v)) if *m == Value::Null || v.compare(m) == self.wins => {
                Ok(Some(self.wrap(v.clone())))
            }
            (Some(_), Some(_)) => Ok(None),
            _ => Err(mismatch(acc, value)),
        }
    }
    fn merge(&self, a: &Acc, b: &Acc, _: &AggPlan) -> Result<Acc, String> {
        match (self.kept(a), self.kept(b)) {
            (Some(x), Some(y)) => Ok(self.wrap(
                if *x == Value::Null || (*y != Value::Null && y.compare(x) == self.wins) {
                    y.clone()
                } else {
                    x.clone()
                },
            )),
            _ => Err(format!("{a:?} cannot merge with {b:?}")),
        }
    }
    fn partial(&self, acc: &Acc) -> Vec<Value> {
        vec![self.kept(acc).cloned().unwrap_or(Value::Null)]
    }
    fn merge_sql(&self, name: &str, _: ViewDialect) -> String {
        let f = self.names[0].to_ascii_uppercase();
        format!("{f}({}) AS {}", q(name), q(name))
    }
    fn view_type(&self, ty: ColumnType) -> String {
        trino_type(ty)
    }
    fn unstorable(&self, result: &DataType) -> Option<String> {
        unstorable(result)
    }
}

/// `avg`: a sum and a count, divided by the view.
struct Avg;

impl Aggregate for Avg {
    fn names(&self) -> &'static [&'static str] {
        &["avg", "mean"]
    }
    fn numeric(&self) -> bool {
        true
    }
    fn empty(&self, _: &DataType) -> Acc {
        Acc::Avg { sum: 0, count: 0 }
    }
    fn update(
        &self,
        acc: &Acc,
        value: Option<&Value>,
        plan: &AggPlan,
    ) -> Result<Option<Acc>, String> {
        match (acc, value) {
            (_, Some(Value::Null)) => Ok(None),
            (Acc::Avg { sum, count }, Some(v)) => {
                let scale = match plan.arg_type {
                    DataType::Decimal128(_, s) => s,
                    _ => 0,
                };
                let x = v
                    .as_f64(scale)
                    .ok_or_else(|| format!("avg() of a non-number {v:?}"))?;
                Ok(Some(Acc::Avg {
                    sum: (f64::from_bits(*sum) + x).to_bits(),
                    count: count + 1,
                }))
            }
            (acc, v) => Err(mismatch(acc, v)),
        }
    }
    fn merge(&self, a: &Acc, b: &Acc, _: &AggPlan) -> Result<Acc, String> {
        match (a, b) {
            (Acc::Avg { sum: s1, count: c1 }, Acc::Avg { sum: s2, count: c2 }) => Ok(Acc::Avg {
                sum: add_floats(*s1, *s2),
                count: c1 + c2,
            }),
            (a, b) => Err(format!("{a:?} cannot merge with {b:?}")),
        }
    }
    fn partial_columns(&self, name: &str, _: ColumnType) -> Vec<(String, ColumnType)> {
        vec![
            (format!("{name}__sum"), ColumnType::Double),
            (format!("{name}__count"), ColumnType::Long),
        ]
    }
    fn partial(&self, acc: &Acc) -> Vec<Value> {
        match acc {
            Acc::Avg { sum, count } => vec![
                if *count == 0 {
                    Value::Null
                } else {
                    Value::Float(*sum)
                },
                Value::Int(*count),
            ],
            _ => vec![Value::Null, Value::Null],
        }
    }
    fn merge_sql(&self, name: &str, _: ViewDialect) -> String {
        format!(
            "SUM({}) / SUM({}) AS {}",
            q(&format!("{name}__sum")),
            q(&format!("{name}__count")),
            q(name)
        )
    }
    fn view_type(&self, _: ColumnType) -> String {
        "double".into()
    }
}

/// `approx_distinct`: a HyperLogLog sketch per partial row, merged by the view (see
/// [`crate::sketch`]).
struct Distinct;

impl Aggregate for Distinct {
    fn names(&self) -> &'static [&'static str] {
        &["approx_distinct"]
    }
    fn output_type(&self, _: Option<ColumnType>) -> Option<ColumnType> {
        Some(ColumnType::Long)
    }
    fn empty(&self, _: &DataType) -> Acc {
        Acc::Distinct(Sketch::default())
    }
    fn update(&self, acc: &Acc, value: Option<&Value>, _: &AggPlan) -> Result<Option<Acc>, String> {
        match (acc, value) {
            (_, Some(Value::Null)) => Ok(None),
            (Acc::Distinct(s), Some(v)) => Ok(s.inserted(v).map(Acc::Distinct)),
            (acc, v) => Err(mismatch(acc, v)),
        }
    }
    fn merge(&self, a: &Acc, b: &Acc, _: &AggPlan) -> Result<Acc, String> {
        match (a, b) {
            (Acc::Distinct(a), Acc::Distinct(b)) => {
                let mut s = a.clone();
                s.merge(b);
                Ok(Acc::Distinct(s))
            }
            (a, b) => Err(format!("{a:?} cannot merge with {b:?}")),
        }
    }
    fn partial_columns(&self, name: &str, _: ColumnType) -> Vec<(String, ColumnType)> {
        vec![(format!("{name}{SKETCH_SUFFIX}"), ColumnType::String)]
    }
    fn partial(&self, acc: &Acc) -> Vec<Value> {
        match acc {
            Acc::Distinct(s) => vec![Value::Str(s.to_base64())],
            _ => vec![Value::Null],
        }
    }
    fn merge_sql(&self, name: &str, dialect: ViewDialect) -> String {
        let sketch = q(&format!("{name}{SKETCH_SUFFIX}"));
        match dialect {
            ViewDialect::DataFusion => format!("{MERGE_SKETCHES}({sketch}) AS {}", q(name)),
            ViewDialect::Athena => format!(
                "cardinality(merge(CAST(from_base64({sketch}) AS HyperLogLog))) AS {}",
                q(name)
            ),
        }
    }
    fn view_type(&self, _: ColumnType) -> String {
        "bigint".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_aggregate_is_found_by_each_of_its_names_and_listed_once() {
        for a in AGGREGATES {
            for n in a.names() {
                assert_eq!(by_name(n).map(|f| f.names()[0]), Some(a.names()[0]));
            }
        }
        assert!(by_name("median").is_none());
        assert_eq!(listed(), "count, sum, min, max, avg or approx_distinct");
    }
}
