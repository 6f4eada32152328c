//! `streamtable-bench process`: what derived tables cost ingest — the 10,000-order batch with
//! `orders_clean` against the topic's table alone, the ingest Lambda's start with the SQL
//! planned, and the size of the ingest binary.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::ingest::orders_stream_event;
use super::{median, system, tempdir};
use crate::backend::{Backend, BackendConfig};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::spec::PipelineSpec;
use crate::tables::TableSet;
use streamtable::ingest::Ingestor;

/// What [`measure`] found.
struct Measured {
    /// Median ms of `encode_event` (event JSON parsed, decoded, derived, encoded to Parquet in
    /// memory).
    encode_ms: f64,
    /// Median ms of `handle` (the same, then files written and checkpoint advanced), each on a
    /// fresh batch after the earlier ones.
    e2e_ms: f64,
    /// Files of one batch.
    files: usize,
    /// The largest partition state of one batch on its own, and after all iterations (bytes).
    state_one: u64,
    state_all: u64,
}

/// Measures `spec` on `event` (`iterations` times; end to end on fresh batches).
async fn measure(
    spec: &PipelineSpec,
    event: &str,
    partitions: i32,
    iterations: usize,
) -> Result<Measured> {
    let home = tempdir("bench-process")?;
    let backend = Backend::connect(&BackendConfig::Embedded { home: home.clone() }).await?;
    let tables = TableSet::new(spec, &backend.namespace)?;
    if tables.references.contains_key("currency_rates") {
        streamtable::references::append_rows(
            &backend,
            &tables,
            "currency_rates",
            &crate::generate::currency_rates()?,
        )
        .await?;
    }
    let ingestor = Ingestor::new(spec, &backend)?;
    let (mut encode_ms, mut e2e_ms) = (Vec::new(), Vec::new());
    let (mut files, mut state_bytes) = (0, 0);
    let records = count(event)?;
    for i in 0..iterations {
        let t0 = Instant::now();
        let parsed: crate::esm::EsmEvent = serde_json::from_str(event)
            .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
        let encoded = ingestor.encode_event_counted(&parsed).await?;
        encode_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        if encoded.records != records {
            return Err(Error::Internal(format!(
                "bench encoded {} of {records} records",
                encoded.records
            )));
        }
        files = encoded.files.len();
        state_bytes = encoded.state_bytes.iter().copied().max().unwrap_or(0);
        let fresh = orders_stream_event(records, partitions, (i as i64 + 1) * records as i64);
        let t0 = Instant::now();
        let parsed: crate::esm::EsmEvent = serde_json::from_str(&fresh)
            .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
        ingestor.handle(&parsed).await?;
        e2e_ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let sources: Vec<crate::checkpoint::SourcePartition> = (0..partitions)
        .map(|p| crate::checkpoint::SourcePartition::new("orders", p))
        .collect();
    let state_all = backend
        .state
        .partition_states(&sources)
        .await?
        .iter()
        .flatten()
        .map(|s| s.bytes)
        .max()
        .unwrap_or(0);
    let _ = std::fs::remove_dir_all(&home);
    Ok(Measured {
        encode_ms: median(encode_ms),
        e2e_ms: median(e2e_ms),
        files,
        state_one: state_bytes,
        state_all,
    })
}

/// Records in an event's JSON.
fn count(event: &str) -> Result<u64> {
    let parsed: crate::esm::EsmEvent =
        serde_json::from_str(event).map_err(|e| Error::Internal(format!("bench event: {e}")))?;
    Ok(parsed.records.values().map(|r| r.len() as u64).sum())
}

fn ingest_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("find executable", "streamtable-bench", e))?;
    Ok(exe.with_file_name("ingest"))
}

