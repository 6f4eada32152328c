//! Session windows on one partition's rows: per key, events less than the gap apart share a
//! window `[first event, last event + gap)`.
//!
//! Sessions merge as Flink's do: a new event's window `[t, t + gap)` merges with every open
//! session it touches, ends included (events exactly a gap apart share a session). A session
//! can grow or merge until the watermark reaches its last millisecond (`end - 1 ms`, Flink's
//! `maxTimestamp`), and with an allowed lateness until it reaches that plus the lateness. It is
//! emitted only then, once and final: a partial row that a later merge would have to retract
//! never exists. Unlike Flink (which retracts and re-emits), a record is therefore late when it
//! could touch a session already emitted — its event time at or before the watermark minus the
//! allowed lateness plus 1 ms; it is a dead letter of kind `late`.
//!
//! Sessions are kept per Kafka partition: they are exact when a key's events share a partition,
//! which is what producers keying the topic by the session key (a sensor id) give.

use std::sync::Arc;

use super::run::{
    FLINK_UNIT_US, MAX_OPEN_WINDOWS, PartitionInput, WindowOutput, last_instant, partial_rows,
    row_values, too_many_open,
};
use super::{WindowPlan, tvf::human};
use crate::clock::rfc3339_us;
use crate::partition_state::{Acc, OpenWindow, WindowState};
use crate::schema::TableLayout;
use crate::value::Value;

/// Runs the session window `plan` (gap `gap_ms`) on one partition's rows, updating its open
/// sessions.
pub(crate) fn run(
    plan: &WindowPlan,
    layout: &TableLayout,
    table: &str,
    lateness_ms: i64,
    gap_ms: i64,
    input: &PartitionInput<'_>,
    sessions: &mut WindowState,
) -> WindowOutput {
    let (mut out, values) = match row_values(plan, input.rows) {
        Ok(v) => (WindowOutput::default(), v),
        Err(failed) => return failed,
    };
    let gap = gap_ms.saturating_mul(1000);
    let lateness = lateness_ms.saturating_mul(1000);
    let end_of = |w: &OpenWindow| w.end.unwrap_or(w.start.saturating_add(gap));
    // Open sessions by key (the batch's shared copy of a key: a row adds no key copy for it).
    let mut by_key: foldhash::HashMap<Arc<[Value]>, Vec<OpenWindow>> = Default::default();
    let mut open_count = sessions.len();
    for w in std::mem::take(sessions) {
        by_key
            .entry(Arc::from(w.key.as_slice()))
            .or_default()
            .push(w);
    }
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
                .push((i, "its event time is NULL; a session needs it".into()));
            continue;
        };
        // Sessions ending at or before `bound` may have been emitted (a session is emitted once
        // the watermark reaches its last millisecond plus the lateness), and a record merges
        // with a session it touches: one at or before `bound` could reach an emitted session.
        if let Some(wm) = input.watermarks[i]
            && t <= wm.saturating_sub(lateness).saturating_add(FLINK_UNIT_US)
        {
            let bound = wm.saturating_sub(lateness).saturating_add(FLINK_UNIT_US);
            out.late.push((
                i,
                format!(
                    "derived table {table}: event time {} is late for its session: the partition's watermark was {}, and sessions that ended at or before {} (the watermark minus the allowed lateness, {}, plus 1 ms) may have been emitted",
                    rfc3339_us(t),
                    rfc3339_us(wm),
                    rfc3339_us(bound),
                    human(lateness_ms)
                ),
            ));
            continue;
        }
        let mut window = OpenWindow {
            start: t,
            end: Some(t.saturating_add(gap)),
            key: v.key.to_vec(),
            accs: plan.aggs.iter().map(Acc::new).collect(),
        };
        let mut failed = None;
        for (k, agg) in plan.aggs.iter().enumerate() {
            match window.accs[k].updated(agg, v.args.get(k).and_then(Option::as_ref)) {
                Ok(Some(a)) => window.accs[k] = a,
                Ok(None) => {}
                Err(e) => failed = Some(e),
            }
        }
        let open = by_key.entry(v.key).or_default();
        // Merge every open session the new window touches: Flink's `TimeWindow.intersects` is
        // inclusive, so events exactly a gap apart share a session.
        let (touching, rest): (Vec<OpenWindow>, Vec<OpenWindow>) = std::mem::take(open)
            .into_iter()
            .partition(|s| s.start <= end_of(&window) && window.start <= end_of(s));
        *open = rest;
        for s in &touching {
            if failed.is_some() {
                break;
            }
            window.start = window.start.min(s.start);
            window.end = Some(end_of(&window).max(end_of(s)));
            for (k, agg) in plan.aggs.iter().enumerate() {
                let merged = match (s.accs.get(k), window.accs.get(k)) {
                    (Some(a), Some(b)) => a.merged(b, agg),
                    _ => Err(format!(
                        "derived table {table}: the stored session from {} does not fit the plan",
                        rfc3339_us(s.start)
                    )),
                };
                match merged {
                    Ok(a) => window.accs[k] = a,
                    Err(e) => failed = Some(e),
                }
            }
        }
        if failed.is_none() && touching.is_empty() {
            open_count += 1;
            if open_count > MAX_OPEN_WINDOWS {
                open_count -= 1;
                failed = Some(too_many_open(table, input.partition));
            }
        } else if failed.is_none() {
            open_count -= touching.len() - 1;
        }
        match failed {
            Some(e) => {
                open.extend(touching);
                out.failures.push((i, e));
            }
            None => open.push(window),
        }
    }
    // Emit the sessions whose end plus the lateness the watermark passed, oldest first.
    let wm = input.watermark.unwrap_or(i64::MIN);
    let mut done = Vec::new();
    for (_, open) in by_key {
        for s in open {
            if last_instant(end_of(&s)).saturating_add(lateness) <= wm {
                done.push(s);
            } else {
                sessions.push(s);
            }
        }
    }
    sessions.sort_by(|a, b| (a.start, &a.key).cmp(&(b.start, &b.key)));
    done.sort_by(|a, b| (a.start, &a.key).cmp(&(b.start, &b.key)));
    if !done.is_empty() {
        match partial_rows(plan, layout, &done, input) {
            Ok(rows) => out.rows = Some(rows),
            Err(e) => tracing::error!(table, error = %e, "session rows could not be built"),
        }
    }
    out
}
