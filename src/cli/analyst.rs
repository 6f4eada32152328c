//! The analyst's commands: `query`, `tables`, `dashboard`.

use std::path::PathBuf;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;

use crate::backend::Backend;
use crate::clock::now_ms;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::query::{QueryEngine, TimeTravel};

/// Output format of `streamtable query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for a terminal.
    Table,
    /// Comma-separated values with a header.
    Csv,
    /// One JSON object per row.
    Json,
}

/// Arguments of `streamtable query`.
#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    /// The SQL (tables resolve in the pipeline's namespace: `SELECT * FROM orders`).
    pub sql: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Read the table that has this snapshot at that snapshot (time travel).
    #[arg(long, conflicts_with = "as_of")]
    pub snapshot: Option<i64>,
    /// Read every table as it was at this time (RFC 3339, e.g. 2026-11-29T10:00:00Z, or epoch ms).
    #[arg(long)]
    pub as_of: Option<String>,
}

fn parse_time(text: &str) -> Result<i64> {
    if let Ok(ms) = text.trim().parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|e| Error::Config(format!("--as-of {text:?}: {e}; use RFC 3339 like 2026-11-29T10:00:00Z or epoch milliseconds")))
}

fn fmt_err(e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("formatting results: {e}"))
}

/// Results as text in the chosen format.
pub fn format(batches: &[RecordBatch], format: Format) -> Result<String> {
    match format {
        Format::Table => Ok(pretty_format_batches(batches).map_err(fmt_err)?.to_string()),
        Format::Csv => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut buf);
                for b in batches {
                    w.write(b).map_err(fmt_err)?;
                }
            }
            String::from_utf8(buf).map_err(fmt_err)
        }
        Format::Json => {
            let mut w = datafusion::arrow::json::ArrayWriter::new(Vec::new());
            for b in batches {
                w.write(b).map_err(fmt_err)?;
            }
            w.finish().map_err(fmt_err)?;
            let mut text = String::from_utf8(w.into_inner()).map_err(fmt_err)?;
            if text.is_empty() {
                text.push_str("[]");
            }
            Ok(text)
        }
    }
}

/// `streamtable query`.
pub async fn query(config: &Config, args: &QueryArgs) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let travel = match (&args.snapshot, &args.as_of) {
        (Some(id), _) => TimeTravel::Snapshot(*id),
        (None, Some(t)) => TimeTravel::AsOf(parse_time(t)?),
        (None, None) => TimeTravel::Current,
    };
    let engine = QueryEngine::new(&backend, travel).await?;
    let batches = engine.query(&args.sql).await?;
    println!("{}", format(&batches, args.format)?);
    if travel != TimeTravel::Current && engine.reads_metadata(&args.sql) {
        eprintln!(
            "note: metadata tables ($snapshots, $history, $files, $partitions) show the current metadata; --as-of and --snapshot apply to the tables' rows"
        );
    }
    for (table, first) in engine.empty_as_of(&args.sql) {
        eprintln!(
            "note: {table} had no snapshot yet at the --as-of time: read as empty ({})",
            if first >= 0 {
                format!(
                    "its first snapshot was committed at {}",
                    crate::clock::rfc3339_ms(first)
                )
            } else {
                "it has no snapshot yet".to_string()
            }
        );
    }
    Ok(())
}

/// `streamtable tables`.
pub async fn tables(config: &Config, json: bool) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let info = crate::cli::table_list::overview(&backend).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&info).map_err(fmt_err)?);
    } else if info.is_empty() {
        println!(
            "no tables yet: run `streamtable scheduled` after ingesting (or `streamtable demo`)"
        );
    } else {
        println!("{}", crate::cli::table_list::render(&info, now_ms()));
    }
    if !json && let Ok(spec) = config.load_pipeline_resolved(&backend).await {
        let states = crate::cli::table_list::state_overview(&backend, &spec).await?;
        let text = crate::cli::table_list::render_states(&states, now_ms());
        if !text.is_empty() {
            println!("\n{text}");
        }
    }
    if !json && let Some(status) = crate::scheduled::last_run(&backend).await? {
        let problems = crate::cli::table_list::render_last_run(&status, now_ms());
        if !problems.is_empty() {
            println!("\n{problems}");
        }
    }
    Ok(())
}

