//! Whole-process measures: the demo at scale, the ingest Lambda's init time and size.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::{ReferenceArgs, Row, cli_exe, exe, f1};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::{median, system};

pub(super) fn demo(
    config: &Config,
    args: &ReferenceArgs,
    dir: &Path,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let topics = config.load_pipeline()?.tables.len() as u64;
    println!(
        "== streamtable demo --events {} ({topics} topics)",
        args.demo_events
    );
    let started = Instant::now();
    let out = Command::new(cli_exe()?)
        .args(["demo", "--events", &args.demo_events.to_string()])
        .env("STREAMTABLE_HOME", dir.join("demo"))
        .env("STREAMTABLE_BACKEND", "embedded")
        .output()
        .map_err(|e| Error::io("run", "streamtable demo", e))?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(Error::Internal(format!(
            "streamtable demo failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let events = topics * args.demo_events;
    let rate = events as f64 / secs;
    println!("{events} events in {secs:.1} s (process start to exit) = {rate:.0} events/s");
    rows.push(
        Row::new(
            "(d) demo: events/s end to end (ingest, commit, compact, queries)",
            format!("{rate:.0}"),
        )
        .target(">= 200,000", rate >= 200_000.0),
    );
    Ok(())
}

pub(super) fn init(args: &ReferenceArgs, dir: &Path, rows: &mut Vec<Row>) -> Result<()> {
    let binary = match &args.ingest_binary {
        Some(b) => b.clone(),
        None => exe()?.with_file_name("ingest"),
    };
    if !binary.is_file() {
        return Err(Error::Config(format!(
            "{} not found: build it with `cargo build --release -p ingest` or pass --ingest-binary",
            binary.display()
        )));
    }
    println!("== ingest Lambda binary {}", binary.display());
    let embedded = [
        ("STREAMTABLE_BACKEND", "embedded".to_string()),
        ("STREAMTABLE_HOME", dir.join("init").display().to_string()),
    ];
    let aws = system::aws_init_env();
    let runs = 11;
    let init_embedded = median(system::init_ms(&binary, &embedded, runs)?);
    let init_aws = median(system::init_ms(&binary, &aws, runs)?);
    let imports = "import base64, json, sqlite3, pyarrow, pyarrow.json, pyarrow.parquet, pyiceberg.catalog.sql";
    let py_init = median(system::run_ms(&args.python, &["-c", imports], 5)?);
    println!(
        "start to first Runtime API poll: {init_aws:.1} ms (aws backend), {init_embedded:.1} ms (embedded); \
         Python interpreter + the reference's imports: {py_init:.0} ms"
    );
    rows.push(
        Row::new(
            "(e) start to first Runtime API poll, ms (aws backend)",
            f1(init_aws),
        )
        .refs(
            String::new(),
            format!("{py_init:.0} (imports)"),
            format!("{:.0}x", py_init / init_aws),
        )
        .target("<= 30", init_aws <= 30.0),
    );
    let (size, stripped) = system::sizes(&binary, dir)?;
    let mb = |b: u64| b as f64 / 1048576.0;
    let shown = stripped.unwrap_or(size);
    println!(
        "size: {:.1} MB, stripped {}",
        mb(size),
        stripped.map_or("(strip not found)".to_string(), |s| format!(
            "{:.1} MB",
            mb(s)
        ))
    );
    rows.push(
        Row::new(
            "    release ingest binary, stripped, MB",
            format!("{:.1}", mb(shown)),
        )
        .target("<= 30", mb(shown) <= 30.0),
    );
    Ok(())
}
