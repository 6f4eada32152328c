//! Observability: structured JSON logs (`tracing`, in the format Lambda users expect: see
//! [`logs`]) and metrics in CloudWatch Embedded Metric Format (EMF), which CloudWatch turns into
//! metrics from the log stream with no API calls.

pub mod logs;

use std::io::IsTerminal;
use std::sync::OnceLock;

use serde_json::{Map, Value, json};

use crate::ingest::IngestSummary;
pub use logs::invocation_started;

/// Default CloudWatch namespace of the metrics (the SAM template scopes it to the stack).
pub const NAMESPACE: &str = "streamtable";
/// Environment variable naming the metrics' namespace.
pub const NAMESPACE_ENV: &str = "STREAMTABLE_METRICS_NAMESPACE";

/// The metrics' namespace: `STREAMTABLE_METRICS_NAMESPACE`, else [`NAMESPACE`].
pub fn namespace() -> &'static str {
    static NS: OnceLock<String> = OnceLock::new();
    NS.get_or_init(|| {
        std::env::var(NAMESPACE_ENV)
            .ok()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| NAMESPACE.into())
    })
}

/// Sets up the Lambda functions' JSON logs on stdout ([`logs::LambdaJson`]); the level comes
/// from `RUST_LOG`, else the function's log level (`AWS_LAMBDA_LOG_LEVEL`), else `info`.
/// `service` names the function when `POWERTOOLS_SERVICE_NAME` and the function name are unset.
pub fn init_json_logs(service: &str) {
    let _ = tracing_subscriber::fmt()
        .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
        .event_format(logs::LambdaJson::from_env(service))
        .with_env_filter(logs::filter(|k| std::env::var(k).ok()))
        .try_init();
}

/// Sets up human-readable logs on stderr for the CLI (`RUST_LOG` filters; default `warn`),
/// coloured only on a terminal and when `NO_COLOR` is not set.
pub fn init_cli_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_target(false)
        .try_init();
}

/// A metric: name, value, CloudWatch unit.
pub type Metric<'a> = (&'a str, f64, &'a str);

/// One EMF log line with the given metrics under dimension `function`.
pub fn emf_line(function: &str, timestamp_ms: i64, metrics: &[Metric<'_>]) -> String {
    emf_line_by(function, None, timestamp_ms, metrics)
}

/// One EMF log line with the given metrics under dimensions `function` and `(name, value)`.
pub fn emf_dimension_line(
    function: &str,
    dimension: (&str, &str),
    timestamp_ms: i64,
    metrics: &[Metric<'_>],
) -> String {
    emf_line_by(function, Some(dimension), timestamp_ms, metrics)
}

fn emf_line_by(
    function: &str,
    dimension: Option<(&str, &str)>,
    timestamp_ms: i64,
    metrics: &[Metric<'_>],
) -> String {
    let definitions: Vec<Value> = metrics
        .iter()
        .map(|(name, _, unit)| json!({ "Name": name, "Unit": unit }))
        .collect();
    let mut root = Map::new();
    root.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace(),
                "Dimensions": match dimension {
                    Some((name, _)) => json!([["function", name]]),
                    None => json!([["function"]]),
                },
                "Metrics": definitions,
            }]
        }),
    );
    root.insert("function".into(), json!(function));
    if let Some((name, value)) = dimension {
        root.insert(name.into(), json!(value));
    }
    for (name, value, _) in metrics {
        root.insert((*name).into(), json!(value));
    }
    Value::Object(root).to_string()
}

