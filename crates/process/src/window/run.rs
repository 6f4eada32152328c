//! A windowed table on one partition's rows of one batch: assign windows, accumulate, emit the
//! windows the watermark passed and the corrections, dead-letter records past the lateness.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::df::arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, new_null_array,
};
use crate::df::physical_expr::PhysicalExpr;

use super::acc::typed;
use super::{Output, WindowPlan, tvf::human};
use crate::clock::rfc3339_us;
use crate::partition_state::{Acc, OpenWindow, WindowState};
use crate::schema::TableLayout;
use crate::value::{Value, ValueRef, build};

/// Flink's time unit, µs: a window `[start, end)` is final once the watermark reaches its last
/// millisecond, `end - 1 ms` (Flink's `maxTimestamp`), and past its lateness once the
/// watermark reaches `end - 1 ms + lateness`.
pub(crate) const FLINK_UNIT_US: i64 = 1_000;

/// The last instant of a window ending at `end` (µs), as Flink's rules see it.
pub(crate) fn last_instant(end: i64) -> i64 {
    end.saturating_sub(FLINK_UNIT_US)
}

/// Most windows (window and key) one table keeps open in one partition: the partition's state
/// is read and written by every batch. A record that would open one more is a dead letter.
pub(crate) const MAX_OPEN_WINDOWS: usize = 100_000;

/// Why a record that would open a window past [`MAX_OPEN_WINDOWS`] is refused.
pub(super) fn too_many_open(table: &str, partition: i32) -> String {
    format!(
        "derived table {table}: partition {partition} already holds {MAX_OPEN_WINDOWS} open windows, the limit per table and partition; use fewer GROUP BY keys or shorter windows, or a lower out-of-orderness so windows close sooner"
    )
}

/// Where a row's update goes: an open window (`None`: one it opens), or a correction of a
/// window the watermark already closed.
#[derive(Clone, Copy)]
enum Target {
    Open(Option<usize>),
    Correction,
}

/// One partition's rows of a batch, with their event times and watermarks.
pub(crate) struct PartitionInput<'a> {
    /// The rows (the source table's layout), in offset order.
    pub rows: &'a RecordBatch,
    /// Event time of each row, µs (`None`: NULL).
    pub times: &'a [Option<i64>],
    /// The partition's watermark before each row, µs.
    pub watermarks: &'a [Option<i64>],
    /// The watermark before the batch (every window ending at or before it was emitted).
    pub closed_through: Option<i64>,
    /// The watermark after the batch.
    pub watermark: Option<i64>,
    /// The Kafka partition.
    pub partition: i32,
    /// The batch's last offset in the partition, and its latest Kafka timestamp (µs): the
    /// partial rows' Kafka columns.
    pub last_offset: i64,
    pub kafka_timestamp: i64,
}

/// What a windowed table got from one partition's rows.
#[derive(Default)]
pub(crate) struct WindowOutput {
    /// Partial rows (windows closed by this batch, and corrections).
    pub rows: Option<RecordBatch>,
    /// Rows (indices into the input) the SQL failed on.
    pub failures: Vec<(usize, String)>,
    /// Rows later than the allowed lateness for some window, with the reason.
    pub late: Vec<(usize, String)>,
}

/// What one row contributes: its keys and its aggregates' arguments.
pub(super) struct RowValues {
    pub pass: bool,
    /// Shared by every row of the batch with the same key.
    pub key: Arc<[Value]>,
    pub args: Vec<Option<Value>>,
}

