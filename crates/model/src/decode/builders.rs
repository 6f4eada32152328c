//! Arrow column builders for decoded rows and for dead letters.

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBufferBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder,
    Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Field};

use super::{Cell, RejectKind};
use crate::error::{Error, Result};
use crate::kafka::{self, KafkaBuilders, RecordMeta};
use crate::schema::TableLayout;
use crate::spec::{ColumnType, TableSpec};

enum ColumnBuilder {
    Str(StringBuilder),
    Int(Int32Builder),
    Long(Int64Builder),
    Float(Float32Builder),
    Double(Float64Builder),
    Bool(BooleanBuilder),
    Date(Date32Builder),
    Timestamp(TimestampMicrosecondBuilder),
    Decimal(Decimal128Builder),
}

impl ColumnBuilder {
    fn new(ty: ColumnType, capacity: usize) -> Result<Self> {
        Ok(match ty {
            ColumnType::String => {
                ColumnBuilder::Str(StringBuilder::with_capacity(capacity, capacity * 16))
            }
            ColumnType::Int => ColumnBuilder::Int(Int32Builder::with_capacity(capacity)),
            ColumnType::Long => ColumnBuilder::Long(Int64Builder::with_capacity(capacity)),
            ColumnType::Float => ColumnBuilder::Float(Float32Builder::with_capacity(capacity)),
            ColumnType::Double => ColumnBuilder::Double(Float64Builder::with_capacity(capacity)),
            ColumnType::Boolean => ColumnBuilder::Bool(BooleanBuilder::with_capacity(capacity)),
            ColumnType::Date => ColumnBuilder::Date(Date32Builder::with_capacity(capacity)),
            ColumnType::Timestamp => {
                ColumnBuilder::Timestamp(TimestampMicrosecondBuilder::with_capacity(capacity))
            }
            ColumnType::Struct => {
                return Err(Error::Internal(
                    "a struct column has no builder of its own (its fields have)".into(),
                ));
            }
            ColumnType::Decimal { precision, scale } => ColumnBuilder::Decimal(
                Decimal128Builder::with_capacity(capacity)
                    .with_precision_and_scale(precision, scale as i8)
                    .map_err(|e| Error::Spec(format!("decimal({precision},{scale}): {e}")))?,
            ),
        })
    }

    /// Appends a cell. The decoder produces only cells of the column's type or `Null`.
    fn append(&mut self, cell: &Cell<'_>) {
        match (self, cell) {
            (ColumnBuilder::Str(b), Cell::Str(v)) => b.append_value(v),
            (ColumnBuilder::Int(b), Cell::Int(v)) => b.append_value(*v),
            (ColumnBuilder::Long(b), Cell::Long(v)) => b.append_value(*v),
            (ColumnBuilder::Float(b), Cell::Float(v)) => b.append_value(*v),
            (ColumnBuilder::Double(b), Cell::Double(v)) => b.append_value(*v),
            (ColumnBuilder::Bool(b), Cell::Bool(v)) => b.append_value(*v),
            (ColumnBuilder::Date(b), Cell::Date(v)) => b.append_value(*v),
            (ColumnBuilder::Timestamp(b), Cell::Timestamp(v)) => b.append_value(*v),
            (ColumnBuilder::Decimal(b), Cell::Decimal(v)) => b.append_value(*v),
            (builder, cell) => {
                debug_assert!(
                    matches!(cell, Cell::Null),
                    "cell {cell:?} does not fit its column"
                );
                builder.append_null();
            }
        }
    }

