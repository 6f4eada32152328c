//! `streamtable-bench state`: what stateful derived tables cost as their state fills — a steady
//! stream of orders with random 128-bit order ids, the shipped spec's dedup (`orders_clean`,
//! within an hour) and 1-minute window, ESM batches over N partitions on the embedded backend.
//! Per step of event time: time per batch (against the topic's table alone), state bytes
//! written, S3 PUTs and DynamoDB write units for state per batch, state stored, and the time
//! and peak RSS of a cold container loading every partition's state (a child process).

use std::path::Path;
use std::time::Instant;

use super::{median, tempdir};
use crate::backend::{Backend, BackendConfig};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::{Rng, SourceRecord, esm_event};
use crate::spec::PipelineSpec;
use crate::tables::TableSet;
use streamtable::ingest::Ingestor;

/// What the benchmark runs: one rate and width.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    /// Orders per second of event time.
    pub rate: u64,
    /// Kafka partitions.
    pub partitions: i32,
    /// Hours of event time.
    pub hours: f64,
    /// Records per ESM batch.
    pub batch: u64,
    /// Minutes of event time per reported step.
    pub step_minutes: u64,
}

/// The shipped spec's orders with its dedup and its window (`raw`: the topic's table alone).
fn state_spec(config: &Config, raw: bool) -> Result<PipelineSpec> {
    let mut spec = config.load_pipeline()?;
    spec.retain_tables(|t| t.topic == "orders");
    if raw {
        spec.derived.clear();
    } else {
        spec.derived
            .retain(|d| d.table.name == "orders_clean" || d.view.is_some());
        if !spec.derived.iter().any(|d| d.dedup.is_some()) {
            return Err(Error::Config(
                "the pipeline spec has no orders_clean dedup to measure".into(),
            ));
        }
    }
    Ok(spec)
}

/// A stream of orders `rate` per second of event time from `start_ms`, round-robin over
/// `partitions`, with random 128-bit ids (as UUIDs or hashes are).
struct Stream {
    rng: Rng,
    rate: u64,
    partitions: i32,
    start_ms: i64,
    next: u64,
    offsets: Vec<i64>,
}

impl Stream {
    fn batch(&mut self, n: u64) -> String {
        let mut recs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let i = self.next;
            self.next += 1;
            let p = (i % self.partitions as u64) as usize;
            let at = self.start_ms + (i * 1000 / self.rate) as i64;
            let (order, _) = order(&mut self.rng, p, self.offsets[p], at);
            self.offsets[p] += 1;
            recs.push(order);
        }
        esm_event(&recs)
    }
}

/// An order with a random 128-bit id at `at` (and its id).
fn order(rng: &mut Rng, partition: usize, offset: i64, at: i64) -> (SourceRecord, String) {
    let id = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
    let value = format!(
        r#"{{"order_id":"{id}","customer_id":"c-{}","amount":"{}.{:02}","currency":"EUR","country":"DE","status":"paid","created_at":"{}"}}"#,
        rng.below(100_000),
        1 + rng.below(500),
        rng.below(100),
        crate::clock::rfc3339_ms(at)
    );
    let record = SourceRecord {
        topic: "orders".into(),
        partition: partition as i32,
        offset,
        timestamp_ms: at,
        key: Some(id.clone().into_bytes()),
        value: Some(value.into_bytes()),
        raw_value_field: None,
    };
    (record, id)
}

/// Orders with random 128-bit ids at `rate` per second of event time, round-robin over
/// `partitions`, and a payment for each up to 10 minutes after it (on the same partition
/// numbers of the payments topic): the shipped spec's topics as its derived tables meet them.
pub(super) struct Shop {
    rng: Rng,
    rate: u64,
    partitions: usize,
    start_ms: i64,
    next: u64,
    /// Next offsets: the orders' partitions, then the payments'.
    offsets: Vec<i64>,
    /// Payments waiting for their time: (at, order id).
    waiting: Vec<(i64, String)>,
    paid: u64,
}