/// Runs `plan` on one partition's rows, updating its open windows.
pub(crate) fn run(
    plan: &WindowPlan,
    layout: &TableLayout,
    table: &str,
    lateness_ms: i64,
    input: &PartitionInput<'_>,
    open_windows: &mut WindowState,
) -> WindowOutput {
    if let super::WindowKind::Session { gap_ms } = plan.window {
        return super::session::run(
            plan,
            layout,
            table,
            lateness_ms,
            gap_ms,
            input,
            open_windows,
        );
    }
    let (mut out, values) = match row_values(plan, input.rows) {
        Ok(v) => (WindowOutput::default(), v),
        Err(failed) => return failed,
    };
    let size = plan.window.size_ms() * 1000;
    let lateness = lateness_ms * 1000;
    let closed = input.closed_through.unwrap_or(i64::MIN);
    // Open windows by key, then start: looked up with the row's key borrowed, so a row costs
    // no key clone unless it opens a window.
    let mut index: foldhash::HashMap<Vec<Value>, Vec<(i64, usize)>> = Default::default();
    for (j, w) in open_windows.iter().enumerate() {
        index.entry(w.key.clone()).or_default().push((w.start, j));
    }
    let mut corrections: BTreeMap<(i64, Vec<Value>), Vec<Acc>> = BTreeMap::new();
    let empty = || plan.aggs.iter().map(Acc::new).collect::<Vec<_>>();
    let empty_accs = empty();
    let width = plan.aggs.len();
    // Per row, reused: the windows it goes to, and each one's updated accumulators (`None`:
    // unchanged), all computed before any is applied, so a row that fails changes nothing.
    let (mut targets, mut staged, mut missed) = (Vec::new(), Vec::new(), Vec::new());
    for (i, v) in values.into_iter().enumerate() {
        let v = match v {
            Ok(v) if !v.pass => continue,
            Ok(v) => v,
            Err(reason) => {
                out.failures.push((i, reason));
                continue;
            }
        };
        let Some(t) = input.times[i] else {
            out.failures
                .push((i, "its event time is NULL; a window needs it".into()));
            continue;
        };
        let wm = input.watermarks[i];
        targets.clear();
        staged.clear();
        missed.clear();
        let mut failed = None;
        for start in plan.window.starts(t) {
            let end = start.saturating_add(size);
            if wm.is_some_and(|wm| last_instant(end).saturating_add(lateness) <= wm) {
                missed.push(start);
                continue;
            }
            let target = if last_instant(end) > closed {
                let slot = index
                    .get(&v.key[..])
                    .and_then(|starts| starts.iter().find(|(s, _)| *s == start))
                    .map(|&(_, j)| j);
                let opening = targets
                    .iter()
                    .filter(|(_, t)| matches!(t, Target::Open(None)))
                    .count();
                if slot.is_none() && open_windows.len() + opening >= MAX_OPEN_WINDOWS {
                    failed = Some(too_many_open(table, input.partition));
                    break;
                }
                Target::Open(slot)
            } else {
                Target::Correction
            };
            let current = match target {
                Target::Open(Some(j)) => &open_windows[j].accs,
                Target::Open(None) => &empty_accs,
                Target::Correction => corrections
                    .get(&(start, v.key.to_vec()))
                    .unwrap_or(&empty_accs),
            };
            for (k, agg) in plan.aggs.iter().enumerate() {
                let updated = match current.get(k) {
                    Some(acc) => acc.updated(agg, v.args.get(k).and_then(Option::as_ref)),
                    None => Err(format!(
                        "derived table {table}: the stored window [{}, …) does not fit the plan",
                        rfc3339_us(start)
                    )),
                };
                match updated {
                    Ok(a) => staged.push(a),
                    Err(e) => {
                        staged.push(None);
                        failed = Some(e);
                    }
                }
            }
            targets.push((start, target));
        }
        if let Some(e) = failed {
            out.failures.push((i, e));
            continue;
        }
        for (w, &(start, target)) in targets.iter().enumerate() {
            let new = &mut staged[w * width..(w + 1) * width];
            let accs = match target {
                Target::Open(Some(j)) => &mut open_windows[j].accs,
                Target::Open(None) => {
                    index
                        .entry(v.key.to_vec())
                        .or_default()
                        .push((start, open_windows.len()));
                    open_windows.push(OpenWindow {
                        start,
                        end: None,
                        key: v.key.to_vec(),
                        accs: empty(),
                    });
                    let last = open_windows.len() - 1;
                    &mut open_windows[last].accs
                }
                Target::Correction => corrections
                    .entry((start, v.key.to_vec()))
                    .or_insert_with(empty),
            };
            for (slot, a) in accs.iter_mut().zip(new.iter_mut()) {
                if let Some(a) = a.take() {
                    *slot = a;
                }
            }
        }
        if let (Some(&start), Some(wm)) = (missed.first(), wm) {
            out.late.push((
                i,
                format!(
                    "derived table {table}: event time {} is late for window [{}, {}): the partition's watermark was {}, past the window's end plus the allowed lateness ({})",
                    rfc3339_us(t),
                    rfc3339_us(start),
                    rfc3339_us(start.saturating_add(size)),
                    rfc3339_us(wm),
                    human(lateness_ms)
                ),
            ));
        }
    }
    // Emit the windows the watermark passed, oldest first, then the corrections.
    let wm = input.watermark.unwrap_or(i64::MIN);
    let (mut done, open): (Vec<OpenWindow>, Vec<OpenWindow>) = std::mem::take(open_windows)
        .into_iter()
        .partition(|w| last_instant(w.start.saturating_add(size)) <= wm);
    *open_windows = open;
    done.sort_by(|a, b| (a.start, &a.key).cmp(&(b.start, &b.key)));
    done.extend(
        corrections
            .into_iter()
            .map(|((start, key), accs)| OpenWindow {
                start,
                end: None,
                key,
                accs,
            }),
    );
    if !done.is_empty() {
        match partial_rows(plan, layout, &done, input) {
            Ok(rows) => out.rows = Some(rows),
            Err(e) => tracing::error!(table, error = %e, "partial rows could not be built"),
        }
    }
    out
}

