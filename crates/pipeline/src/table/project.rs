//! A data file's rows in the table's current schema: columns matched by Iceberg field id, so
//! files written before a column was added, renamed, dropped or widened are read as the table
//! reads them now — inside struct columns too.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_schema::{DataType, Field, Fields, SchemaRef as ArrowSchemaRef};

const FIELD_ID: &str = "PARQUET:field_id";

/// The batch's columns in the order of `schema`, matched by Iceberg field id; a column the
/// file predates (added to the table later) is all nulls, and a column written before its type
/// was widened (int → long, float → double, decimal precision up) is cast to the wider type.
pub fn project(
    batch: &RecordBatch,
    schema: &ArrowSchemaRef,
) -> std::result::Result<RecordBatch, String> {
    let input = batch.schema();
    let columns = fields(
        input.fields(),
        batch.columns(),
        schema.fields(),
        batch.num_rows(),
    )?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

/// The arrays of `want`'s fields from `have`'s (`arrays`), matched by field id.
fn fields(
    have: &Fields,
    arrays: &[ArrayRef],
    want: &Fields,
    rows: usize,
) -> std::result::Result<Vec<ArrayRef>, String> {
    let id = |f: &Field| f.metadata().get(FIELD_ID).cloned();
    let mut out = Vec::with_capacity(want.len());
    for field in want {
        let found = have
            .iter()
            .position(|f| id(f).is_some() && id(f) == id(field));
        match found.and_then(|i| arrays.get(i)) {
            Some(array) => out.push(column(array, field)?),
            None if field.is_nullable() => {
                out.push(arrow_array::new_null_array(field.data_type(), rows))
            }
            None => return Err(format!("required column {} is missing", field.name())),
        }
    }
    Ok(out)
}

/// One column as `field` reads it: a struct field by field, anything else cast when its type
/// was widened.
fn column(array: &ArrayRef, field: &Field) -> std::result::Result<ArrayRef, String> {
    if array.data_type() == field.data_type() {
        return Ok(array.clone());
    }
    if let (DataType::Struct(want), Some(s)) = (
        field.data_type(),
        array.as_any().downcast_ref::<StructArray>(),
    ) {
        let children = fields(s.fields(), s.columns(), want, s.len())?;
        return StructArray::try_new(want.clone(), children, s.nulls().cloned())
            .map(|a| Arc::new(a) as ArrayRef)
            .map_err(|e| format!("struct {}: {e}", field.name()));
    }
    arrow_cast::cast(array, field.data_type()).map_err(|e| {
        format!(
            "column {} ({} in the file) cannot be read as {}: {e}",
            field.name(),
            array.data_type(),
            field.data_type()
        )
    })
}
