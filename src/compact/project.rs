//! A data file's rows in the table's current schema: columns matched by Iceberg field id, so
//! files written before a column was added, renamed, dropped or widened are read as the table
//! reads them now.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef as ArrowSchemaRef;

/// The batch's columns in the order of `schema`, matched by Iceberg field id; a column the
/// file predates (added to the table later) is all nulls, and a column written before its type
/// was widened (int → long, float → double, decimal precision up) is cast to the wider type.
pub fn project(
    batch: &RecordBatch,
    schema: &ArrowSchemaRef,
) -> std::result::Result<RecordBatch, String> {
    const FIELD_ID: &str = "PARQUET:field_id";
    let id = |f: &arrow_schema::Field| f.metadata().get(FIELD_ID).cloned();
    let input = batch.schema();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let found = input
            .fields()
            .iter()
            .position(|f| id(f).is_some() && id(f) == id(field));
        match found {
            Some(i) if batch.column(i).data_type() == field.data_type() => {
                columns.push(batch.column(i).clone())
            }
            Some(i) => columns.push(
                arrow_cast::cast(batch.column(i), field.data_type()).map_err(|e| {
                    format!(
                        "column {} ({} in the file) cannot be read as {}: {e}",
                        field.name(),
                        batch.column(i).data_type(),
                        field.data_type()
                    )
                })?,
            ),
            None if field.is_nullable() => columns.push(arrow_array::new_null_array(
                field.data_type(),
                batch.num_rows(),
            )),
            None => return Err(format!("required column {} is missing", field.name())),
        }
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}
