//! The rows of an interval join's round: reading the sides (kept state objects and the round's
//! data files) in their tables' layouts, event times, lateness, the join itself in DataFusion,
//! and writing files, state objects and dead letters.

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Int32Array, Int64Array, LargeBinaryArray, RecordBatch,
    StringArray, new_null_array,
};
use bytes::Bytes;
use datafusion::arrow::compute::{cast, concat_batches};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::super::select::TableFiles;
use crate::backend::Backend;
use crate::checkpoint::PendingFile;
use crate::decode::{DeadLetter, DeadLetterBuilder, RejectKind};
use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::spec::{JOIN_KAFKA_PREFIX, JOIN_NEW_COLUMN, JoinSide};
use crate::table::encode::{encode, micro_file_properties};

pub(super) fn arrow(e: datafusion::arrow::error::ArrowError) -> Error {
    Error::Internal(format!("interval join: {e}"))
}

/// One side's rows of a round: kept from earlier rounds, and new.
pub(super) struct Side {
    pub kept: RecordBatch,
    /// The rows of each kept run, in order (they are the first rows of `kept`).
    pub kept_counts: Vec<usize>,
    pub new: RecordBatch,
    pub new_times: Vec<Option<i64>>,
    /// Per new row: its late rows were dead-lettered already (a backlog file of a failed
    /// attempt that committed them).
    pub judged: Vec<bool>,
}

/// Objects of a side read at once.
const CONCURRENT_READS: usize = 8;

/// Reads a side's kept rows (state object) and new rows (the files, each with whether its
/// late rows were dead-lettered already), in its layout.
pub(super) async fn side(
    backend: &Backend,
    layout: &TableLayout,
    spec: &JoinSide,
    runs: &[super::KeptRun],
    files: &[(String, bool)],
) -> Result<Side> {
    use futures::{StreamExt, TryStreamExt};
    // Objects are read several at a time (S3 answers each in tens of ms), kept in order.
    let read_all = |locations: Vec<String>| {
        futures::stream::iter(locations)
            .map(|l| read(backend, layout, std::iter::once(l)))
            .buffered(CONCURRENT_READS)
            .try_collect::<Vec<RecordBatch>>()
    };
    let kept_parts = read_all(runs.iter().map(|r| r.location.clone()).collect()).await?;
    let kept_counts: Vec<usize> = kept_parts.iter().map(RecordBatch::num_rows).collect();
    let kept = concat_batches(&layout.arrow_schema, &kept_parts).map_err(arrow)?;
    let parts = read_all(files.iter().map(|(path, _)| path.clone()).collect()).await?;
    let mut judged = Vec::new();
    for ((_, was_judged), rows) in files.iter().zip(&parts) {
        judged.extend(std::iter::repeat_n(*was_judged, rows.num_rows()));
    }
    let new = concat_batches(&layout.arrow_schema, &parts).map_err(arrow)?;
    let new_times = times(&new, &spec.time_column)?;
    Ok(Side {
        kept,
        kept_counts,
        new,
        new_times,
        judged,
    })
}

/// The rows of Parquet objects `locations`, in `layout`'s columns (missing ones NULL).
pub(super) async fn read(
    backend: &Backend,
    layout: &TableLayout,
    locations: impl Iterator<Item = String>,
) -> Result<RecordBatch> {
    let schema = layout.arrow_schema.clone();
    let mut batches = vec![RecordBatch::new_empty(schema.clone())];
    for location in locations {
        let bytes = backend.warehouse.read(&location).await?;
        let pq =
            |e: parquet::errors::ParquetError| Error::Internal(format!("read {location}: {e}"));
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .map_err(pq)?
            .build()
            .map_err(pq)?;
        for batch in reader {
            let batch = batch.map_err(|e| Error::Internal(format!("read {location}: {e}")))?;
            batches.push(conform(&batch, layout)?);
        }
    }
    concat_batches(&schema, &batches).map_err(arrow)
}

/// `batch` in `layout`'s columns and types; columns it lacks are NULL. Columns of a data file
/// (which carry Iceberg field ids) are matched by id, so a file written before a column was
/// renamed keeps its values; rows computed here (no ids) are matched by name.
pub(super) fn conform(batch: &RecordBatch, layout: &TableLayout) -> Result<RecordBatch> {
    const FIELD_ID: &str = "PARQUET:field_id";
    let n = batch.num_rows();
    let input = batch.schema();
    let by_id = input
        .fields()
        .iter()
        .any(|f| f.metadata().contains_key(FIELD_ID));
    let mut columns: Vec<ArrayRef> = Vec::new();
    for f in layout.arrow_schema.fields() {
        let found = if by_id {
            let id = f.metadata().get(FIELD_ID);
            input
                .fields()
                .iter()
                .position(|g| id.is_some() && g.metadata().get(FIELD_ID) == id)
                .map(|i| batch.column(i))
        } else {
            batch.column_by_name(f.name())
        };
        columns.push(match found {
            Some(c) if c.data_type() == f.data_type() => c.clone(),
            Some(c) => cast(c, f.data_type()).map_err(arrow)?,
            None => new_null_array(f.data_type(), n),
        });
    }
    RecordBatch::try_new(layout.arrow_schema.clone(), columns).map_err(arrow)
}