impl Shop {
    pub(super) fn new(seed: u64, rate: u64, partitions: i32, start_ms: i64) -> Shop {
        let partitions = partitions.max(1) as usize;
        Shop {
            rng: Rng::new(seed),
            rate: rate.max(1),
            partitions,
            start_ms,
            next: 0,
            offsets: vec![0; 2 * partitions],
            waiting: Vec::new(),
            paid: 0,
        }
    }

    /// Starts every partition's offsets at `offset` (a topic that has run for a while).
    pub(super) fn starting_at(mut self, offset: i64) -> Shop {
        self.offsets.iter_mut().for_each(|o| *o = offset);
        self
    }

    /// The next `n` orders, and the payments due before the next order's time.
    pub(super) fn next(&mut self, n: u64) -> (Vec<SourceRecord>, Vec<SourceRecord>) {
        let mut orders = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let i = self.next;
            self.next += 1;
            let at = self.start_ms + (i * 1000 / self.rate) as i64;
            let p = (i % self.partitions as u64) as usize;
            let (record, id) = order(&mut self.rng, p, self.offsets[p], at);
            orders.push(record);
            self.offsets[p] += 1;
            self.waiting.push((at + self.rng.below(600_000) as i64, id));
        }
        let end = self.start_ms + (self.next * 1000 / self.rate) as i64;
        self.waiting.sort_unstable();
        let due = self.waiting.partition_point(|(at, _)| *at < end);
        let mut payments = Vec::with_capacity(due);
        for (at, order) in self.waiting.drain(..due) {
            let p = (self.paid % self.partitions as u64) as usize;
            let pid = format!("pay-{}", self.paid);
            self.paid += 1;
            let offset = &mut self.offsets[self.partitions + p];
            payments.push(SourceRecord {
                topic: "payments".into(),
                partition: p as i32,
                offset: *offset,
                timestamp_ms: at,
                key: Some(pid.clone().into_bytes()),
                value: Some(format!(
                    r#"{{"payment_id":"{pid}","order_id":"{order}","amount":"1.00","method":"card","status":"ok","attempted_at":"{}"}}"#,
                    crate::clock::rfc3339_ms(at)
                ).into_bytes()),
                raw_value_field: None,
            });
            *offset += 1;
        }
        (orders, payments)
    }
}

/// The state objects under the warehouse's `_state/` (location → bytes).
async fn state_objects(backend: &Backend) -> Result<std::collections::HashMap<String, u64>> {
    let prefix = format!("{}/_state/", backend.warehouse.root());
    Ok(backend
        .warehouse
        .list(&prefix)
        .await?
        .into_iter()
        .map(|o| (o.location, o.size))
        .collect())
}

/// DynamoDB write units the states of a batch cost in its transaction: the states of 16
/// partitions share an item (`state#{topic}#b{partition / 16}`), billed 2 units per KB of it,
/// at least 2. An entry is its two names, its `seq` and ~15 bytes of offsets and counters plus
/// its inline section, or 20 bytes naming a state file by hash (a directory of ~100 bytes
/// once per item); the keys ~30 bytes.
fn state_units(states: &[&crate::checkpoint::StoredState], partitions: &[i32]) -> u64 {
    const KEYS: u64 = 30;
    const DIRECTORY: u64 = 100;
    const ENTRY: u64 = 2 * 3 + 4 + 16;
    let mut items: std::collections::BTreeMap<i32, u64> = Default::default();
    for (s, p) in states.iter().zip(partitions) {
        let item = items.entry(p.div_euclid(16)).or_insert(KEYS);
        *item += ENTRY
            + match (&s.body, &s.location) {
                (Some(b), _) if !b.is_empty() => b.len() as u64,
                (_, Some(l)) if l.ends_with(".run") => 20,
                (_, Some(l)) => l.len() as u64,
                _ => 0,
            };
    }
    items
        .values()
        .map(|bytes| 2 * (bytes + DIRECTORY).div_ceil(1024).max(1))
        .sum()
}

/// One step's figures.
#[derive(Default)]
struct Step {
    batch_ms: Vec<f64>,
    written: u64,
    new_keys_bytes: u64,
    puts: u64,
    units: u64,
    batches: u64,
}

pub(super) async fn state(config: &Config, shapes: &[Shape]) -> Result<()> {
    for shape in shapes {
        run(config, *shape).await?;
    }
    Ok(())
}

