//! `streamtable-bench cost`: requests and dollars per GB of event JSON, counted by a proxy in
//! front of a moto server (`bench/cost/counting_proxy.py`; `scripts/bench-moto cost` starts both).
//!
//! For each width (Kafka partitions per ESM batch), on a fresh bucket, DynamoDB table and Glue
//! database: ingest `batches` full batches of orders (offsets from 10⁹, as on a topic that has
//! run for a while), then one commit, then one compaction — `cycles` times, all counted (size
//! tiers, `STREAMTABLE_COMPACT_TIER_RATIO`, pay off over several runs, not in one). The proxy bills every request as AWS
//! would (DynamoDB units from item sizes); the counts are scaled to one GB of event JSON and
//! priced with the README's list prices.

use std::collections::BTreeMap;
use std::time::Instant;

use super::cpu_seconds;
use crate::backend::{Backend, BackendConfig};
use crate::cli::synthetic_records;
use crate::clock::now_ms;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::{EventFactory, esm_event};
use crate::tables::TableSet;
use streamtable::ingest::Ingestor;

/// us-east-1 list prices (the README's).
const S3_PUT: f64 = 0.005 / 1000.0;
const S3_GET: f64 = 0.0004 / 1000.0;
const WRU: f64 = 0.625 / 1e6;
const RRU: f64 = 0.125 / 1e6;
const GLUE_REQUEST: f64 = 1.0 / 1e6;
const LAMBDA_REQUEST: f64 = 0.20 / 1e6;
const LAMBDA_GB_SECOND: f64 = 0.000_013_333_4;
/// vCPU share of a 1024 MB function.
const VCPU_AT_1024_MB: f64 = 0.58;
/// Firehose's price per GB, the reference the targets are set against.
const FIREHOSE_PER_GB: f64 = 0.07;

type Counts = BTreeMap<String, f64>;

async fn counts(endpoint: &str, reset: bool) -> Result<Counts> {
    let url = format!("{endpoint}/_counts");
    let client = reqwest_like(&url, reset).await?;
    serde_json::from_str(&client).map_err(|e| Error::Internal(format!("proxy counts: {e}")))
}

/// A GET or POST to the proxy's control endpoint (plain HTTP/1.1 over TCP; no HTTP client
/// crate is needed for one local request).
async fn reqwest_like(url: &str, post: bool) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::Config(format!("AWS_ENDPOINT_URL={url} is not http://host:port")))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| Error::Config(format!("counting proxy at {host}: {e}")))?;
    let method = if post { "POST" } else { "GET" };
    let req = format!(
        "{method} /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| Error::Internal(format!("counting proxy: {e}")))?;
    let mut out = String::new();
    stream
        .read_to_string(&mut out)
        .await
        .map_err(|e| Error::Internal(format!("counting proxy: {e}")))?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}

/// Dollars of one phase's counts.
fn dollars(c: &Counts) -> f64 {
    let g = |k: &str| c.get(k).copied().unwrap_or(0.0);
    (g("s3_put") + g("s3_list")) * S3_PUT
        + g("s3_get") * S3_GET
        + g("dynamodb_wru") * WRU
        + g("dynamodb_rru") * RRU
        + g("glue_requests") * GLUE_REQUEST
}

fn line(phase: &str, c: &Counts, per_gb: f64, extra: f64) -> String {
    let g = |k: &str| c.get(k).copied().unwrap_or(0.0) * per_gb;
    format!(
        "  {phase:<11} per GB: S3 PUT {:>7.0}  GET {:>6.0}  LIST {:>5.0} | DynamoDB WRU {:>7.0}  RRU {:>6.0} ({:>5.0} requests) | Glue {:>4.0} | ${:.5}",
        g("s3_put"),
        g("s3_get"),
        g("s3_list"),
        g("dynamodb_wru"),
        g("dynamodb_rru"),
        g("dynamodb_requests"),
        g("glue_requests"),
        dollars(c) * per_gb + extra
    )
}

/// A bucket and a DynamoDB table named `name` (on the endpoint of `AWS_ENDPOINT_URL`).
pub(super) async fn create_resources(name: &str) -> Result<()> {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let sdk = crate::aws::load_config().await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .build(),
    );
    s3.create_bucket()
        .bucket(name)
        .send()
        .await
        .map_err(|e| Error::Internal(format!("create bucket {name}: {e}")))?;
    let attr = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
    };
    let key = |n: &str, t| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
    };
    let built = |e: aws_sdk_dynamodb::error::BuildError| Error::Internal(e.to_string());
    aws_sdk_dynamodb::Client::new(&sdk)
        .create_table()
        .table_name(name)
        .attribute_definitions(attr("pk").map_err(built)?)
        .attribute_definitions(attr("sk").map_err(built)?)
        .key_schema(key("pk", KeyType::Hash).map_err(built)?)
        .key_schema(key("sk", KeyType::Range).map_err(built)?)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .map_err(|e| Error::Internal(format!("create table {name}: {e}")))?;
    Ok(())
}