/// `batch` with the left row's Kafka columns (`__streamtable_kafka_…`) under their own names.
pub(super) fn with_kafka_columns(batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = batch.schema();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let name = f.name().strip_prefix(JOIN_KAFKA_PREFIX).unwrap_or(f.name());
            Field::new(name, f.data_type().clone(), f.is_nullable())
        })
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), batch.columns().to_vec()).map_err(arrow)
}

/// The event times (µs) of `column`.
pub(super) fn times(rows: &RecordBatch, column: &str) -> Result<Vec<Option<i64>>> {
    let c = rows
        .column_by_name(column)
        .ok_or_else(|| Error::Internal(format!("join: no column {column}")))?;
    let c = cast(c, &DataType::Timestamp(TimeUnit::Microsecond, None)).map_err(arrow)?;
    let c = cast(&c, &DataType::Int64).map_err(arrow)?;
    let c = c
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| Error::Internal(format!("join: column {column} is not a time")))?;
    Ok((0..c.len())
        .map(|i| c.is_valid(i).then(|| c.value(i)))
        .collect())
}

pub(super) fn column<'a, T: 'static>(rows: &'a RecordBatch, name: &str) -> Result<&'a T> {
    rows.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| Error::Internal(format!("join: column {name} missing or mistyped")))
}

/// Rows whose event time is NULL or behind `watermark`.
pub(super) fn late_mask(times: &[Option<i64>], watermark: Option<i64>) -> BooleanArray {
    times
        .iter()
        .map(|t| Some(t.is_none_or(|t| watermark.is_some_and(|wm| t < wm))))
        .collect()
}

pub(super) fn not(mask: &BooleanArray) -> BooleanArray {
    mask.iter().map(|b| b.map(|b| !b)).collect()
}

/// The rows of `rows` whose time in `column` satisfies `wanted`.
pub(super) fn keep_mask(
    rows: &RecordBatch,
    column: &str,
    wanted: impl Fn(i64) -> bool,
) -> Result<BooleanArray> {
    let t = times(rows, column)?;
    Ok(t.iter().map(|t| Some(t.is_some_and(&wanted))).collect())
}

/// Registers a side as a table of kept rows (`__streamtable_new` false) and new rows (true).
pub(super) fn register(
    ctx: &SessionContext,
    name: &str,
    kept: &RecordBatch,
    new: &RecordBatch,
) -> Result<()> {
    let mut fields: Vec<Field> = kept
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_metadata(Default::default()))
        .collect();
    fields.push(Field::new(JOIN_NEW_COLUMN, DataType::Boolean, false));
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let marked = |rows: &RecordBatch, flag: bool| -> Result<RecordBatch> {
        let mut columns = rows.columns().to_vec();
        columns.push(Arc::new(BooleanArray::from(vec![flag; rows.num_rows()])));
        RecordBatch::try_new(schema.clone(), columns).map_err(arrow)
    };
    let table = MemTable::try_new(
        schema.clone(),
        vec![vec![marked(kept, false)?, marked(new, true)?]],
    )
    .map_err(|e| Error::Internal(format!("join table {name}: {e}")))?;
    ctx.register_table(name, Arc::new(table))
        .map_err(|e| Error::Internal(format!("join table {name}: {e}")))?;
    Ok(())
}

/// Encodes `rows` into data files of `layout`'s table, uploads them and adds them to `files`.
pub(super) async fn add_files(
    backend: &Backend,
    layout: &TableLayout,
    rows: &RecordBatch,
    table_location: &str,
    stem: &str,
    files: &mut TableFiles,
) -> Result<()> {
    for f in encode(layout, rows, table_location, stem, &micro_file_properties()).await? {
        backend
            .warehouse
            .write(&f.location, f.bytes.clone())
            .await?;
        files.files.push(PendingFile {
            table: layout.name.clone(),
            data_file: String::new(),
            rows: f.data_file.record_count(),
            bytes: f.bytes.len() as u64,
            partitioning: None,
            carried: None,
            key_deletes: None,
        });
        files.data_files.push(f.data_file);
    }
    Ok(())
}

pub(super) fn parquet_bytes(rows: &RecordBatch) -> Result<Bytes> {
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, rows.schema(), Some(micro_file_properties()))
        .map_err(|e| Error::Internal(format!("join state: {e}")))?;
    w.write(rows)
        .and_then(|_| w.close().map(|_| ()))
        .map_err(|e| Error::Internal(format!("join state: {e}")))?;
    Ok(Bytes::from(buf))
}

