//! Reading an Avro body (binary encoding) with the schema it was written with, straight into the
//! table's cells.
//!
//! A [`Plan`] is compiled once per (writer schema, table): each writer field either fills
//! columns (by the spec's paths, so `customer.id` reads the nested record's field), descends into
//! a nested record that holds columns, or is skipped. Columns the writer schema does not have
//! stay NULL — the Avro rule for a field added later — and a required one rejects the record.
//! Every read goes through the bounds-checked [`Cursor`].

use std::borrow::Cow;
use std::sync::Arc;

use super::cursor::{Cursor, Fault, MAX_DEPTH, value_error};
use super::schema::{Schema, Type};
use crate::decode::json::{Child, Node};
use crate::decode::value::{
    MAX_DATE_DAYS, MIN_DATE_DAYS, TIME_RANGE, ValueError, parse_timestamp, timestamp_in_range,
};
use crate::decode::{Cell, RejectKind};
use crate::spec::ColumnType;

/// Why a body could not be read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// The bytes do not follow the schema (truncated, bad length, bad union index, …).
    Malformed(String),
    /// A column's value does not fit it; `column` is its index.
    Value { column: usize, error: ValueError },
    /// The writer's field has a type the column cannot take.
    Mismatch {
        column: Option<usize>,
        detail: String,
    },
}