async fn run(config: &Config, shape: Shape) -> Result<()> {
    let Shape {
        rate,
        partitions,
        hours,
        batch,
        step_minutes,
    } = shape;
    let spec = state_spec(config, false)?;
    let home = tempdir("bench-state")?;
    let backend = Backend::connect(&BackendConfig::Embedded { home: home.clone() }).await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    tables.ensure_all(&backend).await?;
    // The window's partials written on their own, so that the state files measured below hold
    // the state alone (they otherwise carry a batch's partials: table rows, not state).
    let ingestor = Ingestor::new(&spec, &backend)?;
    let options = streamtable::ingest::IngestOptions {
        max_carried_file_bytes: 0,
        ..ingestor.options().clone()
    };
    let ingestor = ingestor.with_options(options);
    // The topic's table alone on the same stream, for the ratio.
    let raw_spec = state_spec(config, true)?;
    let raw_home = tempdir("bench-state-raw")?;
    let raw_backend = Backend::connect(&BackendConfig::Embedded {
        home: raw_home.clone(),
    })
    .await?;
    let raw = Ingestor::new(&raw_spec, &raw_backend)?;
    let start_ms = crate::clock::now_ms() - ((hours + 1.0) * 3_600_000.0) as i64;
    let stream = |seed: u64| Stream {
        rng: Rng::new(seed),
        rate,
        partitions,
        start_ms,
        next: 0,
        offsets: vec![0; partitions as usize],
    };
    let (mut orders, mut raw_orders) = (stream(7), stream(7));
    let total = (hours * 3600.0 * rate as f64) as u64;
    let per_step = step_minutes * 60 * rate;
    println!(
        "state: {rate} orders/s of event time, {partitions} partitions, batches of {batch}, {hours} h; dedup by a random 128-bit order id within 1 h plus the 1-minute window"
    );
    println!(
        "{:>6} {:>9} {:>9} {:>6} {:>13} {:>12} {:>10} {:>8} {:>10} {:>9} {:>8}",
        "min",
        "batch ms",
        "raw ms",
        "ratio",
        "written/batch",
        "new keys",
        "PUTs/batch",
        "WRU/b",
        "stored",
        "cold ms",
        "cold RSS"
    );
    let mut known = state_objects(&backend).await?;
    let mut first_ms: Option<f64> = None;
    let mut done = 0u64;
    let mut step = Step::default();
    let mut raw_ms = Vec::new();
    while done < total {
        let n = batch.min(total - done);
        let event = orders.batch(n);
        let parsed: crate::esm::EsmEvent = serde_json::from_str(&event)
            .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
        let t0 = Instant::now();
        let summary = ingestor.handle(&parsed).await?;
        step.batch_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        // The same batch through the topic's table alone (every fourth, to save time).
        let raw_event = raw_orders.batch(n);
        if step.batches % 4 == 0 {
            let parsed: crate::esm::EsmEvent = serde_json::from_str(&raw_event)
                .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
            let t0 = Instant::now();
            raw.handle(&parsed).await?;
            raw_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        // What the batch wrote for state: new objects, and the items' bodies and names.
        let now = state_objects(&backend).await?;
        for (location, size) in &now {
            if !known.contains_key(location) {
                step.written += size;
                step.puts += 1;
            }
        }
        known = now;
        let sources: Vec<crate::checkpoint::SourcePartition> = (0..partitions)
            .map(|p| crate::checkpoint::SourcePartition::new("orders", p))
            .collect();
        let stored = backend.state.partition_states(&sources).await?;
        let (mut states, mut at) = (Vec::new(), Vec::new());
        for (source, s) in sources.iter().zip(&stored) {
            if let Some(s) = s {
                step.written += s.body.as_ref().map_or(0, |b| b.len() as u64);
                states.push(s);
                at.push(source.partition);
            }
        }
        step.units += state_units(&states, &at);
        // A new key is stored as 16 bytes of hash and 8 of time; its own bytes are the
        // 32-character id and an 8-byte time.
        step.new_keys_bytes += (summary.accepted - summary.deduplicated.min(summary.accepted)) * 24;
        step.batches += 1;
        done += n;
        if done.is_multiple_of(per_step) || done == total {
            let minutes = done / rate / 60;
            let batch_ms = median(std::mem::take(&mut step.batch_ms));
            let raw_batch = median(std::mem::take(&mut raw_ms));
            let first = *first_ms.get_or_insert(batch_ms);
            let stored: u64 = stored_bytes(&backend, partitions).await?;
            let (cold_ms, cold_rss) = cold_load(config, &home)?;
            println!(
                "{minutes:>6} {batch_ms:>9.1} {raw_batch:>9.1} {:>6.2} {:>13} {:>12} {:>10.2} {:>8.1} {:>10} {cold_ms:>9.0} {cold_rss:>7.0}M",
                batch_ms / raw_batch,
                human(step.written / step.batches),
                human(step.new_keys_bytes / step.batches),
                step.puts as f64 / step.batches as f64,
                step.units as f64 / step.batches as f64,
                human(stored),
            );
            if done == total {
                println!(
                    "last step: {:.2}× the first step's time per batch, {:.2}× the topic's table alone; state written per batch {:.2}× the batch's new keys as stored (24 bytes each), {:.2}× as they come (a 32-character id and an 8-byte time)",
                    batch_ms / first,
                    batch_ms / raw_batch,
                    step.written as f64 / step.new_keys_bytes.max(1) as f64,
                    step.written as f64 / (step.new_keys_bytes.max(1) as f64 * 40.0 / 24.0)
                );
            }
            step = Step::default();
        }
    }
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_dir_all(&raw_home);
    Ok(())
}

/// The state files live partitions' states are in or name, and inline states: bytes.
async fn stored_bytes(backend: &Backend, partitions: i32) -> Result<u64> {
    let sizes = state_objects(backend).await?;
    let mut live = std::collections::HashSet::new();
    let mut files = streamtable::ingest::StateFiles::default();
    let mut inline = 0;
    for p in 0..partitions {
        let source = crate::checkpoint::SourcePartition::new("orders", p);
        let Some(stored) = backend
            .state
            .partition_states(std::slice::from_ref(&source))
            .await?
            .pop()
            .flatten()
        else {
            continue;
        };
        inline += stored.body.as_ref().map_or(0, |b| b.len() as u64);
        live.extend(
            streamtable::ingest::state_files_in_use(
                &backend.warehouse,
                &mut files,
                &source,
                &stored,
            )
            .await?,
        );
    }
    Ok(inline + live.iter().filter_map(|l| sizes.get(l)).sum::<u64>())
}

/// A cold container loading every partition's state (a child process): ms and peak RSS (MB).
fn cold_load(config: &Config, home: &Path) -> Result<(f64, f64)> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("find executable", "streamtable-bench", e))?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(p) = &config.pipeline {
        cmd.arg("--pipeline").arg(p);
    }
    cmd.args(["state-load", "--home"]).arg(home);
    let out = cmd
        .output()
        .map_err(|e| Error::io("run", "streamtable-bench state-load", e))?;
    if !out.status.success() {
        return Err(Error::Internal(format!(
            "streamtable-bench state-load failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::Internal(format!("streamtable-bench state-load answer: {e}")))?;
    Ok((
        v["load_ms"].as_f64().unwrap_or(f64::NAN),
        v["rss_mb"].as_f64().unwrap_or(f64::NAN),
    ))
}

/// The child of [`cold_load`]: loads the states of every partition of `orders` at `home`.
pub(super) async fn state_load(config: &Config, home: &Path) -> Result<()> {
    let spec = state_spec(config, false)?;
    let backend = Backend::connect(&BackendConfig::Embedded {
        home: home.to_path_buf(),
    })
    .await?;
    let ingestor = Ingestor::new(&spec, &backend)?;
    let before = super::peak_rss_kb();
    let t0 = Instant::now();
    let entries = ingestor.load_topic_states("orders").await?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    println!(
        "{}",
        serde_json::json!({
            "load_ms": load_ms,
            "entries": entries,
            "rss_mb": super::peak_rss_kb() as f64 / 1024.0,
            "rss_before_mb": before as f64 / 1024.0,
        })
    );
    Ok(())
}

fn human(bytes: u64) -> String {
    if bytes >= 10_000_000 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else if bytes >= 10_000 {
        format!("{:.1} KB", bytes as f64 / 1e3)
    } else {
        format!("{bytes} B")
    }
}

/// The interval join of the benchmark: orders and their payments within an hour.
const JOIN: &str = r#"
[[derived_tables]]
name = "paid_orders"
sql = """
SELECT o.order_id, p.payment_id, o.amount, o.created_at, p.attempted_at
FROM orders o JOIN payments p
  ON o.order_id = p.order_id
 AND p.attempted_at BETWEEN o.created_at AND o.created_at + INTERVAL '1' HOUR
"""
"#;

/// `bench state --join`: orders at `rate` per second of event time and a payment for each up
/// to 10 minutes later, one ESM batch per topic and one commit round per minute of event time;
/// per step, the round's time, the rows kept, and the rows and bytes written for the join's
/// state against the round's new rows.
pub(super) async fn join(config: &Config, rate: u64, partitions: i32, hours: f64) -> Result<()> {
    let (text, path) = match &config.pipeline {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|e| Error::io("read", p, e))?,
            p.clone(),
        ),
        None => (
            crate::config::BUILTIN_PIPELINE.to_string(),
            "pipeline.toml".into(),
        ),
    };
    let mut spec = PipelineSpec::parse(&(text + JOIN), &path, &streamtable::process::Planner)?;
    spec.retain_tables(|t| t.topic == "orders" || t.topic == "payments");
    spec.derived.retain(|d| d.table.name == "paid_orders");
    let home = tempdir("bench-state-join")?;
    let backend = Backend::connect(&BackendConfig::Embedded { home: home.clone() }).await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    tables.ensure_all(&backend).await?;
    let ingestor = Ingestor::new(&spec, &backend)?;
    let start_ms = crate::clock::now_ms() - ((hours + 1.0) * 3_600_000.0) as i64;
    let mut shop = Shop::new(11, rate, partitions, start_ms);
    let per_minute = rate * 60;
    let minutes = (hours * 60.0) as u64;
    println!(
        "join: {rate} orders/s of event time and a payment each within 10 min, {partitions} partitions, one commit round per minute, {hours} h; orders ⋈ payments within 1 h"
    );
    println!(
        "{:>6} {:>9} {:>10} {:>12} {:>11} {:>8} {:>13}",
        "min", "round ms", "kept rows", "new rows", "rows written", "ratio", "bytes written"
    );
    let (mut round_ms, mut new_rows, mut written_rows, mut written_bytes, mut kept) =
        (Vec::new(), 0u64, 0u64, 0u64, 0u64);
    for minute in 0..minutes {
        let (orders, payments) = shop.next(per_minute);
        for recs in [&orders, &payments] {
            let parsed: crate::esm::EsmEvent = serde_json::from_str(&esm_event(recs))
                .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
            ingestor.handle(&parsed).await?;
        }
        let t0 = Instant::now();
        let report = crate::commit::commit_pending_with(
            &backend,
            &tables,
            &crate::commit::CommitOptions::default(),
            None,
        )
        .await?;
        round_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        for j in report.tables.iter().filter_map(|t| t.join.as_ref()) {
            new_rows += j.new_rows;
            written_rows += j.state_rows_written;
            written_bytes += j.state_bytes;
            kept = j.kept_rows;
        }
        if (minute + 1) % 10 == 0 || minute + 1 == minutes {
            let rounds = round_ms.len() as u64;
            println!(
                "{:>6} {:>9.0} {kept:>10} {:>12} {:>11} {:>8.2} {:>13}",
                minute + 1,
                median(std::mem::take(&mut round_ms)),
                new_rows / rounds,
                written_rows / rounds,
                written_rows as f64 / new_rows.max(1) as f64,
                human(written_bytes / rounds),
            );
            (new_rows, written_rows, written_bytes) = (0, 0, 0);
        }
    }
    let _ = std::fs::remove_dir_all(&home);
    Ok(())
}
