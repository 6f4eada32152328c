//! The ingest comparison: one batch decoded to Parquet, every batch landed, peak RSS.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::{ReferenceArgs, Row, check_count, exe, f1, json_of, num, parse, read, times};
use crate::backend::{Backend, BackendConfig};
use crate::cli::synthetic_records;
use crate::clock::now_ms;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::{EventFactory, esm_event};
use crate::tables::TableSet;
use crate::{cpu_seconds, median};
use streamtable::ingest::Ingestor;

pub(super) async fn ingest(
    config: &Config,
    args: &ReferenceArgs,
    dir: &Path,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let spec = crate::spine_spec(config)?;
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
            .args(["ingest-once", "--json", "--event"])
            .arg(&files[0])
            .env("STREAMTABLE_HOME", dir.join("rss"))
            .env("STREAMTABLE_BACKEND", "embedded"),
        "streamtable-bench ingest-once",
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