/// A table's column as the plan needs it.
impl From<Fault> for ReadError {
    /// A fault outside any column's value (a union index, a length): the body is malformed.
    fn from(f: Fault) -> Self {
        match f {
            Fault::Malformed(m) => ReadError::Malformed(m),
            Fault::Value(v) => ReadError::Malformed(v.detail),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Target {
    pub column: usize,
    pub ty: ColumnType,
}

/// What to do with one value of the writer schema.
#[derive(Debug)]
enum Action {
    /// Read and discard it.
    Skip,
    /// A `null`: the columns below stay NULL.
    Null,
    /// Fill these columns (several columns may share a path).
    Columns(Vec<Target>),
    /// A record with columns inside: one step per writer field.
    Record(Vec<Step>),
    /// A union: one step per branch.
    Union(Vec<Step>),
    /// The writer's type cannot fill what the spec expects here.
    Mismatch {
        column: Option<usize>,
        detail: String,
    },
}

#[derive(Debug)]
struct Step {
    ty: Type,
    action: Action,
}

/// A writer schema compiled against one table's columns.
#[derive(Debug)]
pub(super) struct Plan {
    schema: Arc<Schema>,
    root: Step,
}

impl Plan {
    /// Compiles `schema` for the columns reachable through `tree` (`types[slot]` are the columns
    /// of each leaf slot).
    pub fn new(schema: Arc<Schema>, tree: &Node, slots: &[Vec<Target>]) -> Plan {
        let root = compile(&schema, &schema.root, Want::Node(tree), slots, 0);
        Plan { schema, root }
    }

    /// Reads one body into `cells` (one per column, NULL where the writer has no value).
    pub fn read<'a>(&self, body: &'a [u8], cells: &mut [Cell<'a>]) -> Result<(), ReadError> {
        let mut cursor = Cursor::new(body);
        read_step(&self.schema, &self.root, &mut cursor, cells, 0)?;
        if cursor.pos != body.len() {
            return Err(ReadError::Malformed(format!(
                "{} bytes left after the record ({} bytes read)",
                body.len() - cursor.pos,
                cursor.pos
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Want<'n> {
    Nothing,
    Node(&'n Node),
    Leaf(usize),
}

fn compile(
    schema: &Schema,
    ty: &Type,
    want: Want<'_>,
    slots: &[Vec<Target>],
    depth: usize,
) -> Step {
    let action = match (ty, want) {
        (_, Want::Nothing) => Action::Skip,
        (Type::Null, _) => Action::Null,
        (Type::Union(branches), _) if depth < MAX_DEPTH => Action::Union(
            branches
                .iter()
                .map(|b| compile(schema, b, want, slots, depth + 1))
                .collect(),
        ),
        (Type::Record(i), Want::Node(node)) if depth < MAX_DEPTH => {
            let fields = schema.records.get(*i).map(|r| r.fields.as_slice());
            Action::Record(
                fields
                    .unwrap_or_default()
                    .iter()
                    .map(|f| {
                        let want = match node.find(&f.name).map(|c| &node.children[c].1) {
                            Some(Child::Leaf(slot)) => Want::Leaf(*slot),
                            Some(Child::Inner(inner)) => Want::Node(inner),
                            None => Want::Nothing,
                        };
                        compile(schema, &f.ty, want, slots, depth + 1)
                    })
                    .collect(),
            )
        }
        (_, Want::Node(node)) => Action::Mismatch {
            column: None,
            detail: format!(
                "{} is {} in the writer's schema, but the spec reads fields inside it",
                node.path,
                schema.describe(ty)
            ),
        },
        (_, Want::Leaf(slot)) => {
            let targets = slots.get(slot).cloned().unwrap_or_default();
            match targets.iter().find(|t| !fits(ty, t.ty)) {
                Some(t) => Action::Mismatch {
                    column: Some(t.column),
                    detail: format!(
                        "the writer's schema has {}, which does not fit a {} column",
                        schema.describe(ty),
                        t.ty
                    ),
                },
                None => Action::Columns(targets),
            }
        }
    };
    Step {
        ty: ty.clone(),
        action,
    }
}

/// Whether the writer's `ty` is an integer in the body (`int`, `long`, and the logical and
/// Debezium types on them: dates, timestamps, times of day), which a number column takes as its
/// number.
fn integral(ty: &Type) -> bool {
    matches!(
        ty,
        Type::Int
            | Type::Long
            | Type::Date
            | Type::TimestampMillis
            | Type::TimestampMicros
            | Type::TimestampNanos
            | Type::TimeOfDay
    )
}

/// Whether values of the writer's `ty` can fill a column of type `col` (each value is still
/// checked: ranges, precision).
fn fits(ty: &Type, col: ColumnType) -> bool {
    use ColumnType as C;
    match col {
        C::String => matches!(ty, Type::String | Type::Enum(_) | Type::Bytes),
        // A nanosecond timestamp or a time of day fits a number column as its number, as the
        // plain long it is.
        C::Int | C::Long => integral(ty),
        C::Float | C::Double => integral(ty) || matches!(ty, Type::Float | Type::Double),
        C::Boolean => matches!(ty, Type::Boolean),
        C::Date => matches!(ty, Type::Date),
        C::Timestamp => matches!(
            ty,
            Type::TimestampMillis
                | Type::TimestampMicros
                | Type::TimestampNanos
                | Type::Long
                | Type::String
        ),
        C::Decimal { .. } => matches!(ty, Type::Decimal { .. } | Type::String) || integral(ty),
        // Decoders fill a struct's fields, never the struct.
        C::Struct => false,
    }
}

fn read_step<'a>(
    schema: &Schema,
    step: &Step,
    c: &mut Cursor<'a>,
    cells: &mut [Cell<'a>],
    depth: usize,
) -> Result<(), ReadError> {
    if depth > MAX_DEPTH {
        return Err(ReadError::Malformed(format!(
            "nested more than {MAX_DEPTH} levels deep"
        )));
    }
    c.visit()?;
    match &step.action {
        Action::Skip => Ok(c.skip(schema, &step.ty, depth)?),
        Action::Null => Ok(()),
        Action::Record(fields) => {
            for f in fields {
                read_step(schema, f, c, cells, depth + 1)?;
            }
            Ok(())
        }
        Action::Union(branches) => {
            let index = c.long()?;
            let branch = usize::try_from(index)
                .ok()
                .and_then(|i| branches.get(i))
                .ok_or_else(|| {
                    ReadError::Malformed(format!(
                        "union branch {index} does not exist ({} branches)",
                        branches.len()
                    ))
                })?;
            read_step(schema, branch, c, cells, depth + 1)
        }
        Action::Mismatch { column, detail } => Err(ReadError::Mismatch {
            column: *column,
            detail: detail.clone(),
        }),
        Action::Columns(targets) => {
            let start = c.pos;
            for t in targets {
                c.pos = start;
                let cell = read_cell(c, &step.ty, t.ty).map_err(|e| match e {
                    Fault::Malformed(m) => ReadError::Malformed(m),
                    Fault::Value(error) => ReadError::Value {
                        column: t.column,
                        error,
                    },
                })?;
                if let Some(slot) = cells.get_mut(t.column) {
                    *slot = cell;
                }
            }
            Ok(())
        }
    }
}

/// Reads one value of the writer's `ty` as a cell of a `col` column.
fn read_cell<'a>(c: &mut Cursor<'a>, ty: &Type, col: ColumnType) -> Result<Cell<'a>, Fault> {
    use ColumnType as C;
    Ok(match (ty, col) {
        (Type::String | Type::Bytes, C::String) => Cell::Str(Cow::Borrowed(c.str()?)),
        (Type::Enum(symbols), C::String) => {
            let i = c.long()?;
            let symbol = usize::try_from(i)
                .ok()
                .and_then(|i| symbols.get(i))
                .ok_or_else(|| Fault::Malformed(format!("enum index {i} out of range")))?;
            Cell::Str(Cow::Owned(symbol.clone()))
        }
        (t, C::Int) if integral(t) => {
            let v = c.long()?;
            Cell::Int(i32::try_from(v).map_err(|_| {
                value_error(RejectKind::OutOfRange, format!("{v} does not fit an int"))
            })?)
        }
        (t, C::Long) if integral(t) => Cell::Long(c.long()?),
        (t, C::Double) if integral(t) => Cell::Double(c.long()? as f64),
        (t, C::Float) if integral(t) => Cell::Float(c.long()? as f32),
        (Type::Float, C::Float) => Cell::Float(finite(c.float()?)?),
        (Type::Float, C::Double) => Cell::Double(finite(c.float()?)?.into()),
        (Type::Double, C::Double) => Cell::Double(finite(c.double()?)?),
        (Type::Double, C::Float) => {
            let v = finite(c.double()?)?;
            if v.abs() > f64::from(f32::MAX) {
                return Err(value_error(
                    RejectKind::OutOfRange,
                    format!("{v} does not fit a float"),
                ));
            }
            Cell::Float(v as f32)
        }
        (Type::Boolean, C::Boolean) => match c.byte()? {
            0 => Cell::Bool(false),
            1 => Cell::Bool(true),
            b => return Err(Fault::Malformed(format!("boolean byte {b} is not 0 or 1"))),
        },
        (Type::Date, C::Date) => {
            let d = c.long()?;
            if !(i64::from(MIN_DATE_DAYS)..=i64::from(MAX_DATE_DAYS)).contains(&d) {
                return Err(value_error(
                    RejectKind::OutOfRange,
                    format!("date {d} (days since 1970-01-01) is outside {TIME_RANGE}"),
                ));
            }
            Cell::Date(d as i32)
        }
        (Type::TimestampMillis | Type::Long, C::Timestamp) => {
            let ms = c.long()?;
            let us = ms.checked_mul(1000).unwrap_or(i64::MAX);
            Cell::Timestamp(
                timestamp_in_range(us, format_args!("{ms} (epoch milliseconds)"))
                    .map_err(Fault::Value)?,
            )
        }
        (Type::TimestampMicros, C::Timestamp) => {
            let us = c.long()?;
            Cell::Timestamp(
                timestamp_in_range(us, format_args!("{us} (epoch microseconds)"))
                    .map_err(Fault::Value)?,
            )
        }
        (Type::TimestampNanos, C::Timestamp) => {
            let ns = c.long()?;
            Cell::Timestamp(
                timestamp_in_range(
                    ns.div_euclid(1000),
                    format_args!("{ns} (epoch nanoseconds)"),
                )
                .map_err(Fault::Value)?,
            )
        }
        (Type::String, C::Timestamp) => {
            Cell::Timestamp(parse_timestamp(c.str()?).map_err(Fault::Value)?)
        }
        (t, C::Decimal { precision, scale }) if integral(t) => {
            let v = i128::from(c.long()?);
            Cell::Decimal(rescale(v, 0, precision, scale)?)
        }
        (Type::String, C::Decimal { precision, scale }) => Cell::Decimal(
            crate::decode::value::parse_decimal(c.str()?.trim(), precision, scale)
                .map_err(Fault::Value)?,
        ),
        (
            Type::Decimal {
                scale: from_scale,
                fixed,
                ..
            },
            C::Decimal { precision, scale },
        ) => {
            let raw = match fixed {
                Some(n) => c.take(*n)?,
                None => c.bytes()?,
            };
            let v = big_endian(raw)?;
            Cell::Decimal(rescale(v, *from_scale, precision, scale)?)
        }
        (ty, col) => {
            return Err(Fault::Malformed(format!(
                "a {ty:?} value cannot fill a {col} column"
            )));
        }
    })
}

fn finite<F: Into<f64> + Copy>(v: F) -> Result<F, Fault> {
    if v.into().is_finite() {
        Ok(v)
    } else {
        Err(value_error(
            RejectKind::OutOfRange,
            format!("{} is not a finite number", v.into()),
        ))
    }
}

/// A two's-complement big-endian integer of up to 16 bytes (longer only with sign extension).
fn big_endian(raw: &[u8]) -> Result<i128, Fault> {
    let negative = raw.first().is_some_and(|b| b & 0x80 != 0);
    let fill = if negative { 0xff } else { 0 };
    let extra = raw.len().saturating_sub(16);
    let (head, tail) = raw.split_at(extra);
    if head.iter().any(|b| *b != fill) {
        return Err(value_error(
            RejectKind::OutOfRange,
            format!("decimal of {} bytes does not fit 38 digits", raw.len()),
        ));
    }
    let mut bytes = [fill; 16];
    bytes[16 - tail.len()..].copy_from_slice(tail);
    Ok(i128::from_be_bytes(bytes))
}

/// `v` at scale `from` as an unscaled value at `scale`, checked against `precision`.
fn rescale(v: i128, from: u32, precision: u8, scale: u8) -> Result<i128, Fault> {
    let to = u32::from(scale);
    let shown = || format!("{v}e-{from}");
    let out = if to >= from {
        10i128.checked_pow(to - from).and_then(|f| v.checked_mul(f))
    } else {
        let f = 10i128.checked_pow(from - to).unwrap_or(i128::MAX);
        if v % f != 0 {
            return Err(value_error(
                RejectKind::OutOfRange,
                format!("{} has more than {scale} decimal places", shown()),
            ));
        }
        Some(v / f)
    };
    let limit = 10i128
        .checked_pow(u32::from(precision))
        .unwrap_or(i128::MAX);
    match out {
        Some(x) if x.unsigned_abs() < limit.unsigned_abs() => Ok(x),
        _ => Err(value_error(
            RejectKind::OutOfRange,
            format!("{} does not fit decimal({precision},{scale})", shown()),
        )),
    }
}