/// [`values`], or the output that fails every row with the reason.
pub(super) fn row_values(
    plan: &WindowPlan,
    rows: &RecordBatch,
) -> Result<Vec<Result<RowValues, String>>, WindowOutput> {
    values(plan, rows).map_err(|reason| WindowOutput {
        failures: (0..rows.num_rows()).map(|i| (i, reason.clone())).collect(),
        ..Default::default()
    })
}

/// Each row's filter result, keys and aggregate arguments; evaluated on the whole batch, and
/// row by row when that fails (so that only failing rows are reported).
pub(super) fn values(
    plan: &WindowPlan,
    rows: &RecordBatch,
) -> Result<Vec<Result<RowValues, String>>, String> {
    let n = rows.num_rows();
    let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
    for f in plan.input_schema.fields().iter().skip(columns.len()) {
        columns.push(new_null_array(f.data_type(), n));
    }
    let input = RecordBatch::try_new_with_options(
        plan.input_schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(n)),
    )
    .map_err(|e| e.to_string())?;
    // A panic evaluating the SQL fails the batch, then the row, as an error does.
    crate::guard::start_batch();
    let guarded =
        |rows: &RecordBatch| crate::guard::contain(|| evaluate(plan, rows)).and_then(|r| r);
    match guarded(&input) {
        Ok(v) => Ok(v.into_iter().map(Ok).collect()),
        Err(_) => Ok((0..n)
            .map(|i| {
                guarded(&input.slice(i, 1))
                    .and_then(|mut v| v.pop().ok_or_else(|| "no value".to_string()))
            })
            .collect()),
    }
}

