//! The stateful derived tables of a source, run partition by partition: each partition's rows
//! (in offset order) with that partition's watermark and state. The watermark before each row
//! is computed once and shared by every table, so lateness depends only on the records before
//! a row in its partition, never on how the records were split into batches.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::df::arrow::compute::{concat_batches, filter_record_batch};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, BooleanArray, RecordBatch};

use super::dedup::first_occurrences;
use super::partition_state::PartitionState;
use super::planner::Plan;
use super::processor::{Derived, Processor};
use super::window::{PartitionInput, run};
use crate::error::{Error, Result};

/// How long the state of a table the current plan does not know is kept after a plan that
/// knew it last wrote it, ms: a day, longer than any rolling deploy.
pub const UNKNOWN_STATE_GRACE_MS: i64 = 24 * 3_600_000;

/// Consecutive runs of rows of one Kafka partition.
fn partition_runs(rows: &RecordBatch) -> Result<Vec<(i32, Range<usize>)>> {
    let partitions = rows
        .column_by_name(crate::kafka::PARTITION)
        .and_then(|c| c.as_primitive_opt::<Int32Type>())
        .ok_or_else(|| Error::Internal("rows carry no kafka_partition".into()))?;
    let mut runs: Vec<(i32, Range<usize>)> = Vec::new();
    for i in 0..rows.num_rows() {
        let p = partitions.value(i);
        match runs.last_mut() {
            Some((q, r)) if *q == p => r.end = i + 1,
            _ => runs.push((p, i..i + 1)),
        }
    }
    Ok(runs)
}

fn max_of<T: arrow_array::ArrowPrimitiveType<Native = i64>>(rows: &RecordBatch, name: &str) -> i64 {
    rows.column_by_name(name)
        .and_then(|c| c.as_primitive_opt::<T>())
        .and_then(|a| a.iter().flatten().max())
        .unwrap_or(0)
}

