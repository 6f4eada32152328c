//! Aggregate accumulators of open windows: small, serializable, and with a partial form that
//! merges across Kafka partitions and corrections by plain SQL (`SUM` of counts and sums, `MIN`
//! of minimums, `MAX` of maximums, `SUM(sum) / SUM(count)` for averages, the union of
//! HyperLogLog sketches for `approx_distinct`).

use datafusion::arrow::datatypes::DataType;

use super::{AggFn, AggPlan};
use crate::process::cell::Cell;
use crate::process::sketch::Sketch;
use crate::process::state::Acc;

/// The largest magnitude a sum of type `t` holds.
fn bound(t: &DataType) -> i128 {
    match t {
        DataType::Decimal128(p, _) => 10i128.pow(u32::from(*p).min(38)) - 1,
        DataType::Int32 => i32::MAX.into(),
        _ => i64::MAX.into(),
    }
}

impl Acc {
    /// The empty accumulator of `plan`.
    pub(crate) fn new(plan: &AggPlan) -> Acc {
        match plan.func {
            AggFn::Count => Acc::Count(0),
            AggFn::Sum if matches!(plan.arg_type, DataType::Float32 | DataType::Float64) => {
                Acc::SumFloat(None)
            }
            AggFn::Sum => Acc::SumInt(None),
            AggFn::Min => Acc::Min(Cell::Null),
            AggFn::Max => Acc::Max(Cell::Null),
            AggFn::Avg => Acc::Avg { sum: 0, count: 0 },
            AggFn::ApproxDistinct => Acc::Distinct(Sketch::default()),
        }
    }

    /// The accumulator after `value` (the argument of one row; `None` for `count(*)`), or why
    /// the value cannot be added (a sum that would leave its type's range).
    pub(crate) fn updated(
        &self,
        plan: &AggPlan,
        value: Option<&Cell>,
    ) -> Result<Option<Acc>, String> {
        let value = match value {
            Some(Cell::Null) => return Ok(None),
            v => v,
        };
        Ok(Some(match (self, value) {
            (Acc::Count(n), _) => Acc::Count(n.saturating_add(1)),
            (Acc::SumInt(s), Some(Cell::Int(v))) => {
                Acc::SumInt(Some(add(*s, i128::from(*v), plan)?))
            }
            (Acc::SumInt(s), Some(Cell::Dec(v))) => Acc::SumInt(Some(add(*s, *v, plan)?)),
            (Acc::SumFloat(s), Some(Cell::Float(v))) => Acc::SumFloat(Some(
                (s.map_or(0.0, f64::from_bits) + f64::from_bits(*v)).to_bits(),
            )),
            (Acc::Min(m), Some(v)) => Acc::Min(if *m == Cell::Null || v.compare(m).is_lt() {
                v.clone()
            } else {
                return Ok(None);
            }),
            (Acc::Max(m), Some(v)) => Acc::Max(if *m == Cell::Null || v.compare(m).is_gt() {
                v.clone()
            } else {
                return Ok(None);
            }),
            (Acc::Avg { sum, count }, Some(v)) => {
                let scale = match plan.arg_type {
                    DataType::Decimal128(_, s) => s,
                    _ => 0,
                };
                let x = v
                    .as_f64(scale)
                    .ok_or_else(|| format!("avg() of a non-number {v:?}"))?;
                Acc::Avg {
                    sum: (f64::from_bits(*sum) + x).to_bits(),
                    count: count + 1,
                }
            }
            (Acc::Distinct(s), Some(v)) => match s.inserted(v) {
                Some(s) => Acc::Distinct(s),
                None => return Ok(None),
            },
            (acc, v) => return Err(format!("{acc:?} cannot take {v:?}")),
        }))
    }

    /// The accumulator of two windows merged into one (sessions that an event joins).
    pub(crate) fn merged(&self, other: &Acc, plan: &AggPlan) -> Result<Acc, String> {
        Ok(match (self, other) {
            (Acc::Count(a), Acc::Count(b)) => Acc::Count(a.saturating_add(*b)),
            (Acc::SumInt(a), Acc::SumInt(b)) => match (a, b) {
                (Some(a), Some(b)) => Acc::SumInt(Some(add(Some(*a), *b, plan)?)),
                (a, b) => Acc::SumInt(a.or(*b)),
            },
            (Acc::SumFloat(a), Acc::SumFloat(b)) => match (a, b) {
                (Some(a), Some(b)) => {
                    Acc::SumFloat(Some((f64::from_bits(*a) + f64::from_bits(*b)).to_bits()))
                }
                (a, b) => Acc::SumFloat(a.or(*b)),
            },
            (Acc::Min(a), Acc::Min(b)) => Acc::Min(pick(a, b, std::cmp::Ordering::Less)),
            (Acc::Max(a), Acc::Max(b)) => Acc::Max(pick(a, b, std::cmp::Ordering::Greater)),
            (Acc::Avg { sum: s1, count: c1 }, Acc::Avg { sum: s2, count: c2 }) => Acc::Avg {
                sum: (f64::from_bits(*s1) + f64::from_bits(*s2)).to_bits(),
                count: c1 + c2,
            },
            (Acc::Distinct(a), Acc::Distinct(b)) => {
                let mut s = a.clone();
                s.merge(b);
                Acc::Distinct(s)
            }
            (a, b) => return Err(format!("{a:?} cannot merge with {b:?}")),
        })
    }

    /// The partial cells this accumulator contributes to a partial row (two for `avg`).
    pub(crate) fn partial(&self) -> Vec<Cell> {
        match self {
            Acc::Count(n) => vec![Cell::Int(*n)],
            Acc::SumInt(s) => vec![s.map_or(Cell::Null, Cell::Dec)],
            Acc::SumFloat(s) => vec![s.map_or(Cell::Null, Cell::Float)],
            Acc::Min(c) | Acc::Max(c) => vec![c.clone()],
            Acc::Avg { sum, count } => vec![
                if *count == 0 {
                    Cell::Null
                } else {
                    Cell::Float(*sum)
                },
                Cell::Int(*count),
            ],
            Acc::Distinct(s) => vec![Cell::Str(s.to_base64())],
        }
    }
}

/// `a` or `b`, whichever compares as `wanted` to the other (NULL loses).
fn pick(a: &Cell, b: &Cell, wanted: std::cmp::Ordering) -> Cell {
    if *a == Cell::Null || (*b != Cell::Null && b.compare(a) == wanted) {
        b.clone()
    } else {
        a.clone()
    }
}

fn add(s: Option<i128>, v: i128, plan: &AggPlan) -> Result<i128, String> {
    let b = bound(&plan.result);
    s.unwrap_or(0)
        .checked_add(v)
        .filter(|r| r.abs() <= b)
        .ok_or_else(|| format!("the sum leaves the range of {}", plan.result))
}

/// The cells of a sum as the partial column's type holds them (integers as `Int`).
pub fn typed(cell: Cell, t: &DataType) -> Cell {
    match (cell, t) {
        (Cell::Dec(v), DataType::Int64 | DataType::Int32) => {
            i64::try_from(v).map_or(Cell::Null, Cell::Int)
        }
        (c, _) => c,
    }
}
