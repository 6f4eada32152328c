//! One value of a column, owned and serializable: the group keys of windows, the keys of
//! dedup, and the minimum or maximum an aggregate keeps, as they are stored in state between
//! invocations. A stable representation of our own (Arrow's row format may change between
//! releases; state written by one release is read by the next).

use std::cmp::Ordering;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder, Float64Builder, Int32Builder,
    Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, TimeUnit};
use serde::{Deserialize, Serialize};

/// A value of one of the column types a table holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// boolean
    Bool(bool),
    /// int, long, date (days), timestamp (microseconds)
    Int(i64),
    /// float and double, as the bits of an `f64` (so that cells are `Eq` and `Hash`).
    Float(u64),
    /// string
    Str(String),
    /// decimal, unscaled
    Dec(i128),
}

/// A [`Value`] borrowed from an array or from a cell: compared and ordered exactly as the owned
/// cell, so that rows can be looked up among stored keys without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ValueRef<'a> {
    /// SQL NULL.
    Null,
    /// boolean
    Bool(bool),
    /// int, long, date, timestamp
    Int(i64),
    /// float and double (`f64` bits)
    Float(u64),
    /// string
    Str(&'a str),
    /// decimal, unscaled
    Dec(i128),
}

impl<'a> ValueRef<'a> {
    /// The value of `array` at `row`; `None` for a type no table column has.
    pub fn of(array: &'a dyn Array, row: usize) -> Option<ValueRef<'a>> {
        if array.is_null(row) {
            return Some(ValueRef::Null);
        }
        Some(match array.data_type() {
            DataType::Boolean => ValueRef::Bool(array.as_boolean().value(row)),
            DataType::Int8 => {
                ValueRef::Int(array.as_primitive::<types::Int8Type>().value(row).into())
            }
            DataType::Int16 => {
                ValueRef::Int(array.as_primitive::<types::Int16Type>().value(row).into())
            }
            DataType::Int32 => {
                ValueRef::Int(array.as_primitive::<types::Int32Type>().value(row).into())
            }
            DataType::Int64 => ValueRef::Int(array.as_primitive::<types::Int64Type>().value(row)),
            DataType::Date32 => {
                ValueRef::Int(array.as_primitive::<types::Date32Type>().value(row).into())
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => ValueRef::Int(
                array
                    .as_primitive::<types::TimestampMicrosecondType>()
                    .value(row),
            ),
            DataType::Float32 => ValueRef::Float(
                f64::from(array.as_primitive::<types::Float32Type>().value(row)).to_bits(),
            ),
            DataType::Float64 => ValueRef::Float(
                array
                    .as_primitive::<types::Float64Type>()
                    .value(row)
                    .to_bits(),
            ),
            DataType::Utf8 => ValueRef::Str(array.as_string::<i32>().value(row)),
            DataType::LargeUtf8 => ValueRef::Str(array.as_string::<i64>().value(row)),
            DataType::Utf8View => ValueRef::Str(array.as_string_view().value(row)),
            DataType::Decimal128(_, _) => {
                ValueRef::Dec(array.as_primitive::<types::Decimal128Type>().value(row))
            }
            _ => return None,
        })
    }

    /// The owned cell.
    pub fn to_cell(self) -> Value {
        match self {
            ValueRef::Null => Value::Null,
            ValueRef::Bool(b) => Value::Bool(b),
            ValueRef::Int(v) => Value::Int(v),
            ValueRef::Float(b) => Value::Float(b),
            ValueRef::Str(s) => Value::Str(s.to_string()),
            ValueRef::Dec(v) => Value::Dec(v),
        }
    }
}

impl Value {
    /// The value of `array` at `row`; `None` for a type no table column has.
    pub fn of(array: &dyn Array, row: usize) -> Option<Value> {
        ValueRef::of(array, row).map(ValueRef::to_cell)
    }

    /// The cell, borrowed.
    pub fn borrowed(&self) -> ValueRef<'_> {
        match self {
            Value::Null => ValueRef::Null,
            Value::Bool(b) => ValueRef::Bool(*b),
            Value::Int(v) => ValueRef::Int(*v),
            Value::Float(b) => ValueRef::Float(*b),
            Value::Str(s) => ValueRef::Str(s),
            Value::Dec(v) => ValueRef::Dec(*v),
        }
    }

    /// The number, as a float (for averages).
    pub fn as_f64(&self, scale: i8) -> Option<f64> {
        match self {
            Value::Int(v) => Some(*v as f64),
            Value::Float(b) => Some(f64::from_bits(*b)),
            Value::Dec(v) => Some(*v as f64 / 10f64.powi(scale.into())),
            _ => None,
        }
    }

    /// SQL order of two non-NULL values of one type (NaN above every number, as in DataFusion).
    pub fn compare(&self, other: &Value) -> Ordering {
        match (self, other) {
            (Value::Float(a), Value::Float(b)) => f64::from_bits(*a).total_cmp(&f64::from_bits(*b)),
            _ => self.cmp(other),
        }
    }
}

/// Builds an array of `data_type` from `cells`; `None` when a cell does not fit the type.
pub fn build(data_type: &DataType, cells: &[&Value]) -> Option<ArrayRef> {
    macro_rules! ints {
        ($builder:ty, $t:ty) => {{
            let mut b = <$builder>::with_capacity(cells.len());
            for c in cells {
                match c {
                    Value::Null => b.append_null(),
                    Value::Int(v) => b.append_value(<$t>::try_from(*v).ok()?),
                    _ => return None,
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    Some(match data_type {
        DataType::Boolean => {
            let mut b = BooleanBuilder::with_capacity(cells.len());
            for c in cells {
                match c {
                    Value::Null => b.append_null(),
                    Value::Bool(v) => b.append_value(*v),
                    _ => return None,
                }
            }
            Arc::new(b.finish())
        }
        DataType::Int32 => ints!(Int32Builder, i32),
        DataType::Int64 => ints!(Int64Builder, i64),
        DataType::Date32 => ints!(Date32Builder, i32),
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            let mut b = TimestampMicrosecondBuilder::with_capacity(cells.len())
                .with_timezone_opt(tz.clone());
            for c in cells {
                match c {
                    Value::Null => b.append_null(),
                    Value::Int(v) => b.append_value(*v),
                    _ => return None,
                }
            }
            Arc::new(b.finish())
        }
        DataType::Float32 => {
            let mut b = Float32Builder::with_capacity(cells.len());
            for c in cells {
                match c {
                    Value::Null => b.append_null(),
                    Value::Float(v) => b.append_value(f64::from_bits(*v) as f32),
                    _ => return None,
                }
            }
            Arc::new(b.finish())
        }
        DataType::Float64 => {
            let mut b = Float64Builder::with_capacity(cells.len());
            for c in cells {
                match c {
                    Value::Null => b.append_null(),
                    Value::Float(v) => b.append_value(f64::from_bits(*v)),
                    _ => return None,
                }
            }
            Arc::new(b.finish())
        }
        DataType::Utf8 => {
            let mut b = StringBuilder::with_capacity(cells.len(), cells.len() * 8);
            for c in cells {
                match c {
                    Value::Null => b.append_null(),
                    Value::Str(v) => b.append_value(v),
                    _ => return None,
                }
            }
            Arc::new(b.finish())
        }
        DataType::Decimal128(p, s) => {
            let mut b = Decimal128Builder::with_capacity(cells.len())
                .with_precision_and_scale(*p, *s)
                .ok()?;
            for c in cells {
                match c {
                    Value::Null => b.append_null(),
                    Value::Dec(v) => b.append_value(*v),
                    _ => return None,
                }
            }
            Arc::new(b.finish())
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Decimal128Array, Float64Array, StringArray};

    #[test]
    fn cells_round_trip_through_arrays_and_json() {
        let strings: ArrayRef = Arc::new(StringArray::from(vec![Some("DE"), None]));
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![1.5, f64::NAN]));
        let decimals: ArrayRef = Arc::new(
            Decimal128Array::from(vec![12345i128, -1])
                .with_precision_and_scale(18, 2)
                .unwrap(),
        );
        for a in [strings, floats, decimals] {
            let cells: Vec<Value> = (0..2).map(|i| Value::of(&a, i).unwrap()).collect();
            let json = serde_json::to_string(&cells).unwrap();
            let back: Vec<Value> = serde_json::from_str(&json).unwrap();
            assert_eq!(back, cells);
            let refs: Vec<&Value> = back.iter().collect();
            let rebuilt = build(a.data_type(), &refs).unwrap();
            assert_eq!(rebuilt.len(), 2);
            assert_eq!(Value::of(&rebuilt, 0), Value::of(&a, 0));
            assert_eq!(Value::of(&rebuilt, 1), Value::of(&a, 1));
        }
    }

    proptest::proptest! {
        #[test]
        fn borrowed_cells_order_as_owned(
            a in proptest::collection::vec(any_cell(), 0..3),
            b in proptest::collection::vec(any_cell(), 0..3),
        ) {
            let borrowed = a.iter().map(Value::borrowed).cmp(b.iter().map(Value::borrowed));
            proptest::prop_assert_eq!(borrowed, a.cmp(&b));
            for c in &a {
                proptest::prop_assert_eq!(&c.borrowed().to_cell(), c);
            }
        }
    }

    fn any_cell() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..3).prop_map(Value::Int),
            any::<u64>().prop_map(Value::Float),
            "[ab]{0,3}".prop_map(Value::Str),
            (-3i128..3).prop_map(Value::Dec),
        ]
    }

    #[test]
    fn floats_compare_numerically() {
        let a = Value::Float((-2.0f64).to_bits());
        let b = Value::Float(1.0f64.to_bits());
        assert_eq!(a.compare(&b), Ordering::Less);
    }
}