/// The EMF line of one ingest invocation: records in/out/dead-lettered, files, bytes, and the
/// lag (now minus the newest Kafka timestamp of the batch).
pub fn ingest_metrics(
    summary: &IngestSummary,
    now_ms: i64,
    duration_ms: f64,
    cold_start: bool,
) -> String {
    let of_kind = |kind: crate::decode::RejectKind| summary.dead_letters_of(kind.as_str()) as f64;
    let lag = summary
        .newest_timestamp_ms
        .map_or(0.0, |t| (now_ms - t).max(0) as f64);
    emf_line(
        "ingest",
        now_ms,
        &[
            ("RecordsIn", summary.records as f64, "Count"),
            ("RecordsAccepted", summary.accepted as f64, "Count"),
            ("RecordsAlreadySeen", summary.already_seen as f64, "Count"),
            // Every dead letter written: the topics' records and the derived tables'.
            (
                "RecordsDeadLettered",
                (summary.dead_lettered + summary.derived_dead_lettered) as f64,
                "Count",
            ),
            (
                "RecordsFailedTransform",
                of_kind(crate::decode::RejectKind::Transform),
                "Count",
            ),
            ("RowsDerived", summary.derived_rows as f64, "Count"),
            (
                "RecordsLate",
                of_kind(crate::decode::RejectKind::Late),
                "Count",
            ),
            ("RecordsDeduplicated", summary.deduplicated as f64, "Count"),
            ("KeyDeletes", summary.key_deletes as f64, "Count"),
            ("StateBytesMax", summary.state_bytes_max as f64, "Bytes"),
            ("FilesWritten", summary.files_written as f64, "Count"),
            ("BytesWritten", summary.bytes_written as f64, "Bytes"),
            ("CheckpointConflicts", summary.conflicts as f64, "Count"),
            ("OffsetLagMs", lag, "Milliseconds"),
            ("DurationMs", duration_ms, "Milliseconds"),
            ("ColdStart", f64::from(u8::from(cold_start)), "Count"),
        ],
    )
}

/// One EMF line per topic of an ingest batch (dimensions `function`, `topic`): its records and
/// its lag (now minus its newest Kafka timestamp) — so a slow topic shows among busy ones.
pub fn ingest_topic_metrics(event: &crate::esm::EsmEvent, now_ms: i64) -> Vec<String> {
    let mut per_topic: std::collections::BTreeMap<String, (u64, i64)> = Default::default();
    // The event's records are grouped by topic-partition: one topic per group.
    for (key, records) in &event.records {
        let Some(first) = records.first() else {
            continue;
        };
        let topic = first.topic.clone().unwrap_or_else(|| {
            key.rsplit_once('-')
                .map_or(key.as_str(), |(t, _)| t)
                .to_string()
        });
        let newest = records
            .iter()
            .map(|r| r.timestamp)
            .max()
            .unwrap_or(i64::MIN);
        let e = per_topic.entry(topic).or_insert((0, i64::MIN));
        e.0 += records.len() as u64;
        e.1 = e.1.max(newest);
    }
    per_topic
        .into_iter()
        .map(|(topic, (records, newest))| {
            emf_dimension_line(
                "ingest",
                ("topic", &topic),
                now_ms,
                &[
                    ("RecordsIn", records as f64, "Count"),
                    (
                        "OffsetLagMs",
                        (now_ms - newest).max(0) as f64,
                        "Milliseconds",
                    ),
                ],
            )
        })
        .collect()
}

/// One EMF line per table the scheduled run committed to or compacted (dimensions `function`,
/// `table`): rows and files committed, bytes rewritten by compaction; an interval join's state;
/// an upsert table's live keys, the rows its rounds deleted, the keys tombstones deleted, and
/// the bytes of key index written.
pub fn scheduled_table_metrics(
    function: &str,
    report: &crate::scheduled::ScheduledReport,
    now_ms: i64,
) -> Vec<String> {
    type Line<'a> = (
        u64,
        u64,
        u64,
        Option<&'a crate::commit::JoinStats>,
        Option<crate::commit::UpsertStats>,
    );
    let mut per_table: std::collections::BTreeMap<&str, Line<'_>> = Default::default();
    for t in &report.commit.tables {
        let e = per_table.entry(t.table.as_str()).or_default();
        e.0 += t.rows;
        e.1 += t.files;
        e.3 = t.join.as_ref().or(e.3);
        if let Some(u) = &t.upsert {
            let sum = e.4.get_or_insert_with(Default::default);
            sum.keys = u.keys;
            sum.index_entries = u.index_entries;
            sum.rows_deleted += u.rows_deleted;
            sum.keys_deleted += u.keys_deleted;
            sum.index_bytes += u.index_bytes;
        }
    }
    for c in &report.compaction {
        per_table.entry(c.table.as_str()).or_default().2 += c.input_bytes;
    }
    per_table
        .into_iter()
        .map(|(table, (rows, files, rewritten, join, upsert))| {
            let mut metrics = vec![
                ("RowsCommitted", rows as f64, "Count"),
                ("FilesCommitted", files as f64, "Count"),
                ("BytesRewritten", rewritten as f64, "Bytes"),
            ];
            if let Some(j) = join {
                metrics.extend([
                    ("JoinKeptRows", j.kept_rows as f64, "Count"),
                    ("JoinStateBytes", j.state_bytes as f64, "Bytes"),
                    ("JoinRowsEvicted", j.evicted_rows as f64, "Count"),
                    (
                        "JoinRoundsDeferred",
                        f64::from(u8::from(j.deferred)),
                        "Count",
                    ),
                    ("JoinBacklogFilesLost", j.backlog_files_lost as f64, "Count"),
                ]);
            }
            if let Some(u) = upsert {
                metrics.extend([
                    ("UpsertKeys", u.keys as f64, "Count"),
                    ("KeyIndexEntries", u.index_entries as f64, "Count"),
                    ("UpsertRowsDeleted", u.rows_deleted as f64, "Count"),
                    ("UpsertKeysDeleted", u.keys_deleted as f64, "Count"),
                    ("KeyIndexBytesWritten", u.index_bytes as f64, "Bytes"),
                ]);
            }
            emf_dimension_line(function, ("table", table), now_ms, &metrics)
        })
        .collect()
}