/// Orders per second of event time in `--processing` runs: a 10,000-order batch spans 100 s,
/// so that windows close, keys accumulate and payments (up to 10 minutes after their order)
/// meet their orders within a few batches.
const PROCESSING_RATE: u64 = 100;

/// Event time ingested before counting starts in `--processing` runs (then committed and
/// compacted), ms: the spec's bounds (dedup and join within an hour) full and expiring, and
/// payments (up to 10 minutes behind their orders) caught up.
const PROCESSING_WARM_UP_MS: u64 = 4_200_000;

/// One step's ESM events (a topic's batch each) and their bytes.
struct Batch {
    events: Vec<String>,
}

impl Batch {
    fn bytes(&self) -> usize {
        self.events.iter().map(String::len).sum()
    }
}

/// The spine's batches: one batch more, first, not counted — a pipeline's steady state, not
/// its first minute (bucket items and entries are created once per partition).
fn spine_events(width: i32, batches: u64, records: u64) -> Vec<Batch> {
    let mut factory = EventFactory::new(7);
    let mut offsets = vec![1_000_000_000i64; width.max(1) as usize];
    (0..=batches)
        .map(|b| {
            let recs = synthetic_records(
                &mut factory,
                "orders",
                records,
                &mut offsets,
                b * records,
                0,
                now_ms() - 3_600_000,
            );
            Batch {
                events: vec![esm_event(&recs)],
            }
        })
        .collect()
}

/// Orders with random ids (keys that do not compress) at [`PROCESSING_RATE`] and their
/// payments, a batch of each per step, after [`PROCESSING_WARM_UP_MS`] of uncounted steps.
fn processing_events(width: i32, batches: u64, records: u64) -> Vec<Batch> {
    let step_ms = (records.max(1) * 1000 / PROCESSING_RATE).max(1);
    let steps = PROCESSING_WARM_UP_MS.div_ceil(step_ms) + batches;
    let span_ms = (steps * records * 1000 / PROCESSING_RATE) as i64;
    let mut shop =
        super::state::Shop::new(7, PROCESSING_RATE, width, now_ms() - span_ms - 3_600_000)
            .starting_at(1_000_000_000);
    (0..steps)
        .map(|_| {
            let (orders, payments) = shop.next(records);
            let mut events = vec![esm_event(&orders)];
            if !payments.is_empty() {
                events.push(esm_event(&payments));
            }
            Batch { events }
        })
        .collect()
}

/// One compaction run as the scheduled stage does it.
async fn compact(
    backend: &Backend,
    tables: &TableSet,
    options: &streamtable::compact::CompactOptions,
) -> Result<Vec<streamtable::compact::PartitionCompaction>> {
    streamtable::compact::compact_all(backend, tables, options).await
}

/// The compaction options of the scheduled stage's environment
/// (`STREAMTABLE_COMPACT_TIER_RATIO` and the rest), with at least 2 input files unless
/// `STREAMTABLE_COMPACT_MIN_FILES` says otherwise: a run's files are merged by that run.
fn compact_options() -> Result<streamtable::compact::CompactOptions> {
    let mut options = crate::scheduled::ScheduledOptions::from_env()?.compaction;
    if std::env::var_os("STREAMTABLE_COMPACT_MIN_FILES").is_none() {
        options.min_input_files = 2;
    }
    Ok(options)
}

/// Adds one phase's counts to its total over the cycles.
fn add(total: &mut Counts, more: Counts) {
    for (k, v) in more {
        *total.entry(k).or_default() += v;
    }
}

