//! `streamtable-bench compact` and `bench commit`.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::{cpu_seconds, peak_rss_kb, tempdir};
use crate::backend::{Backend, BackendConfig};
use crate::cli::synthetic_records;
use crate::clock::now_ms;
use crate::config::Config;
use crate::decode::{Cell, RowBuilder};
use crate::error::{Error, Result};
use crate::generate::{EventFactory, Rng, esm_event};
use crate::kafka::RecordMeta;
use crate::spec::PipelineSpec;
use crate::tables::TableSet;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::ingest::Ingestor;

const COUNTRIES: [&str; 8] = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CA"];
const CURRENCIES: [&str; 8] = ["USD", "EUR", "EUR", "GBP", "JPY", "BRL", "INR", "CAD"];
const STATUS: [&str; 4] = ["placed", "paid", "paid", "shipped"];

fn bench_spec(config: &Config, target_mb: u64) -> Result<PipelineSpec> {
    let mut spec = crate::spine_spec(config)?;
    for t in &mut spec.tables {
        t.target_file_size_mb = target_mb;
    }
    Ok(spec)
}

/// `rows` synthetic orders of one day, as an Arrow batch of the orders table.
fn orders_batch(
    spec: &PipelineSpec,
    tables: &TableSet,
    rng: &mut Rng,
    first: i64,
    rows: usize,
) -> Result<arrow_array::RecordBatch> {
    let table = spec
        .table("orders")
        .ok_or_else(|| Error::Config("the pipeline spec has no orders table".into()))?;
    let layout = tables.get("orders")?.layout.clone();
    let mut b = RowBuilder::new(table, layout, rows)?;
    let day = 1_795_910_400_000_000i64; // 2026-11-29T00:00:00Z in µs
    for i in 0..rows as i64 {
        let n = first + i;
        let c = rng.below(8) as usize;
        let at = day + rng.below(86_400_000_000) as i64;
        let cells = [
            Cell::Str(Cow::Owned(format!("ord-{n:010}"))),
            Cell::Str(Cow::Owned(format!("cus-{:06}", rng.below(100_000)))),
            Cell::Decimal(500 + rng.below(49_500) as i128),
            Cell::Str(Cow::Borrowed(CURRENCIES[c])),
            Cell::Str(Cow::Borrowed(COUNTRIES[c])),
            Cell::Str(Cow::Borrowed(STATUS[rng.below(4) as usize])),
            Cell::Timestamp(at),
        ];
        b.append(
            &cells,
            RecordMeta {
                partition: (n % 8) as i32,
                offset: n,
                timestamp_us: (at / 1000 + 250) * 1000,
                key: None,
                headers: &[],
            },
        );
    }
    b.finish()
}

pub(super) async fn compact(
    config: &Config,
    total_mb: u64,
    target_mb: u64,
    reencode: bool,
) -> Result<()> {
    let home = tempdir("bench-compact")?;
    let line = prepare(config, &home, total_mb, target_mb).await?;
    println!("{line}");
    let out = compact_in_fresh_process(&home, target_mb, reencode, false)?;
    print!("{out}");
    let _ = std::fs::remove_dir_all(&home);
    Ok(())
}

/// Writes `total_mb` of 1-5 MB orders files (one partition, one day) into the orders table of
/// an embedded backend in `home`, committed in one append; returns a line describing them.
pub(super) async fn prepare(
    config: &Config,
    home: &Path,
    total_mb: u64,
    target_mb: u64,
) -> Result<String> {
    let spec = bench_spec(config, target_mb)?;
    let backend = Backend::connect(&BackendConfig::Embedded {
        home: home.to_path_buf(),
    })
    .await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    let table = tables.ensure(&backend, "orders").await?;
    let layout = tables.get("orders")?.layout.clone();
    let location = table.metadata().location().to_string();
    let props = crate::table::encode::micro_file_properties();

    let mut rng = Rng::new(11);
    let mut bytes_per_row = 30.0f64;
    let (mut total, mut rows_total, mut files) = (0u64, 0i64, Vec::new());
    let target_total = total_mb * 1024 * 1024;
    let started = Instant::now();
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    while total < target_total {
        let want = (1 + rng.below(4)) as f64 * 1024.0 * 1024.0 + rng.below(1024 * 1024) as f64;
        let rows = ((want / bytes_per_row) as usize).max(1000);
        let batch = orders_batch(&spec, &tables, &mut rng, rows_total, rows)?;
        let stem = format!("bench-{rows_total:012}");
        for f in crate::table::encode::encode(&layout, &batch, &location, &stem, &props).await? {
            bytes_per_row = f.bytes.len() as f64 / rows as f64;
            total += f.bytes.len() as u64;
            backend
                .warehouse
                .write(&f.location, f.bytes.clone())
                .await?;
            files.push(f.data_file);
        }
        rows_total += rows as i64;
        if progress {
            eprint!(
                "\rpreparing small files: {} MB of {total_mb}",
                total / (1024 * 1024)
            );
        }
    }
    if progress {
        eprintln!();
    }
    let n_files = files.len();
    let tx = Transaction::new(&table);
    let tx = tx
        .fast_append()
        .add_data_files(files)
        .apply(tx)
        .map_err(|e| Error::iceberg("bench append", e))?;
    tx.commit(&backend.catalog)
        .await
        .map_err(|e| Error::iceberg("bench append", e))?;
    Ok(format!(
        "input: {n_files} files, {:.0} MB, {rows_total} rows ({:.1} bytes/row), prepared in {:.0} s",
        total as f64 / 1048576.0,
        total as f64 / rows_total as f64,
        started.elapsed().as_secs_f64()
    ))
}

