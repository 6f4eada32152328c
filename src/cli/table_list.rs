//! `streamtable tables`: what each table holds and how fresh it is, from metadata alone.

use iceberg::spec::PrimitiveLiteral;
use iceberg::{NamespaceIdent, TableIdent};
use serde::Serialize;

use crate::backend::Backend;
use crate::error::Result;
use crate::table::files;

/// One table at its current snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableInfo {
    /// Table name.
    pub name: String,
    /// Rows in the current snapshot.
    pub rows: u64,
    /// Live data files.
    pub data_files: u64,
    /// Bytes of the live data files.
    pub bytes: u64,
    /// The current snapshot.
    pub snapshot_id: Option<i64>,
    /// When the current snapshot was committed, epoch milliseconds.
    pub last_snapshot_ms: Option<i64>,
    /// Newest `kafka_timestamp` in the table (epoch milliseconds), from file statistics.
    pub newest_event_ms: Option<i64>,
}

impl TableInfo {
    /// Now minus the newest Kafka timestamp, in milliseconds.
    pub fn freshness_ms(&self, now_ms: i64) -> Option<i64> {
        self.newest_event_ms.map(|t| (now_ms - t).max(0))
    }
}

/// The last scheduled run's problems and backlog, for humans; empty when there are none.
pub fn render_last_run(status: &crate::scheduled::RunStatus, now_ms: i64) -> String {
    let mut out = Vec::new();
    let ago = (now_ms - status.finished_at_ms).max(0) / 1000;
    let b = &status.backlog;
    if b.batches > 0 || b.more {
        out.push(format!(
            "backlog: {}{} batches left by the last scheduled run ({ago} s ago), the oldest {} s old",
            b.batches,
            if b.more { "+" } else { "" },
            b.oldest_age_ms.unwrap_or(0) / 1000
        ));
    }
    if status.blocked_total > 0 {
        out.push(format!(
            "blocked: {} pending batches cannot be committed (last scheduled run, {ago} s ago):",
            status.blocked_total
        ));
        out.extend(status.blocked.iter().map(|b| format!("  {b}")));
    }
    for f in &status.failures {
        let what = match (&f.table, &f.partition) {
            (Some(t), Some(p)) => format!("{t} {p}"),
            (Some(t), None) => t.clone(),
            _ => "-".into(),
        };
        out.push(format!("failed ({}): {what}: {}", f.stage, f.error));
    }
    out.join("\n")
}

/// Every table of the backend's namespace.
pub async fn overview(backend: &Backend) -> Result<Vec<TableInfo>> {
    let ns = backend.namespace.clone();
    let mut out = Vec::new();
    for name in backend.catalog.pointers().list_tables(&ns).await? {
        let ident = TableIdent::new(NamespaceIdent::new(ns.clone()), name.clone());
        let Some((table, _)) = backend.catalog.load(&ident).await? else {
            continue;
        };
        let mut info = TableInfo {
            name,
            ..Default::default()
        };
        if let Some(s) = table.metadata().current_snapshot() {
            let p = &s.summary().additional_properties;
            let get = |k: &str| p.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
            info.rows = get("total-records");
            info.data_files = get("total-data-files");
            info.bytes = get("total-files-size");
            info.snapshot_id = Some(s.snapshot_id());
            info.last_snapshot_ms = Some(s.timestamp_ms());
        }
        if let Some(field) = table
            .metadata()
            .current_schema()
            .field_by_name(crate::kafka::TIMESTAMP)
        {
            let current = files::load_current(&table).await?;
            info.newest_event_ms = current
                .live()
                .filter_map(|e| e.entry.data_file().upper_bounds().get(&field.id))
                .filter_map(|d| match d.literal() {
                    PrimitiveLiteral::Long(us) => Some(us / 1000),
                    _ => None,
                })
                .max();
        }
        out.push(info);
    }
    Ok(out)
}

/// `1.2 s`, `3 min`, `2 h`, `4 d`.
pub fn human_duration(ms: i64) -> String {
    match ms {
        m if m < 1_000 => format!("{m} ms"),
        m if m < 60_000 => format!("{:.1} s", m as f64 / 1e3),
        m if m < 3_600_000 => format!("{} min", m / 60_000),
        m if m < 86_400_000 => format!("{:.1} h", m as f64 / 3.6e6),
        m => format!("{:.1} d", m as f64 / 8.64e7),
    }
}