/// Arguments of `streamtable dashboard`.
#[derive(Debug, clap::Args)]
pub struct DashboardArgs {
    /// The HTML file to write.
    #[arg(long, default_value = "dashboard.html")]
    pub out: PathBuf,
    /// Directory of dashboard SQL files (default: infra/dashboards, else the built-in copies).
    #[arg(long, default_value = "infra/dashboards")]
    pub dir: PathBuf,
}

/// `streamtable dashboard`: runs every dashboard query, writes one self-contained HTML file.
pub async fn dashboard(config: &Config, args: &DashboardArgs) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let engine = QueryEngine::new(&backend, TimeTravel::Current).await?;
    let mut results = Vec::new();
    for d in crate::cli::dashboard::load(Some(&args.dir))? {
        let batches = engine.query(&d.sql).await?;
        results.push((d, batches));
    }
    let subtitle = format!(
        "{} charts from {} tables in namespace {}, generated {}",
        results.iter().map(|(d, _)| d.y.len()).sum::<usize>(),
        crate::cli::table_list::overview(&backend).await?.len(),
        backend.namespace,
        crate::clock::rfc3339_ms(now_ms())
    );
    let html = crate::cli::dashboard::render_html(&results, &subtitle)?;
    std::fs::write(&args.out, html).map_err(|e| Error::io("write dashboard", &args.out, e))?;
    println!(
        "wrote {} ({} dashboards)",
        args.out.display(),
        results.len()
    );
    Ok(())
}

/// A result as a text table of at most `limit` rows, saying how many were left out. With
/// `last`, the last rows are kept (the most recent of a time series).
pub fn render_limited(batches: &[RecordBatch], limit: usize, last: bool) -> Result<String> {
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    if total == 0 {
        return Ok("(no rows yet)".to_string());
    }
    let skip = if last { total.saturating_sub(limit) } else { 0 };
    let mut kept = Vec::new();
    let (mut pos, mut left) = (0usize, limit);
    for b in batches {
        let n = b.num_rows();
        let from = skip.saturating_sub(pos).min(n);
        let take = (n - from).min(left);
        if take > 0 {
            kept.push(b.slice(from, take));
            left -= take;
        }
        pos += n;
    }
    let mut text = pretty_format_batches(&kept).map_err(fmt_err)?.to_string();
    if total > limit {
        let which = if last { "earlier" } else { "more" };
        text.push_str(&format!(
            "\n… {} {which} rows (all of them: streamtable dashboard)",
            total - limit
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("country", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec!["DE", "FR"])),
                Arc::new(Int64Array::from(vec![3, 4])),
            ],
        )
        .expect("batch")
    }

    #[test]
    fn csv_and_json_carry_every_row() {
        assert_eq!(
            format(&[batch()], Format::Csv).expect("csv"),
            "country,n\nDE,3\nFR,4\n"
        );
        let json: serde_json::Value =
            serde_json::from_str(&format(&[batch()], Format::Json).expect("json")).expect("parse");
        assert_eq!(
            json,
            serde_json::json!([{"country": "DE", "n": 3}, {"country": "FR", "n": 4}])
        );
        assert_eq!(format(&[], Format::Json).expect("empty"), "[]");
    }

    #[test]
    fn long_results_are_cut_with_a_count() {
        let text = render_limited(&[batch()], 1, false).expect("text");
        assert!(text.contains("DE") && !text.contains("FR"));
        assert!(text.ends_with("… 1 more rows (all of them: streamtable dashboard)"));
        let text = render_limited(&[batch(), batch()], 3, true).expect("text");
        assert_eq!(text.matches("DE").count() + text.matches("FR").count(), 3);
        assert!(text.ends_with("… 1 earlier rows (all of them: streamtable dashboard)"));
        // An empty answer says so, rather than drawing an empty box.
        let empty = batch().slice(0, 0);
        assert_eq!(
            render_limited(&[empty], 5, true).expect("text"),
            "(no rows yet)"
        );
    }

    #[test]
    fn as_of_takes_rfc3339_or_millis() {
        assert_eq!(parse_time("1795946400000").expect("ms"), 1_795_946_400_000);
        assert_eq!(
            parse_time("2026-11-29T10:00:00Z").expect("rfc3339"),
            1_795_946_400_000
        );
        assert!(parse_time("yesterday").is_err());
    }
}