/// Runs `streamtable-bench compact-once` on `home` in a fresh process (so its peak RSS is its own) and
/// returns what it printed.
pub(super) fn compact_in_fresh_process(
    home: &Path,
    target_mb: u64,
    reencode: bool,
    json: bool,
) -> Result<String> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("find executable", "streamtable-bench", e))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "compact-once",
        "--target-mb",
        &target_mb.to_string(),
        "--home",
    ])
    .arg(home);
    if reencode {
        cmd.arg("--reencode");
    }
    if json {
        cmd.arg("--json");
    }
    let out = cmd
        .output()
        .map_err(|e| Error::io("run", "streamtable-bench compact-once", e))?;
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(Error::Internal(format!(
            "streamtable-bench compact-once failed ({})",
            out.status
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(super) async fn compact_once(
    home: &Path,
    target_mb: u64,
    reencode: bool,
    json: bool,
) -> Result<()> {
    let config = Config {
        pipeline: None,
        backend: BackendConfig::Embedded {
            home: home.to_path_buf(),
        },
        topics: None,
    };
    let spec = bench_spec(&config, target_mb)?;
    let backend = Backend::connect(&config.backend).await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    let rss_before = peak_rss_kb();
    let started = Instant::now();
    let cpu = cpu_seconds();
    let options = CompactOptions {
        min_input_files: 2,
        stitch_min_row_group_bytes: if reencode {
            u64::MAX
        } else {
            CompactOptions::default().stitch_min_row_group_bytes
        },
        ..CompactOptions::default()
    };
    let report = compact_all(&backend, &tables, &options).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    let input: u64 = report.iter().map(|c| c.input_bytes).sum();
    let output: u64 = report.iter().map(|c| c.output_bytes).sum();
    let outputs: u64 = report.iter().map(|c| c.output_files).sum();
    let sizes: Vec<String> = report
        .iter()
        .map(|c| {
            format!(
                "{:.0} MB",
                (c.output_bytes / c.output_files.max(1)) as f64 / 1048576.0
            )
        })
        .collect();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "input_mb": input as f64 / 1048576.0,
                "input_files": report.iter().map(|c| c.input_files).sum::<u64>(),
                "output_files": outputs,
                "output_mb": output as f64 / 1048576.0,
                "wall_s": secs,
                "cpu_s": cpu,
                "rss_mb": peak_rss_kb() as f64 / 1024.0,
            })
        );
        return Ok(());
    }
    println!(
        "compaction ({}): {:.0} MB in {} files -> {outputs} files ({:.0} MB, mean {}) in {secs:.1} s = {:.0} MB/s of input; \
         peak RSS {:.0} MB (before: {:.0} MB)",
        if reencode {
            "every row group re-encoded"
        } else {
            "large row groups copied"
        },
        input as f64 / 1048576.0,
        report.iter().map(|c| c.input_files).sum::<u64>(),
        output as f64 / 1048576.0,
        sizes.join(", "),
        input as f64 / 1048576.0 / secs,
        peak_rss_kb() as f64 / 1024.0,
        rss_before as f64 / 1024.0,
    );
    Ok(())
}

pub(super) async fn commit(config: &Config, files: u64) -> Result<()> {
    let spec = crate::spine_spec(config)?;
    let home = tempdir("bench-commit")?;
    let backend = Backend::connect(&BackendConfig::Embedded { home: home.clone() }).await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    tables.ensure_all(&backend).await?;
    let ingestor = Arc::new(Ingestor::new(&spec, &backend)?);
    let mut factory = EventFactory::new(5);
    let partitions = 10usize;
    let mut offsets = vec![0i64; partitions];
    for round in 0..2 {
        let mut made = 0;
        while made < files {
            let recs = synthetic_records(
                &mut factory,
                "orders",
                20 * partitions as u64,
                &mut offsets,
                made,
                0,
                now_ms(),
            );
            let event = serde_json::from_str(&esm_event(&recs))
                .map_err(|e| Error::Internal(e.to_string()))?;
            made += ingestor.handle(&event).await?.files_written;
        }
        let started = Instant::now();
        let report = crate::commit::commit_pending(&backend, &tables).await?;
        println!(
            "commit of {} pending files ({} batches, {} rows) on the embedded backend{}: {:.0} ms",
            report.files(),
            report.batches,
            report.rows(),
            if round == 0 {
                ", empty table"
            } else {
                ", on top of the first"
            },
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    let _ = std::fs::remove_dir_all(&home);
    Ok(())
}
