//! An interval join's part of a commit round: a unit of its own ([`super::RoundUnit::Join`]),
//! run beside the tables' parts. The join runs over the sides' files the round lands, then
//! commits its late rows and its output with its new state; a round that cannot run is deferred
//! into the join's backlog after two attempts, so that it never holds the other tables back.

use std::sync::Arc;

use iceberg::table::Table;
use serde::Serialize;

use super::select::{Selector, TableFiles};
use super::{
    JoinStats, RoundFiles, RoundUnit, TableCommitReport, UnitContext, commit_table, find_commit,
    join,
};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::table::JOIN_STATE_PROPERTY;
use crate::tables::TableSet;

/// An interval join's part of a round.
pub(super) struct JoinUnit {
    name: String,
    join: crate::spec::IntervalJoin,
    table: Table,
    left: Vec<iceberg::spec::DataFile>,
    right: Vec<iceberg::spec::DataFile>,
}

/// The interval joins whose sides the round lands rows of, with their tables.
pub(super) async fn join_units(
    tables: &TableSet,
    selector: &mut Selector<'_>,
    by_table: &RoundFiles,
) -> Result<Vec<RoundUnit>> {
    let mut out = Vec::new();
    for (name, j) in &tables.joins {
        let lands = |t: &str| by_table.get(t).filter(|f| !f.lands_nothing());
        let (left, right) = (lands(&j.left.table), lands(&j.right.table));
        if left.is_none() && right.is_none() {
            continue;
        }
        let files =
            |f: Option<&Arc<TableFiles>>| f.map(|f| f.data_files.clone()).unwrap_or_default();
        out.push(RoundUnit::Join(Box::new(JoinUnit {
            name: name.clone(),
            join: j.clone(),
            table: selector.table(name).await?,
            left: files(left),
            right: files(right),
        })));
    }
    Ok(out)
}

/// Runs and commits an interval join whose sides the intent lands rows of (see [`join`]):
/// the late rows to `dead_letters` first, then the joined rows with the join's new state, so
/// that the join table's commit id alone says whether the round landed.
pub(super) async fn commit_join(c: &UnitContext, unit: JoinUnit) -> Result<Vec<TableCommitReport>> {
    let (backend, tables, intent) = (&c.backend, &*c.tables, &c.intent);
    let JoinUnit {
        name,
        join: j,
        table: t,
        left: left_files,
        right: right_files,
    } = unit;
    let name = &name;
    let mut out = Vec::new();
    let id = format!("{}/{name}", intent.id);
    let t = match backend.catalog.load(&tables.ident(name)).await? {
        Some((t, _)) => t,
        None => t,
    };
    if let Some(snapshot) = find_commit(&t, &id) {
        out.push(TableCommitReport {
            table: name.clone(),
            snapshot_id: Some(snapshot),
            already_committed: true,
            ..Default::default()
        });
        return Ok(out);
    }
    let now_ms = intent.created_at_ms;
    // A round that cannot run must not hold the other tables back: after it failed (or
    // crashed the process) twice for this intent, or while a deferred backlog waits for
    // its retry, its files go to the join's backlog in an empty snapshot under its commit
    // id, and the intent finishes.
    let attempts = join_attempts(backend, name, &intent.id).await?;
    let defer = |why: String, tried: bool| {
        let (t, left_files, right_files, id) = (t.clone(), &left_files, &right_files, &id);
        async move {
            tracing::error!(table = %name, reason = %why,
                "interval join round deferred: its rows wait in the join's backlog; the other tables go on");
            let (files, replaced) = join::deferred_state(
                backend,
                &t,
                name,
                &intent.id,
                left_files,
                right_files,
                now_ms,
                join::Deferral { tried },
            )
            .await?;
            let mut report = commit_table(backend, tables, &c.turns, t, name, id, &files).await?;
            report.join = Some(JoinStats {
                deferred: true,
                ..Default::default()
            });
            if let Some(old) = replaced
                && ours(backend, tables, name, id, &files).await?
                && let Err(e) = backend.warehouse.delete(&old).await
            {
                tracing::warn!(object = %old, error = %e, "a replaced join backlog was not deleted");
            }
            Ok::<_, Error>(report)
        }
    };
    if attempts >= MAX_JOIN_ATTEMPTS {
        out.push(
            defer(
                format!("{attempts} attempts of this round did not finish"),
                true,
            )
            .await?,
        );
        return Ok(out);
    }
    if join::backlog_waits(&t, name, now_ms)? {
        out.push(
            defer(
                "an earlier round failed less than 10 minutes ago".into(),
                false,
            )
            .await?,
        );
        return Ok(out);
    }
    record_join_attempt(backend, name, &intent.id, attempts + 1).await?;
    let round = match join::run_join(
        backend,
        tables,
        name,
        &j,
        &intent.id,
        intent.created_at_ms.saturating_mul(1000),
        &t,
        &left_files,
        &right_files,
        c.join_max_kept_rows,
    )
    .await
    {
        Ok(round) => round,
        // An outage (throttling, a timeout) is no attempt of the round's own: the intent is
        // resumed, and only failures of the round itself (and deaths) count.
        Err(e) if e.is_retryable() => {
            let _ = record_join_attempt(backend, name, &intent.id, attempts).await;
            return Err(e);
        }
        Err(e) => {
            out.push(defer(e.to_string(), true).await?);
            return Ok(out);
        }
    };
    if !round.late.data_files.is_empty() {
        // Looked up only now, as the round needs it (a lookup that fails fails the round).
        let dead_letters = tables
            .ensure(backend, crate::spec::DEAD_LETTER_TABLE)
            .await?;
        out.push(
            commit_table(
                backend,
                tables,
                &c.turns,
                dead_letters,
                crate::spec::DEAD_LETTER_TABLE,
                &format!("{id}/late"),
                &round.late,
            )
            .await?,
        );
    }
    let mut report = commit_table(backend, tables, &c.turns, t, name, &id, &round.output).await?;
    report.join = Some(JoinStats {
        kept_rows: round.kept_rows,
        state_bytes: round.state_bytes,
        state_rows_written: round.state_rows_written,
        new_rows: round.new_rows,
        evicted_rows: round.evicted_rows,
        late_rows: round.late.data_files.iter().map(|f| f.record_count()).sum(),
        idle_partitions: round.idle_partitions,
        backlog_files_lost: round.backlog_files_lost,
        deferred: false,
    });
    // Another committer (one that took the lease over) may have landed this round with
    // other state objects: what this round replaced is deleted only if the snapshot
    // holding the commit id carries this round's state.
    let mine = ours(backend, tables, name, &id, &round.output).await?;
    out.push(report);
    tracing::info!(table = %name, kept_rows = round.kept_rows, state_bytes = round.state_bytes,
        evicted = round.evicted_rows, idle_partitions = round.idle_partitions,
        late = round.late.files.iter().map(|f| f.rows).sum::<u64>(), "interval join round");
    for old in round.replaced.iter().filter(|_| mine) {
        if let Err(e) = backend.warehouse.delete(old).await {
            tracing::warn!(object = %old, error = %e, "a replaced join state object was not deleted");
        }
    }
    Ok(out)
}