/// The EMF line of an invocation that failed (its batch is retried): how many records it
/// carried, and whether it was a cold start — so that a failing function still shows its load.
pub fn failure_metrics(function: &str, records: usize, cold_start: bool, now_ms: i64) -> String {
    emf_line(
        function,
        now_ms,
        &[
            ("InvocationsFailed", 1.0, "Count"),
            ("RecordsIn", records as f64, "Count"),
            ("ColdStart", f64::from(u8::from(cold_start)), "Count"),
        ],
    )
}

/// The EMF line of one scheduled run: what was committed and compacted, how long commits took,
/// what maintenance removed, what failed or is blocked, and the commit backlog left.
pub fn scheduled_metrics(
    report: &crate::scheduled::ScheduledReport,
    now_ms: i64,
    cold_start: bool,
) -> String {
    let rewritten: u64 = report.compaction.iter().map(|c| c.input_bytes).sum();
    let joins = report.commit.tables.iter().filter_map(|t| t.join.as_ref());
    let expired: u64 = report.maintenance.iter().map(|m| m.snapshots_expired).sum();
    let deleted: u64 = report
        .maintenance
        .iter()
        .map(|m| m.files_deleted + m.orphans_deleted)
        .sum();
    emf_line(
        "scheduled",
        now_ms,
        &[
            ("BatchesCommitted", report.commit.batches as f64, "Count"),
            ("UnitsRun", report.units.run as f64, "Count"),
            // Units that fail are `Failures` (with blocked batches), which `ScheduledFailuresAlarm`
            // watches.
            ("UnitsPanicked", report.units.panicked as f64, "Count"),
            ("UnitBusyMs", report.units.busy_ms, "Milliseconds"),
            ("UnitLongestMs", report.units.longest_ms, "Milliseconds"),
            ("FilesCommitted", report.commit.files() as f64, "Count"),
            ("RowsCommitted", report.commit.rows() as f64, "Count"),
            ("CommitLatencyMs", report.commit.duration_ms, "Milliseconds"),
            (
                "AuditedRecords",
                report.commit.audit.delivered as f64,
                "Count",
            ),
            (
                "AuditMismatches",
                report.commit.audit.mismatches() as f64,
                "Count",
            ),
            (
                "AuditMissingRecords",
                report.commit.audit.missing as f64,
                "Count",
            ),
            (
                "AuditDuplicatedRecords",
                report.commit.audit.duplicated as f64,
                "Count",
            ),
            (
                "AuditUnreadableFiles",
                report.commit.audit.unreadable as f64,
                "Count",
            ),
            (
                "AuditSkippedRounds",
                report.commit.audit.skipped_rounds as f64,
                "Count",
            ),
            (
                "PartitionsCompacted",
                report.compaction.len() as f64,
                "Count",
            ),
            ("BytesRewritten", rewritten as f64, "Bytes"),
            ("SnapshotsExpired", expired as f64, "Count"),
            ("FilesDeleted", deleted as f64, "Count"),
            (
                "Failures",
                (report.failures.len() + report.commit.blocked.len()) as f64,
                "Count",
            ),
            (
                "BatchesBlocked",
                report.commit.blocked.len() as f64,
                "Count",
            ),
            (
                "BacklogBatches",
                report.commit.backlog.batches as f64,
                "Count",
            ),
            (
                "BacklogAgeMs",
                report.commit.backlog.oldest_age_ms.unwrap_or(0) as f64,
                "Milliseconds",
            ),
            (
                "JoinRowsEvicted",
                joins.clone().map(|j| j.evicted_rows).sum::<u64>() as f64,
                "Count",
            ),
            (
                "JoinRoundsDeferred",
                joins.clone().filter(|j| j.deferred).count() as f64,
                "Count",
            ),
            (
                "JoinBacklogFilesLost",
                joins.clone().map(|j| j.backlog_files_lost).sum::<u64>() as f64,
                "Count",
            ),
            (
                "JoinKeptRowsMax",
                joins.map(|j| j.kept_rows).max().unwrap_or(0) as f64,
                "Count",
            ),
            ("DurationMs", report.duration_ms, "Milliseconds"),
            ("ColdStart", f64::from(u8::from(cold_start)), "Count"),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_lines_declare_every_metric_they_carry() {
        let summary = IngestSummary {
            records: 10,
            accepted: 8,
            dead_lettered: 2,
            newest_timestamp_ms: Some(1_000),
            derived_rows: 7,
            deduplicated: 3,
            state_bytes_max: 900,
            dead_letters_by_kind: [
                ("transform".to_string(), 1),
                ("not_json".to_string(), 1),
                ("late".to_string(), 4),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let line = ingest_metrics(&summary, 4_000, 12.5, true);
        let v: Value = serde_json::from_str(&line).expect("json");
        let defs = &v["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(defs["Namespace"], "streamtable");
        for d in defs["Metrics"].as_array().expect("metrics") {
            let name = d["Name"].as_str().expect("name");
            assert!(v.get(name).is_some(), "{name} declared but absent");
        }
        assert_eq!(v["RecordsDeadLettered"], 2.0);
        assert_eq!(v["RowsDerived"], 7.0);
        assert_eq!(v["RecordsFailedTransform"], 1.0);
        assert_eq!(v["RecordsLate"], 4.0);
        assert_eq!(v["RecordsDeduplicated"], 3.0);
        assert_eq!(v["StateBytesMax"], 900.0);
        assert_eq!(v["OffsetLagMs"], 3000.0);
        assert_eq!(v["function"], "ingest");
        assert_eq!(v["ColdStart"], 1.0);
        let failed: Value =
            serde_json::from_str(&failure_metrics("ingest", 42, false, 5)).expect("json");
        assert_eq!(
            (
                &failed["InvocationsFailed"],
                &failed["RecordsIn"],
                &failed["ColdStart"]
            ),
            (&json!(1.0), &json!(42.0), &json!(0.0))
        );
        assert_eq!(
            failed["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .map(Vec::len),
            Some(3)
        );

        let mut report = crate::scheduled::ScheduledReport::default();
        report.commit.tables.push(crate::commit::TableCommitReport {
            table: "orders".into(),
            files: 2,
            rows: 50,
            ..Default::default()
        });
        for (deleted, keys) in [(3, 10), (4, 12)] {
            report.commit.tables.push(crate::commit::TableCommitReport {
                table: "orders_current".into(),
                upsert: Some(crate::commit::UpsertStats {
                    rows_deleted: deleted,
                    keys_deleted: 1,
                    keys,
                    index_entries: keys + 1,
                    index_bytes: 100,
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let lines = scheduled_table_metrics("scheduled", &report, 9);
        assert_eq!(lines.len(), 2);
        let u: Value = serde_json::from_str(&lines[1]).expect("json");
        assert_eq!(u["table"], "orders_current");
        assert_eq!(
            (
                &u["UpsertKeys"],
                &u["UpsertRowsDeleted"],
                &u["UpsertKeysDeleted"],
                &u["KeyIndexBytesWritten"]
            ),
            (&json!(12.0), &json!(7.0), &json!(2.0), &json!(200.0)),
            "keys as of the last round, the rest summed"
        );
        assert_eq!(u["KeyIndexEntries"], 13.0);
        assert!(u.get("JoinKeptRows").is_none());
        let t: Value = serde_json::from_str(&lines[0]).expect("json");
        assert_eq!(
            t["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["function", "table"]])
        );
        assert_eq!(
            (&t["table"], &t["RowsCommitted"]),
            (&json!("orders"), &json!(50.0))
        );
    }
}