/// Runs the benchmark for each width.
pub(super) async fn cost(
    config: &Config,
    widths: &[i32],
    batches: u64,
    cycles: u64,
    records: u64,
    processing: bool,
) -> Result<()> {
    let options = compact_options()?;
    let endpoint = std::env::var("AWS_ENDPOINT_URL")
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            Error::Config(
                "streamtable-bench cost counts requests through a proxy: run scripts/bench-moto, which starts moto and the proxy and sets AWS_ENDPOINT_URL"
                    .into(),
            )
        })?;
    let mut spec = config.load_pipeline()?;
    if processing {
        // The orders and payments topics with every derived table over them: the shipped
        // spec's dedup, window and interval join.
        spec.retain_tables(|t| t.topic == "orders" || t.topic == "payments");
        if !spec.tables.iter().any(|t| t.topic == "payments") || spec.derived.is_empty() {
            return Err(Error::Config(
                "streamtable-bench cost --processing: the pipeline spec needs tables for the orders and payments topics and derived tables over them (the shipped infra/pipeline.toml has them)".into(),
            ));
        }
    } else {
        // The spine's cost: the orders topic landing as one table.
        spec.retain_tables(|t| t.topic == "orders");
        spec.derived.clear();
    }
    let derived: Vec<&str> = spec.derived.iter().map(|d| d.table.name.as_str()).collect();
    println!(
        "{batches} ESM batches of {records} orders per width{}; list prices: S3 $0.005/1000 PUT, $0.0004/1000 GET; \
         DynamoDB $0.625/M WRU, $0.125/M RRU; Glue $1/M requests; Lambda $0.20/M requests, $0.0000133334/GB-s",
        if processing {
            format!(
                " and a batch of their payments each, {PROCESSING_RATE} orders/s of event time, derived tables {}",
                derived.join(", ")
            )
        } else {
            String::new()
        }
    );
    let mut summary = Vec::new();
    for &width in widths {
        let name = format!("cost-{width}-{}-{}", std::process::id(), now_ms() % 100_000);
        create_resources(&name).await?;
        let backend = Backend::connect(&BackendConfig::Aws {
            bucket: name.clone(),
            prefix: "warehouse".into(),
            state_table: name.clone(),
            glue_database: name.replace('-', "_"),
        })
        .await?;
        // A new table: the bucket layout from the start.
        backend.state.upgrade(backend.clock.now_ms()).await?;
        let tables = TableSet::new(&spec, &backend.namespace)?;
        if processing {
            // The reference table the derived tables look values up in.
            tables.ensure_all(&backend).await?;
        }
        let ingestor = Ingestor::new(&spec, &backend)?;
        let counted = batches * cycles;
        let events = if processing {
            processing_events(width, counted, records)
        } else {
            spine_events(width, counted, records)
        };
        let warm = events.len() - counted as usize;
        let json_bytes: usize = events[warm..].iter().map(|b| b.bytes()).sum();
        let per_gb = 1e9 / json_bytes as f64;

        // Each phase's counts and CPU, summed over the counted cycles.
        let (mut ingest, mut commit, mut compact_counts) =
            (Counts::new(), Counts::new(), Counts::new());
        let (mut cpu, mut commit_cpu, mut compact_cpu) = (0.0, 0.0, 0.0);
        let (mut commit_s, mut compact_s) = (0.0, 0.0);
        let (mut files, mut compacted) = (0u64, 0usize);
        let mut wall = Vec::new();
        let (mut invocations, mut derived_rows) = (0u64, 0u64);
        let mut cpu0 = cpu_seconds();
        for (i, batch) in events.iter().enumerate() {
            if i == warm {
                if processing {
                    // The warm-up's last rows committed and compacted, uncounted: the join's
                    // state and the tables exist, as in a pipeline that has run for a while.
                    crate::commit::commit_pending(&backend, &tables).await?;
                    compact(&backend, &tables, &options).await?;
                }
                counts(&endpoint, true).await?;
                wall.clear();
                (invocations, derived_rows) = (0, 0);
                cpu0 = cpu_seconds();
            }
            for e in batch.events.iter() {
                let parsed: crate::esm::EsmEvent = serde_json::from_str(e)
                    .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
                let t = Instant::now();
                let s = ingestor.handle(&parsed).await?;
                wall.push(t.elapsed().as_secs_f64());
                invocations += 1;
                let sent = parsed.records.values().map(Vec::len).sum::<usize>() as u64;
                if s.accepted != sent || s.dead_lettered > 0 {
                    return Err(Error::Internal(format!(
                        "bench landed {} of {sent} records ({} dead letters: {:?})",
                        s.accepted, s.dead_lettered, s.dead_letters_by_kind
                    )));
                }
                derived_rows += s.derived_rows;
            }
            let done = i + 1;
            if done > warm && (done - warm).is_multiple_of(batches as usize) {
                // The end of a counted cycle: the scheduled stage's commit and compaction.
                cpu += cpu_seconds() - cpu0;
                add(&mut ingest, counts(&endpoint, true).await?);
                let (t, c0) = (Instant::now(), cpu_seconds());
                files += crate::commit::commit_pending(&backend, &tables)
                    .await?
                    .files();
                (commit_s, commit_cpu) = (
                    commit_s + t.elapsed().as_secs_f64(),
                    commit_cpu + cpu_seconds() - c0,
                );
                add(&mut commit, counts(&endpoint, true).await?);
                let (t, c0) = (Instant::now(), cpu_seconds());
                compacted += compact(&backend, &tables, &options).await?.len();
                (compact_s, compact_cpu) = (
                    compact_s + t.elapsed().as_secs_f64(),
                    compact_cpu + cpu_seconds() - c0,
                );
                add(&mut compact_counts, counts(&endpoint, true).await?);
                cpu0 = cpu_seconds();
            } else if processing && done < warm && done.is_multiple_of(batches as usize) {
                // The warm-up runs the scheduled stage at the same cadence, uncounted.
                crate::commit::commit_pending(&backend, &tables).await?;
                compact(&backend, &tables, &options).await?;
            }
        }
        if processing && derived_rows == 0 {
            return Err(Error::Internal(
                "streamtable-bench cost --processing: the derived tables wrote no rows".into(),
            ));
        }
        let compact = compact_counts;
        // Scheduled runs: one Lambda request each.
        let runs = cycles as f64;

        // Lambda: one request per invocation, and the CPU measured here at 1024 MB's vCPU
        // share (the scheduled stage's too: one invocation runs the commit and compaction).
        let gb_s = |cpu: f64| cpu / VCPU_AT_1024_MB * LAMBDA_GB_SECOND * per_gb;
        let lambda = invocations as f64 * LAMBDA_REQUEST * per_gb + gb_s(cpu);
        let scheduled_lambda = runs * LAMBDA_REQUEST * per_gb + gb_s(commit_cpu + compact_cpu);
        let ingest_usd = dollars(&ingest) * per_gb + lambda;
        let commit_usd = dollars(&commit) * per_gb + gb_s(commit_cpu);
        let compact_usd =
            dollars(&compact) * per_gb + gb_s(compact_cpu) + runs * LAMBDA_REQUEST * per_gb;
        let total = ingest_usd + commit_usd + compact_usd;
        let mean_wall = wall.iter().sum::<f64>() / wall.len().max(1) as f64;
        println!(
            "\n{width} partitions: {:.1} MB of event JSON in {counted} batches ({:.1} MB each), {cycles} scheduled run(s) \
             (a commit and a compaction after every {batches} batches), {files} files committed, \
             {compacted} partition compactions; ingest {:.2} s per invocation against moto (CPU {:.0} ms per invocation), commit {:.1} s, compaction {:.1} s",
            json_bytes as f64 / 1e6,
            json_bytes as f64 / 1e6 / counted as f64,
            mean_wall,
            cpu * 1e3 / invocations.max(1) as f64,
            commit_s,
            compact_s,
        );
        println!("{}", line("ingest", &ingest, per_gb, lambda));
        let per_batch: Vec<String> = ingest
            .iter()
            .filter(|(k, _)| k.starts_with("dynamodb") || k.starts_with("s3_"))
            .map(|(k, v)| format!("{k} {:.1}", v / invocations.max(1) as f64))
            .collect();
        println!("    ingest per invocation: {}", per_batch.join(", "));
        let g = |c: &Counts, k: &str| c.get(k).copied().unwrap_or(0.0);
        if processing {
            println!(
                "    state per GB: {:.0} PUTs, {:.1} MB written to S3 by ingest (states inline in their items are in the write units), {:.0} PUTs and {:.1} MB by commits (the join's runs)",
                g(&ingest, "s3_state_put") * per_gb,
                g(&ingest, "s3_state_bytes") * per_gb / 1e6,
                g(&commit, "s3_state_put") * per_gb,
                g(&commit, "s3_state_bytes") * per_gb / 1e6,
            );
        }
        println!("{}", line("commit", &commit, per_gb, gb_s(commit_cpu)));
        println!(
            "{}",
            line(
                "compaction",
                &compact,
                per_gb,
                gb_s(compact_cpu) + runs * LAMBDA_REQUEST * per_gb
            )
        );
        println!(
            "  total ${total:.4}/GB ({:.1}% of Firehose's ${FIREHOSE_PER_GB}/GB); Lambda ${:.5} of it (ingest ${lambda:.5}, scheduled ${scheduled_lambda:.5}: CPU {:.2} s commit, {:.2} s compaction)",
            100.0 * total / FIREHOSE_PER_GB,
            lambda + scheduled_lambda,
            commit_cpu,
            compact_cpu,
        );
        summary.push((width, total));
    }
    println!("\nwidth  $/GB     target");
    for (w, usd) in summary {
        // With processing on, twice the spine's target.
        let spine = if w >= 1000 { 0.007 } else { 0.0035 };
        let target = if processing { 2.0 * spine } else { spine };
        let verdict = if usd <= target { "within" } else { "OVER" };
        println!("{w:>5}  {usd:.4}  {verdict} ${target}");
    }
    Ok(())
}
