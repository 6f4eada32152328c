//! `streamtable status`: per topic-partition, its checkpoint, when it last landed and what waits
//! to be committed; per table, its last commit and compaction; then what the last scheduled run
//! could not do ([`crate::status`]).

use std::fmt::Write;

use crate::backend::Backend;
use crate::cli::table_list::{human_duration, render_last_run};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::status::Status;

/// Prints the status of the pipeline of `config` (JSON with `json`).
pub async fn run(config: &Config, json: bool) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let spec = config.load_pipeline_resolved(&backend).await?;
    let status = crate::status::gather(&backend, &spec).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).map_err(|e| Error::Internal(e.to_string()))?
        );
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

/// The status as text for humans.
pub fn render(s: &Status) -> String {
    let ago = |at: Option<i64>| match at {
        Some(t) => format!("{} ago", human_duration((s.now_ms - t).max(0))),
        None => "-".to_string(),
    };
    let mut out = String::new();
    if s.partitions.is_empty() {
        out.push_str("no topic-partition has landed yet\n");
    } else {
        let _ = writeln!(
            out,
            "{:<28} {:>14} {:>16} {:>8} {:>16}",
            "topic-partition", "next offset", "last landing", "pending", "oldest pending"
        );
        for p in &s.partitions {
            let _ = writeln!(
                out,
                "{:<28} {:>14} {:>16} {:>8} {:>16}",
                format!("{}-{}", p.topic, p.partition),
                p.next_offset,
                ago(p.last_landed_ms),
                p.pending_batches,
                ago(p.oldest_pending_ms)
            );
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "{:<28} {:>16} {:>16}",
        "table", "last commit", "last compaction"
    );
    for t in &s.tables {
        let commit = match t.last_commit_ms {
            None => "not created yet".to_string(),
            at => ago(at),
        };
        let _ = writeln!(
            out,
            "{:<28} {:>16} {:>16}",
            t.table,
            commit,
            ago(t.last_compaction_ms)
        );
    }
    out.push('\n');
    match &s.last_run {
        None => out.push_str("scheduled stage: no run has finished yet\n"),
        Some(run) => {
            let _ = writeln!(
                out,
                "scheduled stage: last run finished {}",
                ago(Some(run.finished_at_ms))
            );
            let problems = render_last_run(run, s.now_ms);
            if problems.is_empty() {
                out.push_str("no failures, nothing blocked, no backlog\n");
            } else {
                out.push_str(&problems);
                out.push('\n');
            }
        }
    }
    out
}