/// Whether the snapshot of join table `name` that carries `commit_id` carries the state
/// `files` would have committed (this committer's round, not another's).
async fn ours(
    backend: &Backend,
    tables: &TableSet,
    name: &str,
    commit_id: &str,
    files: &TableFiles,
) -> Result<bool> {
    let Some((t, _)) = backend.catalog.load(&tables.ident(name)).await? else {
        return Ok(false);
    };
    let Some(id) = find_commit(&t, commit_id) else {
        return Ok(false);
    };
    let committed = t.metadata().snapshot_by_id(id).and_then(|s| {
        s.summary()
            .additional_properties
            .get(JOIN_STATE_PROPERTY)
            .cloned()
    });
    Ok(committed.as_ref() == files.properties.get(JOIN_STATE_PROPERTY))
}

/// Attempts of one join round (one intent) before it is deferred.
const MAX_JOIN_ATTEMPTS: u32 = 2;

#[derive(Serialize, serde::Deserialize)]
struct JoinAttempt {
    intent: String,
    attempts: u32,
}

/// How many times the round of `intent` was started for join `name` (a process that crashed
/// during it never recorded an end).
async fn join_attempts(backend: &Backend, name: &str, intent: &str) -> Result<u32> {
    let Some(json) = backend
        .state
        .status(&format!("join-attempt#{name}"))
        .await?
    else {
        return Ok(0);
    };
    Ok(serde_json::from_str::<JoinAttempt>(&json)
        .ok()
        .filter(|a| a.intent == intent)
        .map_or(0, |a| a.attempts))
}

async fn record_join_attempt(
    backend: &Backend,
    name: &str,
    intent: &str,
    attempts: u32,
) -> Result<()> {
    let json = serde_json::to_string(&JoinAttempt {
        intent: intent.to_string(),
        attempts,
    })
    .map_err(|e| Error::Internal(e.to_string()))?;
    backend
        .state
        .put_status(&format!("join-attempt#{name}"), &json)
        .await
}
