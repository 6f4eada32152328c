//! Running a planned derived table on a batch of source rows: join, filter, project, cast to
//! the table's types, and carry the source rows' Kafka columns. A batch that fails as a whole
//! (one row divides by zero) is run again row by row, so that only the failing rows become
//! dead letters.

use std::sync::Arc;

use crate::df::arrow::array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use crate::df::arrow::compute::{CastOptions, cast_with_options, concat_batches};
use crate::df::arrow::util::display::FormatOptions;

use super::lookup::LookupIndex;
use super::planner::SqlPlan;
use crate::kafka;
use crate::schema::TableLayout;

/// The rows a derived table gets from one batch, and the source rows that failed it.
pub struct Evaluated {
    /// The derived rows, in the table's Arrow schema (`None`: no row).
    pub rows: Option<RecordBatch>,
    /// Source rows (indices into the source batch) whose evaluation failed, with the reason.
    pub failures: Vec<(usize, String)>,
}

/// Runs `plan` on `source` (rows of the source table's layout) into rows of `layout`.
pub(crate) fn evaluate(
    plan: &SqlPlan,
    layout: &TableLayout,
    source: &RecordBatch,
    index: Option<&LookupIndex>,
) -> Evaluated {
    match evaluate_batch(plan, layout, source, index) {
        Ok(rows) => Evaluated {
            rows: Some(rows).filter(|r| r.num_rows() > 0),
            failures: Vec::new(),
        },
        Err(_) => {
            let mut ok = Vec::new();
            let mut failures = Vec::new();
            for i in 0..source.num_rows() {
                match evaluate_batch(plan, layout, &source.slice(i, 1), index) {
                    Ok(rows) => ok.push(rows),
                    Err(reason) => failures.push((i, reason)),
                }
            }
            let rows = match concat_batches(&layout.arrow_schema, &ok) {
                Ok(rows) => rows,
                Err(e) => {
                    // Each row passed on its own; joining them cannot fail, but if it did, no row
                    // may be lost: every row is reported instead.
                    let reason = e.to_string();
                    return Evaluated {
                        rows: None,
                        failures: (0..source.num_rows())
                            .map(|i| (i, reason.clone()))
                            .collect(),
                    };
                }
            };
            Evaluated {
                rows: Some(rows).filter(|r| r.num_rows() > 0),
                failures,
            }
        }
    }
}

fn evaluate_batch(
    plan: &SqlPlan,
    layout: &TableLayout,
    source: &RecordBatch,
    index: Option<&LookupIndex>,
) -> Result<RecordBatch, String> {
    let (columns, rows) = match (&plan.lookup, index) {
        (Some(lookup), Some(index)) => {
            let m = index.probe(lookup, source)?;
            (index.join(lookup, source, &m)?, m.source.len())
        }
        (Some(lookup), None) => {
            return Err(format!(
                "reference table {} is not loaded",
                lookup.reference
            ));
        }
        (None, _) => (source.columns().to_vec(), source.num_rows()),
    };
    let input = RecordBatch::try_new_with_options(
        plan.input_schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )
    .map_err(|e| e.to_string())?;
    let input = match &plan.filter {
        Some(predicate) => {
            let mask = predicate
                .evaluate(&input)
                .and_then(|v| v.into_array(input.num_rows()))
                .map_err(|e| e.to_string())?;
            let mask = mask
                .as_any()
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| format!("WHERE is of type {}, not boolean", mask.data_type()))?;
            crate::df::arrow::compute::filter_record_batch(&input, mask)
                .map_err(|e| e.to_string())?
        }
        None => input,
    };
    let n = input.num_rows();
    let options = CastOptions {
        safe: false,
        format_options: FormatOptions::default(),
    };
    let mut out: Vec<ArrayRef> = Vec::with_capacity(layout.arrow_schema.fields().len());
    for ((name, expr, _), field) in plan.projection.iter().zip(layout.arrow_schema.fields()) {
        let value = expr
            .evaluate(&input)
            .and_then(|v| v.into_array(n))
            .map_err(|e| format!("{name}: {e}"))?;
        out.push(if value.data_type() == field.data_type() {
            value
        } else {
            cast_with_options(&value, field.data_type(), &options)
                .map_err(|e| format!("{name}: {e}"))?
        });
    }
    // The five Kafka columns every table has (not the source's `kafka_headers`, which follows
    // them in a table that has it: a derived table does not carry it).
    let kafka_start = plan.source_offset
        + source
            .schema()
            .index_of(kafka::PARTITION)
            .map_err(|e| e.to_string())?;
    for i in 0..kafka::COLUMNS.len() {
        out.push(Arc::clone(input.column(kafka_start + i)));
    }
    RecordBatch::try_new(layout.arrow_schema.clone(), out).map_err(|e| e.to_string())
}
