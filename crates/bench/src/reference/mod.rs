//! `streamtable-bench reference`: streamtable side by side with the Python Lambda a team would
//! write instead (bench/reference/: pyarrow + pyiceberg), on the same inputs in one run.
//!
//! Ratios are of CPU time (process CPU, all threads): "per core", so a Python library that
//! spreads work over both cores is not flattered by the wall clock. Wall times are printed too.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::tempdir;
use crate::config::Config;
use crate::error::{Error, Result};

mod compaction;
mod ingest;
mod whole;

/// Arguments of `streamtable-bench reference`.
#[derive(Debug, clap::Args)]
pub struct ReferenceArgs {
    /// ESM batches of orders for the ingest comparison (the first one also times one batch).
    #[arg(long, default_value_t = 100)]
    pub batches: u64,
    /// Records per batch (the ESM's maximum is 10,000).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Kafka partitions per batch.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Iterations of the one-batch decode-to-Parquet measure (the median is reported).
    #[arg(long, default_value_t = 9)]
    pub iterations: usize,
    /// MB of 1-5 MB files for the compaction comparison (0 skips it).
    #[arg(long, default_value_t = 1024)]
    pub compact_mb: u64,
    /// Events per topic for the `streamtable demo` run (0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    pub demo_events: u64,
    /// Python with pyarrow and pyiceberg (`scripts/bench` provides a virtualenv).
    #[arg(long, env = "STREAMTABLE_BENCH_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// Directory of the Python reference (ingest.py, compact.py).
    #[arg(long, default_value = "bench/reference")]
    pub reference_dir: PathBuf,
    /// The release build of the ingest Lambda (default: `ingest` next to this executable).
    #[arg(long)]
    pub ingest_binary: Option<PathBuf>,
}

/// One line of the summary: a measure, streamtable's figure, the references', and the verdict.
pub(super) struct Row {
    measure: String,
    ours: String,
    simple: String,
    fast: String,
    ratio: String,
    target: &'static str,
    met: Option<bool>,
}

impl Row {
    pub(super) fn new(measure: &str, ours: String) -> Row {
        Row {
            measure: measure.into(),
            ours,
            simple: String::new(),
            fast: String::new(),
            ratio: String::new(),
            target: "",
            met: None,
        }
    }
    pub(super) fn refs(mut self, simple: String, fast: String, ratio: String) -> Row {
        (self.simple, self.fast, self.ratio) = (simple, fast, ratio);
        self
    }
    pub(super) fn target(mut self, target: &'static str, met: bool) -> Row {
        (self.target, self.met) = (target, Some(met));
        self
    }
}

/// Runs the whole comparison and prints the summary table.
pub(super) async fn run(config: &Config, args: &ReferenceArgs) -> Result<()> {
    for script in ["ingest.py", "compact.py"] {
        let path = args.reference_dir.join(script);
        if !path.is_file() {
            return Err(Error::Config(format!(
                "{} not found: run from the repository root or pass --reference-dir",
                path.display()
            )));
        }
    }
    let dir = tempdir("bench-reference")?;
    let mut rows = Vec::new();
    let outcome = all(config, args, &dir, &mut rows).await;
    let _ = std::fs::remove_dir_all(&dir);
    outcome?;
    print_table(&rows);
    Ok(())
}

async fn all(config: &Config, args: &ReferenceArgs, dir: &Path, rows: &mut Vec<Row>) -> Result<()> {
    ingest::ingest(config, args, dir, rows).await?;
    if args.compact_mb > 0 {
        compaction::compaction(config, args, dir, rows).await?;
    }
    if args.demo_events > 0 {
        whole::demo(config, args, dir, rows)?;
    }
    whole::init(args, dir, rows)
}

fn print_table(rows: &[Row]) {
    let head = [
        "measure",
        "streamtable",
        "py simple",
        "py fast",
        "ratio",
        "target",
        "",
    ];
    let mut cells = vec![head.map(String::from)];
    cells.extend(rows.iter().map(|r| {
        let verdict = match r.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "",
        };
        [
            r.measure.clone(),
            r.ours.clone(),
            r.simple.clone(),
            r.fast.clone(),
            r.ratio.clone(),
            r.target.to_string(),
            verdict.to_string(),
        ]
    }));
    println!("\n{}", crate::cli::table_list::aligned(&cells));
}

pub(super) fn f1(v: f64) -> String {
    format!("{v:.1}")
}

pub(super) fn times(simple: f64, fast: f64) -> String {
    format!("{simple:.1}x / {fast:.1}x")
}

pub(super) fn check_count(got: u64, want: u64) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Internal(format!(
            "benchmark landed {got} of {want} records"
        )))
    }
}

pub(super) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io("read", path, e))
}

pub(super) fn parse(text: &str) -> Result<crate::esm::EsmEvent> {
    serde_json::from_str(text).map_err(|e| Error::Internal(format!("benchmark event: {e}")))
}

pub(super) fn exe() -> Result<PathBuf> {
    std::env::current_exe().map_err(|e| Error::io("find executable", "streamtable-bench", e))
}

/// The command line `streamtable`, built beside this executable (`scripts/bench` builds both).
pub(super) fn cli_exe() -> Result<PathBuf> {
    let exe = exe()?;
    let cli = exe.with_file_name("streamtable");
    if cli.exists() {
        Ok(cli)
    } else {
        Err(Error::Config(format!(
            "{} is missing: build the command line too (cargo build --release -p streamtable -p streamtable-bench, as scripts/bench does)",
            cli.display()
        )))
    }
}

/// Runs `cmd`, passing its stderr through, and parses the last line of its stdout as JSON.
pub(super) fn json_of(cmd: &mut Command, what: &str) -> Result<Value> {
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Error::io("run", what, e))?;
    if !out.status.success() {
        return Err(Error::Internal(format!("{what} failed ({})", out.status)));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).map_err(|e| Error::Internal(format!("{what} printed {last:?}: {e}")))
}

/// The number at a dotted `path` of a JSON object.
pub(super) fn num(v: &Value, path: &str) -> Result<f64> {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_f64)
        .ok_or_else(|| Error::Internal(format!("no number at {path} in {v}")))
}
