//! `streamtable-bench upsert`: the same order-status records landed into an append table and
//! into an upsert table (`mode = "upsert"`, `primary_key = ["order_id"]`) on the embedded
//! backend, committed in rounds as the scheduled stage does; then the upsert table read before
//! and after the compaction that applies its deletes, and what its key index weighs.

use std::path::Path;
use std::time::Instant;

use super::{cpu_seconds, tempdir};
use crate::backend::{Backend, BackendConfig};
use crate::error::{Error, Result};
use crate::generate::{Rng, SourceRecord, kafka_event};
use crate::spec::PipelineSpec;
use crate::tables::TableSet;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::ingest::Ingestor;
use streamtable::query::{QueryEngine, TimeTravel};

const STATUS: [&str; 4] = ["placed", "paid", "shipped", "cancelled"];
const PARTITIONS: u64 = 4;

fn spec(mode: &str) -> Result<PipelineSpec> {
    let key = if mode == "upsert" {
        "mode = \"upsert\"\nprimary_key = [\"order_id\"]\n"
    } else {
        ""
    };
    let text = format!(
        r#"
[[tables]]
name = "order_status"
topic = "order-status"
{key}partition_by = ["day(updated_at)"]
columns = [
  {{ name = "order_id", type = "string", required = true }},
  {{ name = "status", type = "string" }},
  {{ name = "amount", type = "decimal(12,2)" }},
  {{ name = "updated_at", type = "timestamp", required = true }},
]
"#
    );
    PipelineSpec::parse(
        &text,
        Path::new("bench-upsert.toml"),
        &streamtable::process::Planner,
    )
}

/// `records` status changes of `keys` orders, a key always on the same partition, in batches
/// of `batch` records.
fn batches(records: u64, keys: u64, batch: u64) -> Vec<Vec<SourceRecord>> {
    let mut rng = Rng::new(7);
    let mut offsets = [0i64; PARTITIONS as usize];
    let base = 1_795_946_400_000i64; // 2026-11-29T08:00:00Z
    let mut out = Vec::new();
    let mut current = Vec::new();
    for n in 0..records {
        let k = rng.below(keys);
        let partition = (k % PARTITIONS) as i32;
        let offset = offsets[partition as usize];
        offsets[partition as usize] += 1;
        let at = base + (n as i64) * 10;
        let value = format!(
            r#"{{"order_id":"ord-{k:08}","status":"{}","amount":"{}.{:02}","updated_at":"{}"}}"#,
            STATUS[rng.below(4) as usize],
            rng.below(500),
            rng.below(100),
            crate::clock::rfc3339_ms(at)
        );
        current.push(SourceRecord {
            topic: "order-status".into(),
            partition,
            offset,
            timestamp_ms: at,
            key: Some(format!("ord-{k:08}").into_bytes()),
            value: Some(value.into_bytes()),
            raw_value_field: None,
        });
        if current.len() as u64 == batch {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

struct Landed {
    seconds: f64,
    cpu: f64,
    ingest_seconds: f64,
    commit_seconds: f64,
}

async fn land(
    backend: &Backend,
    spec: &PipelineSpec,
    batches: &[Vec<SourceRecord>],
    per_round: usize,
) -> Result<Landed> {
    let tables = TableSet::new(spec, &backend.namespace)?;
    let ingestor = Ingestor::new(spec, backend)?;
    let events: Vec<_> = batches.iter().map(|b| kafka_event(b)).collect();
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let (mut ingest_seconds, mut commit_seconds) = (0.0, 0.0);
    for (i, event) in events.iter().enumerate() {
        let t = Instant::now();
        ingestor.handle(event).await?;
        ingest_seconds += t.elapsed().as_secs_f64();
        if (i + 1) % per_round == 0 || i + 1 == events.len() {
            let t = Instant::now();
            streamtable::commit::commit_pending(backend, &tables).await?;
            commit_seconds += t.elapsed().as_secs_f64();
        }
    }
    Ok(Landed {
        seconds: started.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - cpu,
        ingest_seconds,
        commit_seconds,
    })
}

/// Median seconds of `runs` full reads of the table through `streamtable query`'s engine.
async fn read_seconds(backend: &Backend, runs: usize) -> Result<(f64, i64)> {
    let mut times = Vec::new();
    let mut rows = 0;
    for _ in 0..runs {
        let engine = QueryEngine::new(backend, TimeTravel::Current).await?;
        let t = Instant::now();
        let out = engine
            .query("SELECT count(*), sum(amount), count(DISTINCT order_id) FROM order_status")
            .await?;
        times.push(t.elapsed().as_secs_f64());
        rows = out
            .first()
            .and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<arrow_array::Int64Array>()
                    .map(|a| a.value(0))
            })
            .unwrap_or(-1);
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], rows))
}

