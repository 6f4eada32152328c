//! The command line (`streamtable …`): the commands' bodies, the demo, the analyst's commands
//! and dashboards. The binary (`src/main.rs`) only parses arguments and maps errors to exit
//! codes. Compiled with the `cli` feature; the Lambda functions do not link it. The benchmarks
//! are a binary of their own (`crates/bench`).

pub mod analyst;
pub mod audit;
pub mod check;
pub mod dashboard;
pub mod demo;
pub mod status;
pub mod table_list;

use std::path::{Path, PathBuf};

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::{EventFactory, ORDER_STATUS_TOPIC, Rng, SourceRecord, esm_event};
use crate::ingest::Ingestor;

/// Exit code for a retryable fault (EX_TEMPFAIL): run the command again later.
pub const EXIT_RETRYABLE: u8 = 75;

/// The configuration from the environment, with the command line's global flags (`--pipeline`,
/// `--home`, `--backend`) in place of their variables.
pub fn config_from_flags(
    pipeline: Option<&Path>,
    home: Option<&Path>,
    backend: Option<&str>,
) -> Result<Config> {
    let pipeline = pipeline.map(|p| p.display().to_string());
    let home = home.map(|p| p.display().to_string());
    Config::from_lookup(|k| match k {
        "STREAMTABLE_PIPELINE" if pipeline.is_some() => pipeline.clone(),
        "STREAMTABLE_HOME" if home.is_some() => home.clone(),
        "STREAMTABLE_BACKEND" if backend.is_some() => backend.map(str::to_string),
        _ => std::env::var(k).ok().filter(|v| !v.is_empty()),
    })
}

/// Reads and parses an ESM event file.
pub fn read_event(path: &Path) -> Result<crate::esm::EsmEvent> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("read event", path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Event {
        origin: path.display().to_string(),
        message: format!(
            "not an MSK event-source-mapping event ({e}); see events/orders.json for the shape"
        ),
    })
}

/// `streamtable ingest --event FILE...`: one summary line per file.
pub async fn ingest(config: &Config, events: &[PathBuf]) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let ingestor = crate::ingest::LiveIngestor::from_config(config, backend);
    for path in events {
        let event = read_event(path)?;
        let summary = ingestor.handle(&event).await?;
        println!("{}: {}", path.display(), summary.line());
    }
    Ok(())
}

/// `streamtable run`: the local event source mapping over the spec's topics, landing through
/// the handler the ingest Lambda runs.
pub async fn run(config: &Config, args: &crate::broker::source::RunArgs) -> Result<()> {
    use crate::broker::source::{LocalEsm, Stop, spec_topics};
    use std::sync::Arc;
    let backend = Backend::connect(&config.backend).await?;
    let spec = config.load_pipeline_resolved(&backend).await?;
    let tables = Arc::new(crate::tables::TableSet::new(&spec, &backend.namespace)?);
    tables.ensure_references(&backend).await?;
    let read = spec_topics(&spec);
    if let Some(t) = args.topics.iter().find(|t| !read.contains(t)) {
        return Err(crate::error::Error::Config(format!(
            "--topic {t}: no table of the spec reads it (its records would all be dead \
             letters); the spec's topics: {}",
            read.join(", ")
        )));
    }
    let topics = if args.topics.is_empty() {
        read
    } else {
        args.topics.clone()
    };
    let handler: Arc<dyn crate::broker::source::Handler> = match &args.invoke {
        // Lambda's longest timeout: an invocation that has not answered by then failed.
        Some(url) => Arc::new(crate::broker::invoke::HttpInvoke::new(
            url,
            std::time::Duration::from_secs(900),
        )?),
        None => Arc::new(crate::ingest::LiveIngestor::from_config(
            config,
            backend.clone(),
        )),
    };
    eprintln!(
        "reading {} from {} (batches of at most {} records, {} s window)",
        topics.join(", "),
        args.connection.bootstrap_servers,
        args.batch_size,
        args.maximum_batching_window
    );
    let esm = LocalEsm::new(
        args.clone(),
        topics,
        handler,
        backend,
        Some(tables),
        Stop::on_signals(),
    )?;
    let report = esm.run().await?;
    println!(
        "{} records fetched, {} batches landed ({} invocations failed and were retried): {}",
        report.fetched,
        report.batches,
        report.failed_invocations,
        report.ingest.line()
    );
    for ((topic, partition), next) in &report.next_offsets {
        if *next >= 0 {
            println!("{topic}/{partition}: next offset {next}");
        } else {
            println!("{topic}/{partition}: no record landed yet");
        }
    }
    Ok(())
}

