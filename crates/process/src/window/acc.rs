//! Aggregate accumulators of open windows: small, serializable, and with a partial form that
//! merges across Kafka partitions and corrections by plain SQL. What each aggregate does with
//! its accumulator is its [`super::Aggregate`]'s; these are the calls the window code makes.

use crate::df::arrow::datatypes::DataType;

use super::AggPlan;
use crate::partition_state::Acc;
use crate::value::Value;

impl Acc {
    /// The empty accumulator of `plan`.
    pub(crate) fn new(plan: &AggPlan) -> Acc {
        plan.func.empty(&plan.arg_type)
    }

    /// The accumulator after `value` (the argument of one row; `None` for `count(*)`), or why
    /// the value cannot be added (a sum that would leave its type's range).
    pub(crate) fn updated(
        &self,
        plan: &AggPlan,
        value: Option<&Value>,
    ) -> Result<Option<Acc>, String> {
        plan.func.update(self, value, plan)
    }

    /// The accumulator of two windows merged into one (sessions that an event joins).
    pub(crate) fn merged(&self, other: &Acc, plan: &AggPlan) -> Result<Acc, String> {
        plan.func.merge(self, other, plan)
    }

    /// The partial cells this accumulator contributes to a partial row (two for `avg`).
    pub(crate) fn partial(&self, plan: &AggPlan) -> Vec<Value> {
        plan.func.partial(self)
    }
}

/// The cells of a sum as the partial column's type holds them (integers as `Int`).
pub fn typed(cell: Value, t: &DataType) -> Value {
    match (cell, t) {
        (Value::Dec(v), DataType::Int64 | DataType::Int32) => {
            i64::try_from(v).map_or(Value::Null, Value::Int)
        }
        (c, _) => c,
    }
}