impl Processor {
    pub(super) fn derive_stateful(
        &self,
        source: &str,
        rows: &RecordBatch,
        states: &mut BTreeMap<i32, PartitionState>,
        now_ms: i64,
    ) -> Result<Vec<Derived>> {
        let time = *self.times.get(source).ok_or_else(|| {
            Error::Internal(format!(
                "stateful tables of {source}, which has no event time"
            ))
        })?;
        let tables: Vec<_> = self
            .tables
            .iter()
            .filter(|t| t.source == source && t.is_stateful())
            .collect();
        let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); tables.len()];
        // Per row-by-row table: which rows of the batch its dedup kept.
        let mut row_masks: Vec<Option<Vec<bool>>> = vec![None; tables.len()];
        let mut out: Vec<Derived> = tables
            .iter()
            .map(|t| Derived {
                table: t.name.clone(),
                layout: t.layout.clone(),
                rows: None,
                failures: Vec::new(),
                late: Vec::new(),
                future: Vec::new(),
                deduplicated: 0,
            })
            .collect();
        for (partition, range) in partition_runs(rows)? {
            let slice = rows.slice(range.start, range.len());
            let times: Vec<Option<i64>> = {
                let c = slice.column(time.column);
                let ts = c
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| {
                        Error::Internal(format!(
                            "event time of {source} is of type {}",
                            c.data_type()
                        ))
                    })?;
                (0..ts.len())
                    .map(|i| ts.is_valid(i).then(|| ts.value(i)))
                    .collect()
            };
            // An event time further ahead of its record's Kafka timestamp than the table allows
            // (a producer's clock, a typo: year 9999) is not believed: it must not move the
            // watermark (every later record would be late, every dedup key expired).
            let ahead: Vec<Option<String>> = {
                let kafka = slice
                    .column_by_name(crate::kafka::TIMESTAMP)
                    .and_then(|c| c.as_primitive_opt::<TimestampMicrosecondType>());
                // The Kafka timestamp may be the producer's (CreateTime) and as wrong as the
                // event time: the bound is the earlier of it and this invocation's clock.
                let now_us = now_ms.saturating_mul(1000);
                times
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        // A record without a timestamp (Kafka's -1, NO_TIMESTAMP_TYPE) is
                        // bounded by the clock alone.
                        let k = kafka
                            .filter(|k| k.is_valid(i) && k.value(i) >= 0)
                            .map_or(now_us, |k| k.value(i).min(now_us));
                        let t = (*t)?;
                        (t > k.saturating_add(time.max_ahead_us)).then(|| {
                            format!(
                                "event time {} is more than {} ahead of the record's Kafka timestamp (or of the time it was ingested, if earlier) {}: the stateful tables of {source} do not believe it (it would move the watermark there); the topic's own table has the record",
                                crate::clock::rfc3339_us(t),
                                super::window::tvf::human(time.max_ahead_us / 1000),
                                crate::clock::rfc3339_us(k)
                            )
                        })
                    })
                    .collect()
            };
            let any_ahead = ahead.iter().any(Option::is_some);
            // Times as the stateful tables see them: an unbelieved one is NULL (never a dedup
            // key, never the watermark) and its row is left out below.
            let times: Vec<Option<i64>> = if any_ahead {
                times
                    .iter()
                    .zip(&ahead)
                    .map(|(t, a)| if a.is_some() { None } else { *t })
                    .collect()
            } else {
                times
            };
            let state = states.entry(partition).or_default();
            let wm = |max: Option<i64>| max.map(|m| m.saturating_sub(time.out_of_orderness_us));
            let mut max = state.max_event_time;
            let mut watermarks = Vec::with_capacity(times.len());
            for t in &times {
                watermarks.push(wm(max));
                if let Some(t) = t {
                    max = Some(max.map_or(*t, |m| m.max(*t)));
                }
            }
            let (closed_through, watermark) = (wm(state.max_event_time), wm(max));
            let last_offset = max_of::<Int64Type>(&slice, crate::kafka::OFFSET);
            let kafka_timestamp =
                max_of::<TimestampMicrosecondType>(&slice, crate::kafka::TIMESTAMP);
            for (k, t) in tables.iter().enumerate() {
                let table_state = state.tables.entry(t.name.clone()).or_default();
                t.adopt(partition, table_state);
                table_state.written_at_ms = now_ms;
                let keep = t.dedup.as_ref().map(|(dedup, columns)| {
                    first_occurrences(
                        dedup,
                        columns,
                        &slice,
                        &times,
                        &watermarks,
                        watermark,
                        &mut table_state.keys,
                    )
                });
                if let Some(keep) = &keep {
                    out[k].deduplicated += keep.iter().filter(|k| !**k).count() as u64;
                }
                let keep = if any_ahead {
                    let label = crate::spec::derived_name(&t.name);
                    for (i, a) in ahead.iter().enumerate() {
                        if let Some(reason) = a {
                            out[k].future.push((
                                range.start + i,
                                format!("derived table {label}: {reason}"),
                            ));
                        }
                    }
                    let mut keep = keep.unwrap_or_else(|| vec![true; slice.num_rows()]);
                    for (kept, a) in keep.iter_mut().zip(&ahead) {
                        *kept &= a.is_none();
                    }
                    Some(keep)
                } else {
                    keep
                };
                if let Plan::Rows(_) = &t.plan {
                    // Row-by-row SQL needs no partition order: it runs once on the whole batch
                    // after the loop, on the rows every partition's dedup kept.
                    let mask = row_masks[k].get_or_insert_with(|| vec![true; rows.num_rows()]);
                    if let Some(keep) = keep {
                        mask[range.clone()].copy_from_slice(&keep);
                    }
                    continue;
                }
                // Dedup first: the rows kept, and where they were in the slice.
                let (kept, positions, kept_times, kept_marks) = match keep {
                    Some(keep) => {
                        let positions: Vec<usize> = (0..keep.len()).filter(|i| keep[*i]).collect();
                        let mask = BooleanArray::from(keep);
                        let kept = filter_record_batch(&slice, &mask)
                            .map_err(|e| Error::Internal(format!("dedup of {source}: {e}")))?;
                        let kt = positions.iter().map(|&i| times[i]).collect::<Vec<_>>();
                        let km = positions.iter().map(|&i| watermarks[i]).collect::<Vec<_>>();
                        (kept, positions, kt, km)
                    }
                    None => (
                        slice.clone(),
                        (0..slice.num_rows()).collect(),
                        times.clone(),
                        watermarks.clone(),
                    ),
                };
                let at = |i: usize| range.start + positions[i];
                match &t.plan {
                    Plan::Window(plan) => {
                        let input = PartitionInput {
                            rows: &kept,
                            times: &kept_times,
                            watermarks: &kept_marks,
                            closed_through,
                            watermark,
                            partition,
                            last_offset,
                            kafka_timestamp,
                        };
                        let label = crate::spec::derived_name(&t.name);
                        let w = run(
                            plan,
                            &t.layout,
                            label,
                            t.lateness_ms,
                            &input,
                            &mut table_state.open,
                        );
                        parts[k].extend(w.rows);
                        out[k]
                            .failures
                            .extend(w.failures.into_iter().map(|(i, r)| (at(i), r)));
                        out[k]
                            .late
                            .extend(w.late.into_iter().map(|(i, r)| (at(i), r)));
                    }
                    // Rows: after the loop; joins: never in `tables` (the scheduled stage).
                    Plan::Rows(_) | Plan::Join(_) => {}
                }
            }
            state.max_event_time = max;
            state.updated_at_ms = now_ms;
            // A table this plan does not know keeps its state for a while: an older or newer
            // release may still be running (a rolling deploy) and own it.
            state.tables.retain(|name, s| {
                tables.iter().any(|t| &t.name == name)
                    || s.written_at_ms.saturating_add(UNKNOWN_STATE_GRACE_MS) > now_ms
            });
        }
        for (k, mask) in row_masks.into_iter().enumerate() {
            let Some(mask) = mask else { continue };
            let positions: Vec<usize> = (0..mask.len()).filter(|i| mask[*i]).collect();
            let kept = if positions.len() == mask.len() {
                rows.clone()
            } else {
                filter_record_batch(rows, &BooleanArray::from(mask))
                    .map_err(|e| Error::Internal(format!("dedup of {source}: {e}")))?
            };
            let e = self.evaluate_rows(tables[k], &kept)?;
            parts[k].extend(e.rows);
            out[k]
                .failures
                .extend(e.failures.into_iter().map(|(i, r)| (positions[i], r)));
        }
        for (k, batches) in parts.into_iter().enumerate() {
            if batches.is_empty() {
                continue;
            }
            let rows = concat_batches(&out[k].layout.arrow_schema, &batches)
                .map_err(|e| Error::Internal(format!("rows of {}: {e}", out[k].table)))?;
            out[k].rows = Some(rows).filter(|r| r.num_rows() > 0);
        }
        Ok(out)
    }
}