/// Arguments of `streamtable replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Failed batches: files or `s3://bucket/key` objects written by the event source
    /// mapping's Amazon S3 on-failure destination (or MSK event files).
    #[arg(required = true)]
    pub batches: Vec<String>,
    /// Land a batch that starts past its partition's checkpoint: the offsets in between will
    /// never be delivered (Kafka's own gaps: a transaction's marker, compacted records).
    #[arg(long)]
    pub after_gap: bool,
}

/// `streamtable replay`: feeds failed batches back through ingest, exactly once.
pub async fn replay(config: &Config, args: &ReplayArgs) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let spec = config.load_pipeline_resolved(&backend).await?;
    let ingestor = Ingestor::connect(&spec, &backend).await?;
    #[cfg(feature = "aws")]
    let mut s3 = None;
    for location in &args.batches {
        let bytes = match location.strip_prefix("s3://") {
            #[cfg(feature = "aws")]
            Some(rest) => {
                let (bucket, key) = rest
                    .split_once('/')
                    .ok_or_else(|| Error::Config(format!("{location}: write s3://bucket/key")))?;
                if s3.is_none() {
                    let sdk = crate::aws::load_config().await;
                    s3 = Some(aws_sdk_s3::Client::new(&sdk));
                }
                let client = s3
                    .as_ref()
                    .ok_or_else(|| Error::Internal("no S3 client".into()))?;
                let out = client
                    .get_object()
                    .bucket(bucket)
                    .key(key)
                    .send()
                    .await
                    .map_err(|e| {
                        let f = crate::aws::SdkFault::from_sdk(&e);
                        Error::ObjectStore {
                            op: "read failed batch",
                            location: location.clone(),
                            message: f.message,
                            retryable: f.retryable,
                        }
                    })?;
                out.body
                    .collect()
                    .await
                    .map_err(|e| Error::ObjectStore {
                        op: "read failed batch",
                        location: location.clone(),
                        message: e.to_string(),
                        retryable: true,
                    })?
                    .into_bytes()
                    .to_vec()
            }
            #[cfg(not(feature = "aws"))]
            Some(_) => {
                return Err(Error::Config(format!(
                    "{location}: this build has no AWS support; copy the object to a file"
                )));
            }
            None => {
                std::fs::read(location).map_err(|e| Error::io("read failed batch", location, e))?
            }
        };
        let event = crate::replay::parse_failed_batch(&bytes, location)?;
        let options = crate::replay::ReplayOptions {
            after_gap: args.after_gap,
        };
        for p in crate::replay::replay_with(&ingestor, &backend, &spec, &event, &options).await? {
            println!(
                "{location}: {} records={} already_landed={} accepted={} dead_lettered={}",
                p.source, p.records, p.already_landed, p.accepted, p.dead_lettered
            );
        }
    }
    Ok(())
}

