//! The lookup join: a reference table held in memory, indexed by its join key, probed with each
//! batch of source rows. SQL semantics: a NULL key matches nothing; a key with several
//! reference rows yields one output row per match; an unmatched row is kept with NULLs (LEFT)
//! or dropped (INNER).

use std::sync::Arc;

use crate::df::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use crate::df::arrow::compute::{cast, take};
use crate::df::arrow::datatypes::DataType;
use crate::df::arrow::row::{RowConverter, SortField};
use crate::df::physical_expr::PhysicalExpr;

use super::planner::LookupPlan;

/// A reference table's rows, indexed by one derived table's join key.
pub(crate) struct LookupIndex {
    rows: RecordBatch,
    key_types: Vec<DataType>,
    converter: RowConverter,
    matches: foldhash::HashMap<Box<[u8]>, Vec<u32>>,
}

/// For each output row: the source row, and the reference row (`None`: no match).
pub(crate) struct Matches {
    pub source: UInt32Array,
    pub reference: UInt32Array,
}

fn keys(exprs: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> Result<Vec<ArrayRef>, String> {
    exprs
        .iter()
        .map(|e| {
            e.evaluate(batch)
                .and_then(|v| v.into_array(batch.num_rows()))
                .map_err(|e| e.to_string())
        })
        .collect()
}

impl LookupIndex {
    /// Indexes `rows` (the reference table, in its declared schema) by `plan`'s reference keys.
    pub fn build(plan: &LookupPlan, rows: RecordBatch) -> Result<Self, String> {
        let columns = keys(&plan.reference_keys, &rows)?;
        let key_types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
        let converter = RowConverter::new(
            key_types
                .iter()
                .map(|t| SortField::new(t.clone()))
                .collect(),
        )
        .map_err(|e| e.to_string())?;
        let converted = converter
            .convert_columns(&columns)
            .map_err(|e| e.to_string())?;
        let mut matches: foldhash::HashMap<Box<[u8]>, Vec<u32>> = Default::default();
        for i in 0..rows.num_rows() {
            if columns.iter().any(|c| c.is_null(i)) {
                continue;
            }
            matches
                .entry(converted.row(i).as_ref().into())
                .or_default()
                .push(i as u32);
        }
        Ok(LookupIndex {
            rows,
            key_types,
            converter,
            matches,
        })
    }

    /// The matches of every row of `source` (in source order).
    pub fn probe(&self, plan: &LookupPlan, source: &RecordBatch) -> Result<Matches, String> {
        let mut columns = keys(&plan.source_keys, source)?;
        for (c, t) in columns.iter_mut().zip(&self.key_types) {
            if c.data_type() != t {
                *c = cast(c, t).map_err(|e| e.to_string())?;
            }
        }
        let converted = self
            .converter
            .convert_columns(&columns)
            .map_err(|e| e.to_string())?;
        let mut src = Vec::with_capacity(source.num_rows());
        let mut reference = Vec::with_capacity(source.num_rows());
        for i in 0..source.num_rows() {
            let found = if columns.iter().any(|c| c.is_null(i)) {
                None
            } else {
                self.matches.get(converted.row(i).as_ref())
            };
            match found {
                Some(rows) => {
                    for r in rows {
                        src.push(i as u32);
                        reference.push(Some(*r));
                    }
                }
                None if !plan.inner => {
                    src.push(i as u32);
                    reference.push(None);
                }
                None => {}
            }
        }
        Ok(Matches {
            source: UInt32Array::from(src),
            reference: UInt32Array::from(reference),
        })
    }

    /// The joined rows: `source`'s and the reference's columns in the join's order.
    pub fn join(
        &self,
        plan: &LookupPlan,
        source: &RecordBatch,
        m: &Matches,
    ) -> Result<Vec<ArrayRef>, String> {
        let pick = |batch: &RecordBatch, idx: &UInt32Array| -> Result<Vec<ArrayRef>, String> {
            batch
                .columns()
                .iter()
                .map(|c| take(c.as_ref(), idx, None).map_err(|e| e.to_string()))
                .collect()
        };
        // Each source row once, in order (a LEFT JOIN on a unique reference key): the source's
        // columns as they are, not copied.
        let identity = m.source.len() == source.num_rows()
            && m.source
                .values()
                .iter()
                .enumerate()
                .all(|(i, &s)| s as usize == i);
        let s = if identity {
            source.columns().to_vec()
        } else {
            pick(source, &m.source)?
        };
        let r = pick(&self.rows, &m.reference)?;
        Ok(if plan.source_is_left {
            s.into_iter().chain(r).collect()
        } else {
            r.into_iter().chain(s).collect()
        })
    }
}