pub(super) async fn process(
    config: &Config,
    records: u64,
    partitions: i32,
    iterations: usize,
    binary: Option<&Path>,
) -> Result<()> {
    let full = config.load_pipeline()?;
    let mut raw = full.clone();
    raw.retain_tables(|t| t.topic == "orders");
    raw.derived.clear();
    let mut clean = full.clone();
    clean.retain_tables(|t| t.topic == "orders");
    clean.derived.retain(|d| d.table.name == "orders_clean");
    if clean.derived.is_empty() {
        return Err(Error::Config(
            "the pipeline spec has no orders_clean derived table to measure".into(),
        ));
    }
    let mut windowed = full.clone();
    windowed.retain_tables(|t| t.topic == "orders");
    windowed
        .derived
        .retain(|d| d.table.name == "orders_clean" || d.view.is_some());
    let event = orders_stream_event(records, partitions, 0);
    let records = count(&event)?;
    let mb = event.len() as f64 / 1e6;
    println!(
        "batch: {records} order records over {partitions} partitions (out of order, late records and producer copies, as the demo streams them), event JSON {mb:.2} MB; median of {iterations}"
    );
    let raw = measure(&raw, &event, partitions, iterations).await?;
    let (raw_encode, raw_e2e, raw_files) = (raw.encode_ms, raw.e2e_ms, raw.files);
    let clean = measure(&clean, &event, partitions, iterations).await?;
    let (clean_encode, clean_e2e, clean_files) = (clean.encode_ms, clean.e2e_ms, clean.files);
    let line = |name: &str, encode: f64, e2e: f64, files: usize| {
        println!(
            "{name:<44} encode {encode:>6.1} ms ({:>7.0} records/s), end to end {e2e:>6.1} ms ({:>7.0} records/s); {files} files",
            records as f64 / (encode / 1e3),
            records as f64 / (e2e / 1e3),
        );
    };
    line("orders only", raw_encode, raw_e2e, raw_files);
    line(
        "orders + orders_clean",
        clean_encode,
        clean_e2e,
        clean_files,
    );
    println!(
        "throughput with orders_clean: {:.0}% of orders only (encode), {:.0}% (end to end)",
        100.0 * raw_encode / clean_encode,
        100.0 * raw_e2e / clean_e2e
    );
    if windowed.derived.iter().any(|d| d.view.is_some()) {
        let names: Vec<&str> = windowed
            .derived
            .iter()
            .map(|d| {
                d.view
                    .as_ref()
                    .map_or(d.table.name.as_str(), |v| v.name.as_str())
            })
            .collect();
        let w = measure(&windowed, &event, partitions, iterations).await?;
        let (w_encode, w_e2e, w_files) = (w.encode_ms, w.e2e_ms, w.files);
        line(
            &format!("orders + {}", names.join(" + ")),
            w_encode,
            w_e2e,
            w_files,
        );
        println!(
            "throughput with windows and dedup: {:.0}% of orders only (encode), {:.0}% (end to end)",
            100.0 * raw_encode / w_encode,
            100.0 * raw_e2e / w_e2e
        );
        println!(
            "largest partition state: {} bytes after one batch, {} bytes after {iterations} (keys expire an hour of event time after their first)",
            w.state_one, w.state_all,
        );
    }

    let binary = ingest_binary(binary)?;
    if !binary.exists() {
        println!(
            "no ingest binary at {} (build it: cargo build --release -p ingest); init and size skipped",
            binary.display()
        );
        return Ok(());
    }
    let dir = tempdir("bench-process-init")?;
    let raw_spec = dir.join("orders-only.toml");
    std::fs::write(&raw_spec, RAW_ONLY).map_err(|e| Error::io("write", &raw_spec, e))?;
    let env = |pipeline: Option<&Path>| {
        let mut v = system::aws_init_env();
        if let Some(p) = pipeline {
            v.push(("STREAMTABLE_PIPELINE", p.display().to_string()));
        }
        v
    };
    let runs = 11;
    let with_sql = median(system::init_ms(&binary, &env(None), runs)?);
    let without = median(system::init_ms(&binary, &env(Some(&raw_spec)), runs)?);
    println!(
        "ingest Lambda, process start to first Runtime API poll (AWS backend, median of {runs}): {with_sql:.1} ms with the shipped spec (2 derived tables planned), {without:.1} ms with one topic and no SQL"
    );
    let (size, stripped) = system::sizes(&binary, &dir)?;
    println!(
        "ingest binary {}: {:.1} MB as built{}",
        binary.display(),
        size as f64 / 1e6,
        stripped.map_or(String::new(), |s| format!(
            ", {:.1} MB stripped",
            s as f64 / 1e6
        ))
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One topic, no derived tables: the start without SQL to plan.
const RAW_ONLY: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
partition_by = ["day(created_at)"]
columns = [
  { name = "order_id",    type = "string",        required = true },
  { name = "customer_id", type = "string" },
  { name = "amount",      type = "decimal(18,2)", required = true },
  { name = "currency",    type = "string" },
  { name = "country",     type = "string" },
  { name = "status",      type = "string" },
  { name = "created_at",  type = "timestamp",     required = true },
]
"#;