fn summary(backend_table: &iceberg::table::Table, key: &str) -> String {
    backend_table
        .metadata()
        .current_snapshot()
        .and_then(|s| s.summary().additional_properties.get(key).cloned())
        .unwrap_or_else(|| "0".into())
}

pub(super) async fn upsert(records: u64, keys: u64, batch: u64, per_round: usize) -> Result<()> {
    if records == 0 || keys == 0 || batch == 0 || per_round == 0 {
        return Err(Error::Config(
            "--records, --keys, --batch and --rounds-of must be positive".into(),
        ));
    }
    let input = batches(records, keys, batch);
    let bytes: usize = input
        .iter()
        .flatten()
        .map(|r| r.value.as_ref().map_or(0, Vec::len))
        .sum();
    println!(
        "{records} status changes of {keys} orders ({:.1} MB of values), {} batches of {batch}, a commit every {per_round} batches",
        bytes as f64 / 1e6,
        input.len()
    );
    let mut results = Vec::new();
    for mode in ["append", "upsert"] {
        let home = tempdir(&format!("bench-upsert-{mode}"))?;
        let backend = Backend::connect(&BackendConfig::Embedded { home: home.clone() }).await?;
        let spec = spec(mode)?;
        let landed = land(&backend, &spec, &input, per_round).await?;
        println!(
            "{mode:>6}: {:>9.0} records/s ({:.2} s: ingest {:.2} s, commit {:.2} s; CPU {:.2} s)",
            records as f64 / landed.seconds,
            landed.seconds,
            landed.ingest_seconds,
            landed.commit_seconds,
            landed.cpu
        );
        if mode == "upsert" {
            let tables = TableSet::new(&spec, &backend.namespace)?;
            let ident = tables.ident("order_status");
            let (table, _) = backend
                .catalog
                .load(&ident)
                .await?
                .ok_or_else(|| Error::Internal("order_status was not created".into()))?;
            let props = table
                .metadata()
                .current_snapshot()
                .map(|s| s.summary().additional_properties.clone())
                .unwrap_or_default();
            let newest = props
                .get(streamtable::table::KEY_INDEX_PROPERTY)
                .ok_or_else(|| Error::Internal("no key index".into()))?;
            let (dir, runs) = streamtable::upsert::index::named_runs(
                newest,
                props
                    .get(streamtable::table::KEY_INDEX_RUNS_PROPERTY)
                    .map(String::as_str),
            )
            .ok_or_else(|| Error::Internal("key index runs unreadable".into()))?;
            let mut index_bytes = 0;
            for r in &runs {
                let at = format!("{dir}/{}", r.name);
                index_bytes += table
                    .file_io()
                    .new_input(&at)
                    .map_err(|e| Error::iceberg("key index", e))?
                    .metadata()
                    .await
                    .map_err(|e| Error::iceberg("key index", e))?
                    .size;
            }
            println!(
                "        key index: {index_bytes} bytes in {} runs for {keys} keys ({:.1} bytes a key); data files {}, delete files {}, position deletes {}",
                runs.len(),
                index_bytes as f64 / keys as f64,
                summary(&table, "total-data-files"),
                summary(&table, "total-delete-files"),
                summary(&table, "total-position-deletes"),
            );
            let (before, rows) = read_seconds(&backend, 5).await?;
            let t = Instant::now();
            compact_all(
                &backend,
                &tables,
                &CompactOptions {
                    min_input_files: 2,
                    ..CompactOptions::default()
                },
            )
            .await?;
            let compaction = t.elapsed().as_secs_f64();
            let (after, rows_after) = read_seconds(&backend, 5).await?;
            let (table, _) = backend
                .catalog
                .load(&ident)
                .await?
                .ok_or_else(|| Error::Internal("order_status is gone".into()))?;
            println!(
                "        read (count, sum, distinct keys; {rows} rows): {:.1} ms with deletes, {:.1} ms after compaction ({compaction:.2} s; {rows_after} rows; delete files {}, data files {})",
                before * 1e3,
                after * 1e3,
                summary(&table, "total-delete-files"),
                summary(&table, "total-data-files"),
            );
        }
        results.push(landed.seconds);
        let _ = std::fs::remove_dir_all(&home);
    }
    println!(
        "upsert / append throughput: {:.0}%",
        results[0] / results[1] * 100.0
    );
    Ok(())
}