impl Processor {
    /// Closes every open window of `state` (partition `partition` of table `source`) into
    /// partial rows, whatever the watermark.
    pub fn close_all(
        &self,
        source: &str,
        partition: i32,
        last_offset: i64,
        state: &mut PartitionState,
    ) -> Result<Vec<Derived>> {
        self.close_until(source, partition, last_offset, state, i64::MAX)
    }

    /// Moves the partition's watermark up to `watermark` (µs; an idle partition, where the
    /// topic's other partitions already are) and closes the windows it passes. Nothing when
    /// the watermark is there already.
    pub fn advance_watermark(
        &self,
        source: &str,
        partition: i32,
        last_offset: i64,
        state: &mut PartitionState,
        watermark: i64,
    ) -> Result<Vec<Derived>> {
        let ooo = self.times.get(source).map_or(0, |t| t.out_of_orderness_us);
        let max = watermark.saturating_add(ooo);
        if state.max_event_time.is_some_and(|m| m >= max) {
            return Ok(Vec::new());
        }
        state.max_event_time = Some(max);
        self.close_until(source, partition, last_offset, state, watermark)
    }

    fn close_until(
        &self,
        source: &str,
        partition: i32,
        last_offset: i64,
        state: &mut PartitionState,
        watermark: i64,
    ) -> Result<Vec<Derived>> {
        let mut out = Vec::new();
        for t in self.tables.iter().filter(|t| t.source == source) {
            let (Plan::Window(plan), Some(table_state)) = (&t.plan, state.tables.get_mut(&t.name))
            else {
                continue;
            };
            t.adopt(partition, table_state);
            let empty = RecordBatch::new_empty(plan_source_schema(plan));
            let input = PartitionInput {
                rows: &empty,
                times: &[],
                watermarks: &[],
                closed_through: None,
                watermark: Some(watermark),
                partition,
                last_offset,
                kafka_timestamp: state.updated_at_ms.saturating_mul(1000),
            };
            let w = run(
                plan,
                &t.layout,
                &t.name,
                t.lateness_ms,
                &input,
                &mut table_state.open,
            );
            out.push(Derived {
                table: t.name.clone(),
                layout: t.layout.clone(),
                rows: w.rows,
                failures: Vec::new(),
                late: Vec::new(),
                future: Vec::new(),
                deduplicated: 0,
            });
        }
        Ok(out)
    }
}

/// The source's columns of a window plan's input (without `window_start`, `window_end`).
fn plan_source_schema(plan: &super::window::WindowPlan) -> arrow_schema::SchemaRef {
    let fields = plan.input_schema.fields();
    std::sync::Arc::new(arrow_schema::Schema::new(
        fields
            .iter()
            .take(fields.len().saturating_sub(2))
            .cloned()
            .collect::<Vec<_>>(),
    ))
}