    fn append_null(&mut self) {
        match self {
            ColumnBuilder::Str(b) => b.append_null(),
            ColumnBuilder::Int(b) => b.append_null(),
            ColumnBuilder::Long(b) => b.append_null(),
            ColumnBuilder::Float(b) => b.append_null(),
            ColumnBuilder::Double(b) => b.append_null(),
            ColumnBuilder::Bool(b) => b.append_null(),
            ColumnBuilder::Date(b) => b.append_null(),
            ColumnBuilder::Timestamp(b) => b.append_null(),
            ColumnBuilder::Decimal(b) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            ColumnBuilder::Str(b) => Arc::new(b.finish()),
            ColumnBuilder::Int(b) => Arc::new(b.finish()),
            ColumnBuilder::Long(b) => Arc::new(b.finish()),
            ColumnBuilder::Float(b) => Arc::new(b.finish()),
            ColumnBuilder::Double(b) => Arc::new(b.finish()),
            ColumnBuilder::Bool(b) => Arc::new(b.finish()),
            ColumnBuilder::Date(b) => Arc::new(b.finish()),
            ColumnBuilder::Timestamp(b) => Arc::new(b.finish()),
            ColumnBuilder::Decimal(b) => Arc::new(b.finish()),
        }
    }
}

/// The array of `field` from the leaf arrays in order: a leaf as it is, a struct from its
/// fields' arrays, NULL where every field is NULL.
fn assemble(
    field: &Field,
    leaves: &mut impl Iterator<Item = ArrayRef>,
    table: &str,
) -> Result<ArrayRef> {
    let DataType::Struct(children) = field.data_type() else {
        return leaves.next().ok_or_else(|| {
            Error::Internal(format!(
                "table {table}: no values for column {}",
                field.name()
            ))
        });
    };
    let arrays = children
        .iter()
        .map(|c| assemble(c, leaves, table))
        .collect::<Result<Vec<_>>>()?;
    let rows = arrays.first().map_or(0, |a| a.len());
    let mut valid = BooleanBufferBuilder::new(rows);
    for row in 0..rows {
        valid.append(arrays.iter().any(|a| a.is_valid(row)));
    }
    let nulls = NullBuffer::new(valid.finish());
    StructArray::try_new(children.clone(), arrays, Some(nulls))
        .map(|a| Arc::new(a) as ArrayRef)
        .map_err(|e| Error::Internal(format!("table {table}: struct {}: {e}", field.name())))
}

/// Builds the Arrow batch of accepted rows for one table.
pub struct RowBuilder {
    layout: Arc<TableLayout>,
    columns: Vec<ColumnBuilder>,
    kafka: KafkaBuilders,
    rows: usize,
}

impl RowBuilder {
    /// A builder for `table`, sized for `capacity` rows. When `layout` has `kafka_headers`, the
    /// rows carry the records' headers if the spec asks for them (`kafka_headers = true`), NULL
    /// if not (the table kept the column after the option was turned off).
    pub fn new(table: &TableSpec, layout: Arc<TableLayout>, capacity: usize) -> Result<Self> {
        let columns = table
            .leaves()
            .iter()
            .map(|c| ColumnBuilder::new(c.column_type, capacity))
            .collect::<Result<_>>()?;
        let mut kafka = KafkaBuilders::with_capacity(capacity);
        if let Some((_, field)) = layout.arrow_schema.column_with_name(kafka::HEADERS) {
            kafka = kafka.with_headers(field, table.kafka_headers)?;
        }
        Ok(RowBuilder {
            layout,
            columns,
            kafka,
            rows: 0,
        })
    }

