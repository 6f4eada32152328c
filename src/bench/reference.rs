//! `streamtable bench reference`: streamtable side by side with the Python Lambda a team would
//! write instead (bench/reference/: pyarrow + pyiceberg), on the same inputs in one run.
//!
//! Ratios are of CPU time (process CPU, all threads): "per core", so a Python library that
//! spreads work over both cores is not flattered by the wall clock. Wall times are printed too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

use super::{compact, cpu_seconds, median, system, tempdir};
use crate::cli::{now_ms, synthetic_records};
use crate::config::{Backend, BackendConfig, Config};
use crate::error::{Error, Result};
use crate::generate::{EventFactory, esm_event};
use crate::ingest::Ingestor;
use crate::tables::TableSet;

/// Arguments of `streamtable bench reference`.
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
struct Row {
    measure: String,
    ours: String,
    simple: String,
    fast: String,
    ratio: String,
    target: &'static str,
    met: Option<bool>,
}

impl Row {
    fn new(measure: &str, ours: String) -> Row {
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
    fn refs(mut self, simple: String, fast: String, ratio: String) -> Row {
        (self.simple, self.fast, self.ratio) = (simple, fast, ratio);
        self
    }
    fn target(mut self, target: &'static str, met: bool) -> Row {
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
    ingest(config, args, dir, rows).await?;
    if args.compact_mb > 0 {
        compaction(config, args, dir, rows).await?;
    }
    if args.demo_events > 0 {
        demo(config, args, dir, rows)?;
    }
    init(args, dir, rows)
}

async fn ingest(
    config: &Config,
    args: &ReferenceArgs,
    dir: &Path,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let spec = config.load_pipeline()?;
    let (records, batches) = (args.records.max(1), args.batches.max(1));

    // The same input for every contestant: files of ESM event JSON, one batch each.
    let events = dir.join("events");
    std::fs::create_dir_all(&events).map_err(|e| Error::io("create", &events, e))?;
    let mut factory = EventFactory::new(42);
    let mut offsets = vec![0i64; args.partitions.max(1) as usize];
    let start_ms = now_ms() - 3_600_000;
    let mut files = Vec::new();
    for i in 0..batches {
        let recs = synthetic_records(
            &mut factory,
            "orders",
            records,
            &mut offsets,
            i * records,
            0,
            start_ms,
        );
        let file = events.join(format!("batch-{i:04}.json"));
        std::fs::write(&file, esm_event(&recs)).map_err(|e| Error::io("write", &file, e))?;
        files.push(file);
    }
    let first = read(&files[0])?;
    let mb = first.len() as f64 / 1e6;
    println!(
        "== ingest: {batches} ESM batches of {records} orders over {} partitions, {mb:.2} MB of event JSON each",
        args.partitions
    );

    // Hot path: one batch, event JSON to Parquet bytes in memory.
    let scratch = Backend::connect(&BackendConfig::Embedded {
        home: dir.join("scratch"),
    })
    .await?;
    let ingestor = Ingestor::new(&spec, &scratch)?;
    let (mut hot_wall, mut hot_cpu) = (Vec::new(), Vec::new());
    for _ in 0..args.iterations.max(1) {
        let (w, c) = (Instant::now(), cpu_seconds());
        let event = parse(&first)?;
        let (n, _) = ingestor.encode_event(&event).await?;
        drop(event);
        hot_cpu.push((cpu_seconds() - c) * 1e3);
        hot_wall.push(w.elapsed().as_secs_f64() * 1e3);
        check_count(n, records)?;
    }
    let (hot_wall, hot_cpu) = (median(hot_wall), median(hot_cpu));
    println!(
        "streamtable: decode to Parquet in memory {hot_cpu:.1} ms CPU ({hot_wall:.1} ms wall)"
    );

    // Every batch end to end on the embedded backend (files + checkpoint), then the commit.
    let home = dir.join("rust");
    let backend = Backend::connect(&BackendConfig::Embedded { home: home.clone() }).await?;
    let ingestor = Ingestor::new(&spec, &backend)?;
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for file in &files {
        let text = read(file)?;
        let (w, c) = (Instant::now(), cpu_seconds());
        let summary = ingestor.handle(&parse(&text)?).await?;
        cpu.push((cpu_seconds() - c) * 1e3);
        wall.push(w.elapsed().as_secs_f64() * 1e3);
        check_count(summary.accepted, records)?;
    }
    let tables = TableSet::new(&spec, &backend.namespace)?;
    let (w, c) = (Instant::now(), cpu_seconds());
    let report = crate::commit::commit_pending(&backend, &tables).await?;
    let (commit_wall, commit_cpu) = (w.elapsed().as_secs_f64() * 1e3, (cpu_seconds() - c) * 1e3);
    check_count(report.rows(), records * batches)?;
    let per_batch = |v: &[f64], commit: f64| median(v.to_vec()) + commit / batches as f64;
    let (batch_wall, batch_cpu) = (per_batch(&wall, commit_wall), per_batch(&cpu, commit_cpu));
    let all_wall = (wall.iter().sum::<f64>() + commit_wall) / 1e3;
    let all_cpu = (cpu.iter().sum::<f64>() + commit_cpu) / 1e3;
    println!(
        "streamtable: {batches} batches in {all_cpu:.2} s CPU ({all_wall:.2} s wall), commit of {} files {commit_wall:.0} ms",
        report.files()
    );
    let rss = json_of(
        Command::new(exe()?)
            .args(["bench", "ingest-once", "--json", "--event"])
            .arg(&files[0])
            .env("STREAMTABLE_HOME", dir.join("rss"))
            .env("STREAMTABLE_BACKEND", "embedded"),
        "streamtable bench ingest-once",
    )?;
    let rss = num(&rss, "rss_mb")?;

    // The Python reference on the same files, checked row for row against streamtable's table.
    let mut py = Vec::new();
    for mode in ["simple", "fast"] {
        let script = args.reference_dir.join("ingest.py");
        let out = json_of(
            Command::new(&args.python)
                .arg(&script)
                .args(["--mode", mode, "--events"])
                .arg(&events)
                .arg("--home")
                .arg(dir.join(format!("py-{mode}")))
                .args(["--hot-iterations", &args.iterations.max(1).to_string()])
                .arg("--check-against")
                .arg(&home),
            "bench/reference/ingest.py (needs pyarrow and pyiceberg: scripts/bench installs them)",
        )?;
        let equal = out["check"]["equal"].as_bool() == Some(true);
        let detail = out["check"]["detail"]
            .as_str()
            .unwrap_or("no check")
            .to_string();
        if !equal {
            return Err(Error::Internal(format!(
                "the Python reference ({mode}) and streamtable wrote different tables: {detail}"
            )));
        }
        let rss_once = json_of(
            Command::new(&args.python)
                .arg(&script)
                .args(["--mode", mode, "--rss-once"])
                .arg(&files[0])
                .arg("--home")
                .arg(dir.join(format!("py-rss-{mode}"))),
            "bench/reference/ingest.py --rss-once",
        )?;
        println!(
            "python {mode}: decode to Parquet {:.1} ms CPU, one batch landed {:.1} ms CPU, {batches} batches {:.2} s CPU; tables equal ({detail})",
            num(&out, "hot.cpu_ms")?,
            num(&out, "batch.cpu_ms")?,
            num(&out, "all.cpu_s")?
        );
        py.push((out, num(&rss_once, "rss_mb")?));
    }
    let (simple, fast) = (&py[0].0, &py[1].0);
    let ratios = |ours: f64, key: &str| -> Result<(f64, f64)> {
        Ok((num(simple, key)? / ours, num(fast, key)? / ours))
    };

    let (rs, rf) = ratios(hot_cpu, "hot.cpu_ms")?;
    rows.push(
        Row::new(
            "one batch: event JSON -> Parquet in memory, CPU ms",
            f1(hot_cpu),
        )
        .refs(
            f1(num(simple, "hot.cpu_ms")?),
            f1(num(fast, "hot.cpu_ms")?),
            times(rs, rf),
        )
        .target(">= 5x simple, >= 2.5x fast", rs >= 5.0 && rf >= 2.5),
    );
    let per_core = mb / (hot_cpu / 1e3);
    rows.push(
        Row::new(
            "  = MB of event JSON per CPU-second",
            format!("{per_core:.0}"),
        )
        .refs(
            format!("{:.0}", mb / (num(simple, "hot.cpu_ms")? / 1e3)),
            format!("{:.0}", mb / (num(fast, "hot.cpu_ms")? / 1e3)),
            String::new(),
        )
        .target(">= 100", per_core >= 100.0),
    );
    let (rs, rf) = ratios(batch_cpu, "batch.cpu_ms")?;
    rows.push(
        Row::new(
            "(a) one batch landed in the table (+checkpoint), CPU ms",
            f1(batch_cpu),
        )
        .refs(
            f1(num(simple, "batch.cpu_ms")?),
            f1(num(fast, "batch.cpu_ms")?),
            times(rs, rf),
        )
        .target(">= 5x simple, >= 2.5x fast", rs >= 5.0 && rf >= 2.5),
    );
    rows.push(Row::new("    wall ms", f1(batch_wall)).refs(
        f1(num(simple, "batch.wall_ms")?),
        f1(num(fast, "batch.wall_ms")?),
        times(
            num(simple, "batch.wall_ms")? / batch_wall,
            num(fast, "batch.wall_ms")? / batch_wall,
        ),
    ));
    let (rs, rf) = ratios(all_cpu, "all.cpu_s")?;
    rows.push(
        Row::new(
            &format!("(b) {batches} batches, CPU s"),
            format!("{all_cpu:.2}"),
        )
        .refs(
            format!("{:.2}", num(simple, "all.cpu_s")?),
            format!("{:.2}", num(fast, "all.cpu_s")?),
            times(rs, rf),
        )
        .target(">= 5x simple, >= 2.5x fast", rs >= 5.0 && rf >= 2.5),
    );
    rows.push(Row::new("    wall s", format!("{all_wall:.2}")).refs(
        format!("{:.2}", num(simple, "all.wall_s")?),
        format!("{:.2}", num(fast, "all.wall_s")?),
        times(
            num(simple, "all.wall_s")? / all_wall,
            num(fast, "all.wall_s")? / all_wall,
        ),
    ));
    rows.push(
        Row::new("peak RSS of one invocation, MB", format!("{rss:.0}"))
            .refs(
                format!("{:.0}", py[0].1),
                format!("{:.0}", py[1].1),
                String::new(),
            )
            .target("<= 128", rss <= 128.0),
    );
    Ok(())
}

async fn compaction(
    config: &Config,
    args: &ReferenceArgs,
    dir: &Path,
    rows: &mut Vec<Row>,
) -> Result<()> {
    const TARGET_MB: u64 = 128;
    println!(
        "== compaction: {} MB of 1-5 MB files into {TARGET_MB} MB files",
        args.compact_mb
    );
    let mut ours = Vec::new();
    let mut python = None;
    for reencode in [false, true] {
        let home = dir.join(if reencode {
            "compact-reencode"
        } else {
            "compact-copy"
        });
        let line = compact::prepare(config, &home, args.compact_mb, TARGET_MB).await?;
        if !reencode {
            println!("{line}");
            // pyarrow reads the same table's files before streamtable compacts them.
            python = Some(json_of(
                Command::new(&args.python)
                    .arg(args.reference_dir.join("compact.py"))
                    .arg("--home")
                    .arg(&home)
                    .args(["--target-mb", &TARGET_MB.to_string(), "--out"])
                    .arg(dir.join("compact-python")),
                "bench/reference/compact.py",
            )?);
            let _ = std::fs::remove_dir_all(dir.join("compact-python"));
        }
        let out = compact::compact_in_fresh_process(&home, TARGET_MB, reencode, true)?;
        let out: Value = serde_json::from_str(out.trim())
            .map_err(|e| Error::Internal(format!("bench compact-once printed {out:?}: {e}")))?;
        let _ = std::fs::remove_dir_all(&home);
        ours.push(out);
    }
    let python = python.ok_or_else(|| Error::Internal("no pyarrow compaction result".into()))?;
    let rate = |v: &Value, t: &str| -> Result<f64> { Ok(num(v, "input_mb")? / num(v, t)?) };
    let py_cpu = rate(&python, "cpu_s")?;
    let py_wall = rate(&python, "wall_s")?;
    for (out, what) in ours
        .iter()
        .zip(["large row groups copied", "every row group re-encoded"])
    {
        let (cpu, wall, rss) = (
            rate(out, "cpu_s")?,
            rate(out, "wall_s")?,
            num(out, "rss_mb")?,
        );
        println!(
            "streamtable ({what}): {cpu:.0} MB/s per CPU-second, {wall:.0} MB/s wall, {} files, RSS {rss:.0} MB",
            num(out, "output_files")?
        );
        rows.push(
            Row::new(
                &format!("(c) compaction, {what}: MB/CPU-s"),
                format!("{cpu:.0}"),
            )
            .refs(
                String::new(),
                format!("{py_cpu:.0}"),
                format!("{:.1}x pyarrow", cpu / py_cpu),
            )
            .target(">= 150", cpu >= 150.0),
        );
        rows.push(
            Row::new("    wall MB/s; peak RSS MB", format!("{wall:.0}; {rss:.0}"))
                .refs(
                    String::new(),
                    format!("{py_wall:.0}; {:.0}", num(&python, "rss_mb")?),
                    format!("{:.1}x", wall / py_wall),
                )
                .target("RSS <= 512", rss <= 512.0),
        );
    }
    println!(
        "pyarrow read-and-rewrite: {py_cpu:.0} MB/s per CPU-second, {py_wall:.0} MB/s wall, {} files, RSS {:.0} MB",
        num(&python, "output_files")?,
        num(&python, "rss_mb")?
    );
    Ok(())
}

fn demo(config: &Config, args: &ReferenceArgs, dir: &Path, rows: &mut Vec<Row>) -> Result<()> {
    let topics = config.load_pipeline()?.tables.len() as u64;
    println!(
        "== streamtable demo --events {} ({topics} topics)",
        args.demo_events
    );
    let started = Instant::now();
    let out = Command::new(exe()?)
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

fn init(args: &ReferenceArgs, dir: &Path, rows: &mut Vec<Row>) -> Result<()> {
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
    let aws = [
        ("STREAMTABLE_BACKEND", "aws".to_string()),
        ("STREAMTABLE_BUCKET", "bench-bucket".to_string()),
        ("STREAMTABLE_STATE_TABLE", "bench-state".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ACCESS_KEY_ID", "bench".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "bench".to_string()),
    ];
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
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
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
        })
        .collect();
    let mut width = head.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |row: &[String]| {
        let parts: Vec<String> = row
            .iter()
            .zip(width)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    println!();
    line(&head.map(String::from));
    for row in &cells {
        line(row);
    }
}

fn f1(v: f64) -> String {
    format!("{v:.1}")
}

fn times(simple: f64, fast: f64) -> String {
    format!("{simple:.1}x / {fast:.1}x")
}

fn check_count(got: u64, want: u64) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Internal(format!(
            "benchmark landed {got} of {want} records"
        )))
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io("read", path, e))
}

fn parse(text: &str) -> Result<crate::esm::EsmEvent> {
    serde_json::from_str(text).map_err(|e| Error::Internal(format!("benchmark event: {e}")))
}

fn exe() -> Result<PathBuf> {
    std::env::current_exe().map_err(|e| Error::io("find executable", "streamtable", e))
}

/// Runs `cmd`, passing its stderr through, and parses the last line of its stdout as JSON.
fn json_of(cmd: &mut Command, what: &str) -> Result<Value> {
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
fn num(v: &Value, path: &str) -> Result<f64> {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_f64)
        .ok_or_else(|| Error::Internal(format!("no number at {path} in {v}")))
}