/// Arguments of `streamtable reset-partition`.
#[derive(Debug, clap::Args)]
pub struct ResetPartitionArgs {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Says why: the topic was deleted and created again, its offsets restarting (the only
    /// reset there is; ingest names it when it refuses the partition).
    #[arg(long)]
    pub recreated: bool,
    /// The checkpoint the partition must be at (the one ingest named when it refused the new
    /// log): a reset run again, or after the partition moved on, is refused.
    #[arg(long)]
    pub from: i64,
    /// The new log's first offset (where its event source mapping starts reading).
    #[arg(long, default_value_t = 0)]
    pub to: i64,
}

/// `streamtable reset-partition`: moves a partition whose topic was deleted and created again to
/// the new log (its checkpoint and window/dedup state, in one conditional write), and sets the
/// partition's ledger of delivered offsets aside on the topic's table.
pub async fn reset_partition(config: &Config, args: &ResetPartitionArgs) -> Result<()> {
    if !args.recreated {
        return Err(Error::Config(
            "reset-partition moves a partition to a new log after its topic was deleted and created again; say so with --recreated (the old log's rows stay in the tables)".into(),
        ));
    }
    let backend = Backend::connect(&config.backend).await?;
    let spec = config.load_pipeline_resolved(&backend).await?;
    let table = spec.table_for_topic(&args.topic).ok_or_else(|| {
        Error::Config(format!(
            "topic {} is not a topic of the spec; reset one of: {}",
            args.topic,
            spec.tables
                .iter()
                .map(|t| t.topic.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let source = crate::checkpoint::SourcePartition::new(&args.topic, args.partition);
    let ingestor = Ingestor::connect(&spec, &backend).await?;
    let reset = ingestor
        .reset_partition(&source, args.from, args.to)
        .await?;
    println!(
        "{}/{}: checkpoint {} → {}{}",
        args.topic,
        args.partition,
        reset.from,
        reset.to,
        if reset.state_moved {
            " (window and dedup state moved with it)"
        } else {
            ""
        }
    );
    if table.land {
        let ident = iceberg::TableIdent::new(
            iceberg::NamespaceIdent::new(backend.namespace.clone()),
            table.name.clone(),
        );
        let now = backend.clock.now_ms();
        let old_end = Some((reset.from, reset.old_newest_ms));
        if crate::commit::ledger::set_aside(&backend, &ident, &source, now, old_end).await? {
            println!(
                "{}: the partition's ledger of delivered offsets set aside as streamtable.ledger-before.{source}.{now}; the table keeps the old log's rows (audit the new log with --since {})",
                table.name,
                crate::clock::rfc3339_ms(now)
            );
        }
    }
    Ok(())
}

/// Arguments of `streamtable scheduled`.
#[derive(Debug, clap::Args)]
pub struct ScheduledArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `streamtable scheduled`: the scheduled stage (commit, compaction, maintenance), once.
pub async fn scheduled(config: &Config, args: &ScheduledArgs) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let spec = config.load_pipeline_resolved(&backend).await?;
    let tables = crate::tables::TableSet::new(&spec, &backend.namespace)?;
    let options = crate::scheduled::ScheduledOptions::from_env()?;
    let report = crate::scheduled::run(&backend, &tables, &options).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| Error::Internal(e.to_string()))?
        );
    } else {
        for line in report.lines() {
            println!("{line}");
        }
    }
    Ok(())
}

/// Arguments of `streamtable generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Topic: orders, payments, readings or order_status.
    #[arg(long, default_value = "orders")]
    pub topic: String,
    /// Number of records.
    #[arg(long, default_value_t = 100)]
    pub records: u64,
    /// Kafka partitions to spread the records over, 1 to 100,000.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=100_000))]
    pub partitions: i32,
    /// First offset in each partition.
    #[arg(long, default_value_t = 0)]
    pub start_offset: i64,
    /// Make every Nth record a bad one (0: none).
    #[arg(long, default_value_t = 0)]
    pub bad_every: u64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file (default: standard output).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// How a stream's event times and copies deviate from a clean feed (the demo's streams).
#[derive(Debug, Clone, Copy, Default)]
pub struct Disorder {
    /// Event time advances by this per business id, ms (0: the plain feed's hour-long cycle).
    pub step_ms: i64,
    /// Event times are shifted by up to ± half of this, ms (out of order).
    pub jitter_ms: i64,
    /// Every n-th record is late: alternately by `late_by_ms` and by a third of it (0: none).
    pub late_every: u64,
    /// How late those records are, ms.
    pub late_by_ms: i64,
    /// Every n-th record is re-sent at the next offset, as a producer retry does (0: none).
    pub duplicate_every: u64,
}

impl Disorder {
    /// The demo's streams: an hour of event time over `events` records, out of order by up to
    /// 10 s either way, one in 997 late (alternately 7 minutes, past the windows' allowed
    /// lateness, and 2 minutes: a correction), one in 211 re-sent by its producer.
    pub fn demo(events: u64) -> Disorder {
        Disorder {
            step_ms: (3_600_000 / events.max(1) as i64).max(1),
            jitter_ms: 20_000,
            late_every: 997,
            late_by_ms: 420_000,
            duplicate_every: 211,
        }
    }
}

/// The demo topic `topic` carries: `orders`, `payments`, `readings` or `order_status` when its
/// name contains one (a prefixed topic such as `demo-payments`), else `topic` itself (which
/// the generator makes orders of).
pub fn demo_kind(topic: &str) -> &str {
    [ORDER_STATUS_TOPIC, "orders", "payments", "readings"]
        .into_iter()
        .find(|b| topic.contains(b))
        .unwrap_or(topic)
}

/// Records for one topic, spread round-robin over the partitions whose next offsets are in
/// `next_offsets` (advanced as records are made), every `bad_every`-th one bad. `first_id`
/// numbers the business ids.
pub fn synthetic_records(
    factory: &mut EventFactory,
    topic: &str,
    count: u64,
    next_offsets: &mut [i64],
    first_id: u64,
    bad_every: u64,
    start_ms: i64,
) -> Vec<SourceRecord> {
    synthetic_stream(
        factory,
        topic,
        count,
        next_offsets,
        first_id,
        bad_every,
        start_ms,
        &Disorder::default(),
    )
}

/// [`synthetic_records`] with event times and producer retries as `disorder` says.
#[allow(clippy::too_many_arguments)]
pub fn synthetic_stream(
    factory: &mut EventFactory,
    topic: &str,
    count: u64,
    next_offsets: &mut [i64],
    first_id: u64,
    bad_every: u64,
    start_ms: i64,
    disorder: &Disorder,
) -> Vec<SourceRecord> {
    let partitions = next_offsets.len().max(1);
    let mut rng = Rng::new(first_id ^ count);
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..count {
        let n = first_id + i;
        let mut at = if disorder.step_ms > 0 {
            start_ms
                + n as i64 * disorder.step_ms
                + rng.below(disorder.jitter_ms.max(1) as u64) as i64
                - disorder.jitter_ms / 2
        } else {
            start_ms + (n as i64 % 3_600) * 1_000 + rng.below(1000) as i64
        };
        if topic == "payments" && disorder.step_ms > 0 {
            // A payment follows its order by 20 s to 40 min; one in 50 is retried two hours
            // later (outside the order's hour: no match in an interval join).
            at += 20_000 + rng.below(2_400_000) as i64;
            if n % 50 == 49 {
                at += 7_200_000;
            }
        }
        if disorder.late_every > 0 && n % disorder.late_every == disorder.late_every - 1 {
            let k = n / disorder.late_every;
            at -= if k.is_multiple_of(2) {
                disorder.late_by_ms
            } else {
                disorder.late_by_ms / 3
            };
        }
        // Readings are keyed by their sensor, as a producer keying by sensor_id would: a
        // sensor's readings share a partition (sessions per sensor are exact).
        // Order status changes are keyed by their order: an order's changes share a
        // partition, and the last one wins in the upsert table.
        let status = (topic == ORDER_STATUS_TOPIC).then(|| crate::generate::status_event(n));
        let p = if topic == "readings" {
            (crate::generate::sensor_of(n, at) % partitions as u64) as usize
        } else if let Some((k, _)) = status {
            crate::generate::order_partition(k, partitions as u64) as usize
        } else {
            (i % partitions as u64) as usize
        };
        let offset = next_offsets.get(p).copied().unwrap_or(0);
        if let Some(o) = next_offsets.get_mut(p) {
            *o += 1;
        }
        let record = SourceRecord {
            topic: topic.to_string(),
            partition: p as i32,
            offset,
            timestamp_ms: at + 250,
            key: Some(match status {
                Some((k, _)) => crate::generate::order_id(k).into_bytes(),
                None => format!("k-{}", n % 997).into_bytes(),
            }),
            value: match status {
                Some((k, step)) => factory.status_change(k, step, at).map(String::into_bytes),
                None => Some(factory.event(topic, n, at).into_bytes()),
            },
            raw_value_field: None,
        };
        let record = if bad_every > 0 && i % bad_every == bad_every - 1 {
            factory.bad_record(n / bad_every, record)
        } else {
            record
        };
        if disorder.duplicate_every > 0 && n.is_multiple_of(disorder.duplicate_every) {
            let mut copy = record.clone();
            if let Some(o) = next_offsets.get_mut(p) {
                copy.offset = *o;
                *o += 1;
            }
            out.push(record);
            out.push(copy);
        } else {
            out.push(record);
        }
    }
    out
}

/// `streamtable generate`.
pub fn generate(args: &GenerateArgs) -> Result<()> {
    let mut factory = EventFactory::new(args.seed);
    let start_ms = crate::clock::now_ms() - 3_600_000;
    let mut offsets = vec![args.start_offset; args.partitions.max(1) as usize];
    let records = synthetic_records(
        &mut factory,
        &args.topic,
        args.records,
        &mut offsets,
        args.start_offset as u64 * args.partitions.max(1) as u64,
        args.bad_every,
        start_ms,
    );
    let json = esm_event(&records);
    match &args.out {
        Some(path) => std::fs::write(path, json).map_err(|e| Error::io("write event", path, e)),
        None => {
            println!("{json}");
            Ok(())
        }
    }
}

/// Arguments of `streamtable register`.
#[derive(Debug, clap::Args)]
pub struct RegisterArgs {
    /// The tables (default: every table of the spec, `dead_letters` included).
    pub tables: Vec<String>,
    /// The metadata file to register (one table only): when several share the newest version.
    #[arg(long)]
    pub metadata: Option<String>,
}

/// `streamtable register`: points missing catalog entries at the tables' metadata in the
/// warehouse ([`crate::catalog::register`]); tables the catalog has are left as they are.
pub async fn register(config: &Config, args: &RegisterArgs) -> Result<()> {
    use crate::catalog::register::{Registered, register};
    let backend = Backend::connect(&config.backend).await?;
    let names = if args.tables.is_empty() {
        let spec = config.load_pipeline_resolved(&backend).await?;
        crate::tables::TableSet::new(&spec, &backend.namespace)?
            .tables
            .into_keys()
            .collect()
    } else {
        args.tables.clone()
    };
    if args.metadata.is_some() && names.len() != 1 {
        return Err(Error::Config(
            "--metadata names one table's metadata file: pass exactly one table".into(),
        ));
    }
    let mut failed = 0;
    for name in &names {
        match register(&backend, &backend.namespace, name, args.metadata.as_deref()).await {
            Ok(Registered::AlreadyThere(l)) => println!("{name}: in the catalog already ({l})"),
            Ok(Registered::Registered(l)) => println!("{name}: registered at {l}"),
            Err(e) => {
                failed += 1;
                eprintln!("{name}: {e}");
            }
        }
    }
    if failed > 0 {
        return Err(Error::Config(format!(
            "{failed} table(s) not registered (see above)"
        )));
    }
    Ok(())
}