    /// Appends one decoded row (cells in spec order) with its Kafka coordinates.
    pub fn append(&mut self, cells: &[Cell<'_>], meta: RecordMeta<'_>) {
        for (builder, cell) in self.columns.iter_mut().zip(cells) {
            builder.append(cell);
        }
        for builder in self.columns.iter_mut().skip(cells.len()) {
            builder.append_null();
        }
        self.kafka.append(&meta);
        self.rows += 1;
    }

    /// Rows appended since the last [`RowBuilder::finish`].
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether no row was appended.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The rows as one batch in the table's Arrow schema; the builder is empty afterwards.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let leaves: Vec<ArrayRef> = self.columns.iter_mut().map(ColumnBuilder::finish).collect();
        // The Kafka columns come last: the five, then `kafka_headers` where the table has it.
        let business = self
            .layout
            .arrow_schema
            .fields()
            .len()
            .saturating_sub(self.kafka.columns());
        let mut leaves = leaves.into_iter();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(business + self.kafka.columns());
        for field in self.layout.arrow_schema.fields().iter().take(business) {
            arrays.push(assemble(field, &mut leaves, &self.layout.name)?);
        }
        arrays.extend(self.kafka.finish()?);
        self.rows = 0;
        RecordBatch::try_new(self.layout.arrow_schema.clone(), arrays).map_err(|e| {
            Error::Internal(format!(
                "table {}: rows do not fit the schema: {e}",
                self.layout.name
            ))
        })
    }
}

/// One rejected record, with everything needed to replay it.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The topic the record came from.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its Kafka timestamp, epoch milliseconds.
    pub timestamp_ms: Option<i64>,
    /// Its key's bytes.
    pub key: Option<&'a [u8]>,
    /// Its value's bytes.
    pub value: Option<&'a [u8]>,
    /// Why it was rejected.
    pub kind: RejectKind,
    /// The reason, naming the column and JSON path.
    pub message: &'a str,
}

/// Builds the Arrow batch of the dead-letter table.
pub struct DeadLetterBuilder {
    layout: Arc<TableLayout>,
    failed_at_us: i64,
    topic: StringBuilder,
    partition: Int32Builder,
    offset: Int64Builder,
    timestamp: TimestampMicrosecondBuilder,
    key: LargeBinaryBuilder,
    value: LargeBinaryBuilder,
    kind: StringBuilder,
    message: StringBuilder,
    failed_at: TimestampMicrosecondBuilder,
    rows: usize,
}

impl DeadLetterBuilder {
    /// A builder whose rows record `failed_at_us` (UTC microseconds) as their rejection time.
    pub fn new(layout: Arc<TableLayout>, failed_at_us: i64) -> Self {
        DeadLetterBuilder {
            layout,
            failed_at_us,
            topic: StringBuilder::new(),
            partition: Int32Builder::new(),
            offset: Int64Builder::new(),
            timestamp: TimestampMicrosecondBuilder::new(),
            key: LargeBinaryBuilder::new(),
            value: LargeBinaryBuilder::new(),
            kind: StringBuilder::new(),
            message: StringBuilder::new(),
            failed_at: TimestampMicrosecondBuilder::new(),
            rows: 0,
        }
    }

    /// Appends one rejected record.
    pub fn append(&mut self, d: &DeadLetter<'_>) {
        self.topic.append_value(d.topic);
        self.partition.append_value(d.partition);
        self.offset.append_value(d.offset);
        // A Kafka timestamp readers cannot represent is left out (the message says why).
        self.timestamp.append_option(
            d.timestamp_ms
                .and_then(|t| t.checked_mul(1000))
                .filter(|us| super::value::timestamp_in_range(*us, "").is_ok()),
        );
        self.key.append_option(d.key);
        self.value.append_option(d.value);
        self.kind.append_value(d.kind.as_str());
        self.message.append_value(d.message);
        self.failed_at.append_value(self.failed_at_us);
        self.rows += 1;
    }

    /// Rows appended since the last [`DeadLetterBuilder::finish`].
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether no row was appended.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The rows as one batch; the builder is empty afterwards.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(self.topic.finish()),
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.timestamp.finish()),
            Arc::new(self.key.finish()),
            Arc::new(self.value.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.message.finish()),
            Arc::new(self.failed_at.finish()),
        ];
        self.rows = 0;
        RecordBatch::try_new(self.layout.arrow_schema.clone(), arrays)
            .map_err(|e| Error::Internal(format!("dead-letter rows do not fit the schema: {e}")))
    }
}