/// The overview as an aligned text table.
pub fn render(tables: &[TableInfo], now_ms: i64) -> String {
    let mut rows = vec![[
        "table".to_string(),
        "rows".into(),
        "data files".into(),
        "size".into(),
        "last snapshot".into(),
        "freshness".into(),
    ]];
    for t in tables {
        rows.push([
            t.name.clone(),
            t.rows.to_string(),
            t.data_files.to_string(),
            format!("{:.1} MB", t.bytes as f64 / 1048576.0),
            t.last_snapshot_ms
                .map(|ms| crate::clock::rfc3339_ms(ms).replace('T', " "))
                .unwrap_or_else(|| "(none)".into()),
            t.freshness_ms(now_ms)
                .map(human_duration)
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    aligned(&rows)
}

/// Rows of cells as aligned text columns: the first left-aligned, the others right-aligned,
/// two spaces apart, trailing blanks trimmed.
pub fn aligned<R: AsRef<[String]>>(rows: &[R]) -> String {
    let columns = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.as_ref().get(c))
                .map(|v| v.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            r.as_ref()
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (v, w))| {
                    if i == 0 {
                        format!("{v:<w$}")
                    } else {
                        format!("{v:>w$}")
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(250), "250 ms");
        assert_eq!(human_duration(12_300), "12.3 s");
        assert_eq!(human_duration(125_000), "2 min");
        assert_eq!(human_duration(7_200_000), "2.0 h");
    }

    #[test]
    fn the_overview_aligns_its_columns() {
        let t = TableInfo {
            name: "orders".into(),
            rows: 1234,
            data_files: 3,
            bytes: 2 * 1048576,
            snapshot_id: Some(1),
            last_snapshot_ms: Some(1_795_946_400_000),
            newest_event_ms: Some(1_795_946_400_000),
        };
        let text = render(&[t], 1_795_946_430_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("orders"));
        assert!(lines[1].contains("2026-11-29 10:00:00.000Z"));
        assert!(lines[1].ends_with("30.0 s"));
        assert_eq!(lines[0].len(), lines[1].len());
    }
}

/// One stateful partition's state, as `streamtable tables` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionStateInfo {
    /// The topic.
    pub topic: String,
    /// The Kafka partition.
    pub partition: i32,
    /// Size of the encoded state (zstd), bytes.
    pub bytes: u64,
    /// Writes so far.
    pub seq: u64,
    /// When records last landed in the partition, epoch ms.
    pub updated_at_ms: i64,
    /// Kept as an object in the warehouse (past the item's inline limit).
    pub spilled: bool,
}

/// The state of every partition of the topics whose derived tables keep state.
pub async fn state_overview(
    backend: &Backend,
    spec: &crate::spec::PipelineSpec,
) -> Result<Vec<PartitionStateInfo>> {
    let mut out = Vec::new();
    for t in &spec.tables {
        let stateful = spec.derived.iter().any(|d| {
            d.source == t.name && d.join.is_none() && (d.view.is_some() || d.dedup.is_some())
        });
        if !stateful {
            continue;
        }
        for (s, st) in backend.state.topic_states(&t.topic).await? {
            if let Some(st) = st {
                out.push(PartitionStateInfo {
                    topic: s.topic.clone(),
                    partition: s.partition,
                    bytes: st.bytes,
                    seq: st.seq,
                    updated_at_ms: st.updated_at_ms,
                    spilled: st.location.is_some(),
                });
            }
        }
    }
    Ok(out)
}

/// The partition states as lines for humans (empty when there are none).
pub fn render_states(states: &[PartitionStateInfo], now_ms: i64) -> String {
    if states.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "{:<24} {:>10} {:>8}  {}\n",
        "partition state", "bytes", "writes", "last landing"
    );
    for s in states {
        out.push_str(&format!(
            "{:<24} {:>10} {:>8}  {} ago{}\n",
            format!("{}-{}", s.topic, s.partition),
            s.bytes,
            s.seq,
            human_age(now_ms - s.updated_at_ms),
            if s.spilled { " (in the warehouse)" } else { "" }
        ));
    }
    let total: u64 = states.iter().map(|s| s.bytes).sum();
    let max = states.iter().map(|s| s.bytes).max().unwrap_or(0);
    out.push_str(&format!(
        "{} partitions, {total} bytes of state, largest {max}",
        states.len()
    ));
    out
}

fn human_age(ms: i64) -> String {
    match ms.max(0) {
        m if m < 60_000 => format!("{:.0} s", m as f64 / 1e3),
        m if m < 3_600_000 => format!("{:.0} min", m as f64 / 6e4),
        m => format!("{:.1} h", m as f64 / 3.6e6),
    }
}
