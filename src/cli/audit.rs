//! `streamtable audit`: per topic-partition, the offsets found in the topic's table and in
//! `dead_letters`, and any offset missing or found twice ([`crate::audit`]). Exit code 1 on
//! either.

use std::fmt::Write;

use crate::audit::{Audit, MAX_LISTED};
use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};

/// Arguments of `streamtable audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Audit only this topic's table (default: every one).
    #[arg(long)]
    pub table: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the audit and prints it; an error when an offset is missing or found twice.
pub async fn run(config: &Config, args: &AuditArgs) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let spec = config.load_pipeline_resolved(&backend).await?;
    let audit = crate::audit::audit(&backend, &spec, args.table.as_deref()).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&audit).map_err(|e| Error::Internal(e.to_string()))?
        );
    } else {
        print!("{}", render(&audit));
    }
    if audit.ok() {
        return Ok(());
    }
    let (missing, twice): (i64, i64) = audit
        .tables
        .iter()
        .flat_map(|t| &t.partitions)
        .fold((0, 0), |(m, d), p| {
            (m + p.missing_offsets, d + p.duplicated_offsets)
        });
    Err(Error::Audit(format!(
        "{missing} offset(s) missing, {twice} found more than once (see above)"
    )))
}

/// The audit as text for humans.
pub fn render(audit: &Audit) -> String {
    let mut out = String::new();
    for t in &audit.tables {
        let _ = writeln!(out, "table {} (topic {})", t.table, t.topic);
        if let Some(why) = &t.skipped {
            let _ = writeln!(out, "  not audited: {why}\n");
            continue;
        }
        if t.partitions.is_empty() {
            let _ = writeln!(out, "  no partition has landed yet\n");
            continue;
        }
        let _ = writeln!(
            out,
            "  {:>9} {:>24} {:>10} {:>12} {:>8} {:>9} {:>11}",
            "partition", "offsets", "rows", "dead letters", "pending", "missing", "found twice"
        );
        for p in &t.partitions {
            let offsets = format!("{}..{} ", p.verified_from, p.next_offset);
            let _ = writeln!(
                out,
                "  {:>9} {:>24} {:>10} {:>12} {:>8} {:>9} {:>11}",
                p.partition,
                offsets,
                p.rows,
                p.dead_letters,
                p.pending.len(),
                p.missing_offsets,
                p.duplicated_offsets
            );
            for [a, b] in &p.missing {
                let _ = writeln!(
                    out,
                    "    missing: offsets {a}..={b} (in neither {} nor dead_letters; a range Kafka itself skips — transaction markers, a compacted topic — also shows here)",
                    t.table
                );
            }
            if let Some([a, b]) = p.beyond_checkpoint {
                let _ = writeln!(
                    out,
                    "    beyond the checkpoint: offsets {a}..={b} are in the tables, yet the checkpoint is at {a}: it went back (a reset or a restored state table), and they will land again"
                );
            }
            for d in &p.duplicates {
                let _ = writeln!(
                    out,
                    "    found twice: offset {} ({} row(s) in {}, {} in dead_letters)",
                    d.offset, d.in_table, t.table, d.in_dead_letters
                );
            }
            if p.missing.len() >= MAX_LISTED || p.duplicates.len() >= MAX_LISTED {
                let _ = writeln!(out, "    (the first {MAX_LISTED} of each listed)");
            }
        }
        out.push('\n');
    }
    for u in &audit.unreadable_pending {
        let _ = writeln!(
            out,
            "pending batch that cannot be read: {u} (its offsets may show as missing above)"
        );
    }
    let _ = writeln!(
        out,
        "(each partition is checked from its lowest offset found: a loss below it is not seen)"
    );
    let _ = writeln!(
        out,
        "{}",
        if audit.ok() {
            "audit: every offset below each checkpoint, but the pending batches', is in its table or dead_letters exactly once"
        } else {
            "audit: FAILED"
        }
    );
    out
}