fn evaluate(plan: &WindowPlan, input: &RecordBatch) -> Result<Vec<RowValues>, String> {
    let n = input.num_rows();
    let eval = |e: &Arc<dyn PhysicalExpr>| {
        e.evaluate(input)
            .and_then(|v| v.into_array(n))
            .map_err(|e| e.to_string())
    };
    let pass = match &plan.filter {
        Some(f) => {
            let a = eval(f)?;
            let b = a
                .as_any()
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| format!("WHERE is of type {}, not boolean", a.data_type()))?
                .clone();
            Some(b)
        }
        None => None,
    };
    let keys: Vec<ArrayRef> = plan.keys.iter().map(eval).collect::<Result<_, _>>()?;
    let args: Vec<Option<ArrayRef>> = plan
        .aggs
        .iter()
        .map(|a| a.arg.as_ref().map(eval).transpose())
        .collect::<Result<_, _>>()?;
    let cell = |a: &ArrayRef, i: usize| {
        Value::of(a.as_ref(), i)
            .ok_or_else(|| format!("a value of type {} cannot be grouped", a.data_type()))
    };
    // Keys are interned: a row reads its key borrowed and shares the batch's copy of it.
    let mut interned: foldhash::HashMap<Vec<ValueRef<'_>>, Arc<[Value]>> = Default::default();
    let mut probe: Vec<ValueRef<'_>> = Vec::with_capacity(keys.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        probe.clear();
        for k in &keys {
            probe.push(
                ValueRef::of(k.as_ref(), i).ok_or_else(|| {
                    format!("a value of type {} cannot be grouped", k.data_type())
                })?,
            );
        }
        let key = match interned.get(probe.as_slice()) {
            Some(key) => key.clone(),
            None => {
                let key: Arc<[Value]> = probe.iter().map(|c| c.to_cell()).collect();
                interned.insert(probe.clone(), key.clone());
                key
            }
        };
        let mut row_args = Vec::with_capacity(args.len());
        for a in &args {
            row_args.push(a.as_ref().map(|a| cell(a, i)).transpose()?);
        }
        out.push(RowValues {
            pass: pass.as_ref().is_none_or(|p| p.is_valid(i) && p.value(i)),
            key,
            args: row_args,
        });
    }
    Ok(out)
}

/// Partial rows for `windows`, in `layout`'s schema (partial columns, then the Kafka columns).
pub(super) fn partial_rows(
    plan: &WindowPlan,
    layout: &TableLayout,
    windows: &[OpenWindow],
    input: &PartitionInput<'_>,
) -> Result<RecordBatch, String> {
    let size = plan.window.size_ms() * 1000;
    let mut cells: Vec<Vec<Value>> = Vec::new();
    for (_, o, _) in &plan.outputs {
        match o {
            Output::WindowStart => {
                cells.push(windows.iter().map(|w| Value::Int(w.start)).collect())
            }
            Output::WindowEnd => cells.push(
                windows
                    .iter()
                    .map(|w| Value::Int(w.end.unwrap_or(w.start.saturating_add(size))))
                    .collect(),
            ),
            Output::Key(k) => cells.push(
                windows
                    .iter()
                    .map(|w| w.key.get(*k).cloned().unwrap_or(Value::Null))
                    .collect(),
            ),
            Output::Agg(a) => {
                let parts: Vec<Vec<Value>> = windows
                    .iter()
                    .map(|w| {
                        w.accs
                            .get(*a)
                            .map(|acc| acc.partial(&plan.aggs[*a]))
                            .ok_or_else(|| {
                                format!(
                                    "window [{}, …) has no accumulator {a}",
                                    rfc3339_us(w.start)
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?;
                let width = parts.first().map_or(0, Vec::len);
                for c in 0..width {
                    cells.push(parts.iter().map(|p| p[c].clone()).collect());
                }
            }
        }
    }
    let fields = layout.arrow_schema.fields();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len());
    for (column, field) in cells.into_iter().zip(fields.iter()) {
        let column: Vec<Value> = column
            .into_iter()
            .map(|c| typed(c, field.data_type()))
            .collect();
        let refs: Vec<&Value> = column.iter().collect();
        columns.push(
            build(field.data_type(), &refs).ok_or_else(|| {
                format!("column {} cannot hold the window's values", field.name())
            })?,
        );
    }
    let n = windows.len();
    let kafka = [
        Value::Int(input.partition.into()),
        Value::Int(input.last_offset),
        Value::Int(input.kafka_timestamp),
    ];
    for value in kafka {
        let Some(field) = fields.get(columns.len()) else {
            break;
        };
        let refs = vec![&value; n];
        columns.push(
            build(field.data_type(), &refs)
                .ok_or_else(|| format!("column {} cannot hold {value:?}", field.name()))?,
        );
    }
    for f in fields.iter().skip(columns.len()) {
        columns.push(new_null_array(f.data_type(), n));
    }
    RecordBatch::try_new(layout.arrow_schema.clone(), columns).map_err(|e| e.to_string())
}