/// Appends the late rows of a side to `dead`.
pub(super) fn dead_letters(
    dead: &mut DeadLetterBuilder,
    name: &str,
    side: &Side,
    spec: &JoinSide,
    mask: &BooleanArray,
    watermark: Option<i64>,
    other: &JoinSide,
) -> Result<()> {
    let partitions = column::<Int32Array>(&side.new, crate::kafka::PARTITION)?;
    let offsets = column::<Int64Array>(&side.new, crate::kafka::OFFSET)?;
    let kafka_ts = times(&side.new, crate::kafka::TIMESTAMP)?;
    // A key is in `kafka_key` when it is text, else in `kafka_key_bytes`.
    let text_keys = side
        .new
        .column_by_name(crate::kafka::KEY)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>());
    let keys = side
        .new
        .column_by_name(crate::kafka::KEY_BYTES)
        .and_then(|c| c.as_any().downcast_ref::<LargeBinaryArray>());
    let judged = |i: usize| side.judged.get(i).copied().unwrap_or(false);
    for i in (0..mask.len()).filter(|i| mask.value(*i) && !judged(*i)) {
        let at = side.new_times[i];
        let message = match (at, watermark) {
            (Some(t), Some(wm)) => format!(
                "interval join {name}: {}.{} {} is behind the watermark of {} ({}); rows of {} it could match may have been forgotten, so it is not joined (it is in table {})",
                spec.table,
                spec.time_column,
                crate::clock::rfc3339_us(t),
                spec.table,
                crate::clock::rfc3339_us(wm),
                other.table,
                spec.table
            ),
            _ => format!(
                "interval join {name}: {}.{} is NULL; the row cannot be placed in time (it is in table {})",
                spec.table, spec.time_column, spec.table
            ),
        };
        dead.append(&DeadLetter {
            topic: &spec.topic,
            partition: partitions.value(i),
            offset: offsets.value(i),
            timestamp_ms: kafka_ts[i].map(|us| us / 1000),
            key: text_keys
                .filter(|k| k.is_valid(i))
                .map(|k| k.value(i).as_bytes())
                .or_else(|| keys.filter(|k| k.is_valid(i)).map(|k| k.value(i))),
            value: None,
            kind: RejectKind::Late,
            message: &message,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::{Int32Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::spec::PipelineSpec;

    fn layout() -> TableLayout {
        let spec = PipelineSpec::parse(
            r#"[[tables]]
name = "t"
topic = "t"
columns = [{ name = "state", type = "string" }, { name = "n", type = "long" }]
"#,
            std::path::Path::new("p.toml"),
            &crate::process::Planner,
        )
        .expect("spec");
        TableLayout::for_table(&spec.tables[0]).expect("layout")
    }

    fn field(name: &str, ty: DataType, id: Option<&str>) -> Field {
        let f = Field::new(name, ty, true);
        match id {
            Some(id) => f.with_metadata(HashMap::from([(
                "PARQUET:field_id".to_string(),
                id.to_string(),
            )])),
            None => f,
        }
    }

    /// A file written before `status` was renamed `state` (same field id 1) and while `n` was
    /// an int keeps its values; rows without ids are matched by name.
    #[test]
    fn file_columns_are_matched_by_field_id_and_widened() {
        let layout = layout();
        let mut fields = vec![
            field("status", DataType::Utf8, Some("1")),
            field("n", DataType::Int32, Some("2")),
            field("state", DataType::Utf8, Some("99")),
        ];
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec!["paid"])),
            Arc::new(Int32Array::from(vec![7])),
            Arc::new(StringArray::from(vec!["other column"])),
        ];
        // The Kafka columns, as every data file has them.
        for f in layout.arrow_schema.fields().iter().skip(2) {
            fields.push(f.as_ref().clone());
            columns
                .push(cast(&arrow_array::Int64Array::from(vec![0]), f.data_type()).expect("cast"));
        }
        let file =
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("file batch");
        let rows = conform(&file, &layout).expect("conform");
        assert_eq!(rows.column(0).as_string::<i32>().value(0), "paid");
        assert_eq!(
            rows.column(1)
                .as_primitive::<arrow_array::types::Int64Type>()
                .value(0),
            7
        );

        let mut fields = vec![field("state", DataType::Utf8, None)];
        let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec!["by name"]))];
        for f in layout.arrow_schema.fields().iter().skip(2) {
            fields.push(Field::new(f.name(), f.data_type().clone(), f.is_nullable()));
            columns
                .push(cast(&arrow_array::Int64Array::from(vec![0]), f.data_type()).expect("cast"));
        }
        let computed = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch");
        let rows = conform(&computed, &layout).expect("conform");
        assert_eq!(rows.column(0).as_string::<i32>().value(0), "by name");
    }
}
