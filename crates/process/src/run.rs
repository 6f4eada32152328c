//! Running a planned derived table on a batch of source rows: join, filter, project, cast to
//! the table's types, and carry the source rows' Kafka columns. A batch that fails as a whole
//! (one row divides by zero, a function panics, a value grows past its limit: see
//! [`crate::guard`]) is run again row by row, so that only the failing rows become dead letters.

use std::sync::Arc;

use crate::df::arrow::array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use crate::df::arrow::compute::{CastOptions, cast_with_options, concat_batches};
use crate::df::arrow::util::display::FormatOptions;

use super::guard::{Limits, contain, value_sizes};
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

/// Runs `plan` on `source` (rows of the source table's layout) into rows of `layout`, held to
/// `limits`: a batch that fails, panics, or makes a row larger than a value may be, or more
/// bytes than a batch may make, is run again row by row; each row that fails on its own is a
/// failure, and so are the rows after the table's rows of the batch passed the batch limit.
pub(crate) fn evaluate(
    plan: &SqlPlan,
    layout: &TableLayout,
    source: &RecordBatch,
    index: Option<&LookupIndex>,
    limits: Limits,
) -> Evaluated {
    super::guard::start_batch();
    let whole = contain(|| evaluate_batch(plan, layout, source, index))
        .and_then(|r| r)
        .and_then(|rows| weigh(&rows, limits).map(|_| rows));
    if let Ok(rows) = whole {
        return Evaluated {
            rows: Some(rows).filter(|r| r.num_rows() > 0),
            failures: Vec::new(),
        };
    }
    let mut ok = Vec::new();
    let mut failures = Vec::new();
    let mut made = 0usize;
    for i in 0..source.num_rows() {
        let row = contain(|| evaluate_batch(plan, layout, &source.slice(i, 1), index))
            .and_then(|r| r)
            .and_then(|rows| weigh(&rows, limits).map(|bytes| (rows, bytes)));
        match row {
            Ok((rows, bytes)) if made.saturating_add(bytes) <= limits.max_batch_bytes => {
                made += bytes;
                ok.push(rows);
            }
            Ok(_) => failures.push((
                i,
                format!(
                    "the table's rows of this batch passed {} bytes, the most a batch may make; the rest of the batch is refused (a smaller batch lands them)",
                    limits.max_batch_bytes
                ),
            )),
            Err(reason) => failures.push((i, reason)),
        }
    }
    let rows = match concat_batches(&layout.arrow_schema, &ok) {
        Ok(rows) => rows,
        Err(e) => {
            // Each row passed on its own; joining them cannot fail, but if it did, no row may
            // be lost: every row is reported instead.
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

/// The bytes of `rows`, or why they are refused: a row larger than a value may be, or more
/// bytes than a batch may make.
fn weigh(rows: &RecordBatch, limits: Limits) -> Result<usize, String> {
    let mut sizes = vec![0usize; rows.num_rows()];
    for c in rows.columns() {
        for (s, v) in sizes.iter_mut().zip(value_sizes(c.as_ref())) {
            *s = s.saturating_add(v);
        }
    }
    if let Some(big) = sizes.iter().copied().find(|s| *s > limits.max_value_bytes) {
        return Err(format!(
            "a derived row of {big} bytes, more than the {} a record may have (max_record_bytes)",
            limits.max_value_bytes
        ));
    }
    let total = sizes.iter().fold(0usize, |n, s| n.saturating_add(*s));
    if total > limits.max_batch_bytes {
        return Err(format!(
            "the table's rows of this batch have {total} bytes, more than the {} a batch may make",
            limits.max_batch_bytes
        ));
    }
    Ok(total)
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
