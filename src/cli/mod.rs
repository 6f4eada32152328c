//! The command line (`streamtable …`): the commands' bodies, the demo, the analyst's commands
//! and dashboards. The binary (`src/main.rs`) only parses arguments and maps errors to exit
//! codes. Compiled with the `cli` feature; the Lambda functions do not link it. The benchmarks
//! are a binary of their own (`crates/bench`).

pub mod analyst;
pub mod audit;
pub mod check;
pub mod dashboard;
pub mod demo;
pub mod local_events;
pub mod status;
pub mod synthetic;
pub mod table_list;

pub use synthetic::{
    Disorder, GenerateArgs, Timeline, demo_kind, generate, synthetic_records, synthetic_stream,
};

use std::path::{Path, PathBuf};

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
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

/// When more than 1% of the records came too late for a derived table's window or join, what
/// that means and where to look: the records landed in their topic's table, but their event
/// time was behind the watermark by more than the allowed lateness.
pub fn late_hint(summary: &crate::ingest::IngestSummary) -> Option<String> {
    let late = summary
        .derived_dead_letters_by_kind
        .get("late")
        .copied()
        .unwrap_or(0);
    (late > 0 && late * 100 > summary.records).then(|| {
        format!(
            "late={late}: records whose event time was behind a window's watermark by more than \
             its allowed lateness (a producer's clock behind, or old data sent again): they are \
             in their topic's table, not in the window; see `streamtable query \"SELECT \
             error_message, count(*) FROM dead_letters WHERE error_kind = 'late' GROUP BY 1\"`"
        )
    })
}

/// Which pipeline spec `config` runs with, for a command's first line (on stderr): a file,
/// or the built-in copy — with a word when a `pipeline.toml` in the working directory is not
/// the one read.
pub fn spec_line(config: &Config) -> String {
    match &config.pipeline {
        Some(path) => format!("spec: {}", path.display()),
        None => {
            let stray = Path::new("pipeline.toml");
            format!(
                "spec: the built-in copy of infra/pipeline.toml (no --pipeline, \
                 STREAMTABLE_PIPELINE or ./infra/pipeline.toml){}",
                if stray.exists() {
                    "; ./pipeline.toml is not read: pass --pipeline pipeline.toml"
                } else {
                    ""
                }
            )
        }
    }
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

/// `streamtable ingest --event FILE...`: one summary line per file, and where records were
/// already seen, the checkpoints they are below.
pub async fn ingest(config: &Config, events: &[PathBuf]) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let state = backend.state.clone();
    let ingestor = crate::ingest::LiveIngestor::from_config(config, backend);
    let mut notes = local_events::LocalEvents::open(config)?;
    for path in events {
        let event = read_event(path)?;
        // The partitions the event holds (a record's topic, else its group's `topic-partition`).
        let mut sources: Vec<crate::checkpoint::SourcePartition> = event
            .records
            .iter()
            .flat_map(|(group, records)| records.iter().map(move |r| (group, r)))
            .filter_map(|(group, r)| {
                let p = i32::try_from(r.partition).ok()?;
                let topic = match r.topic.as_deref() {
                    Some(t) => t,
                    None => group.rsplit_once('-')?.0,
                };
                Some(crate::checkpoint::SourcePartition::new(topic, p))
            })
            .collect();
        sources.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        sources.dedup();
        if let Some(notes) = notes.as_mut() {
            let checkpoints = state.checkpoints(&sources).await?;
            let fed = notes.cluster_fed(&sources)?;
            if !fed.is_empty() {
                eprintln!(
                    "warning: a Kafka cluster feeds {} (`streamtable run`): the event's records \
                     take those offsets of its log, and the cluster's records at them will be \
                     taken for already seen; for batches the event source gave up on, use \
                     `streamtable replay`",
                    fed.join(", ")
                );
            }
            notes.note_local(&sources, &checkpoints)?;
        }
        let summary = ingestor.handle(&event).await?;
        println!("{}: {}", path.display(), summary.line());
        if let Some(hint) = late_hint(&summary) {
            println!("  {hint}");
        }
        if summary.already_seen > 0 {
            let checkpoints = state.checkpoints(&sources).await?;
            let at: Vec<String> = sources
                .iter()
                .zip(&checkpoints)
                .filter(|(_, c)| c.version > 0)
                .map(|(s, c)| format!("{s} at {}", c.next_offset))
                .collect();
            println!(
                "  already_seen={}: their offsets are below their partitions' checkpoints ({}): \
                 they landed before (each offset lands once; an earlier `ingest`, the demo or \
                 `run` took them), and were skipped",
                summary.already_seen,
                at.join(", ")
            );
        }
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
    )?
    .with_local_events(local_events::LocalEvents::open(config)?, &spec);
    let report = esm.run().await?;
    println!(
        "{} records fetched, {} batches landed ({} invocations failed and were retried): {}",
        report.fetched,
        report.batches,
        report.failed_invocations,
        report.ingest.line()
    );
    if let Some(hint) = late_hint(&report.ingest) {
        println!("{hint}");
    }
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
    let moved = move_to_new_log(&backend, table, &ingestor, &source, args.from, args.to).await?;
    println!("{}", moved.line());
    if let Some(at) = moved.set_aside_at {
        println!(
            "{}: the partition's ledger of delivered offsets set aside as streamtable.ledger-before.{source}.{at}; the table keeps the old log's rows (audit the new log with --since {})",
            table.name,
            crate::clock::rfc3339_ms(at)
        );
    }
    Ok(())
}

/// A partition moved to a new log ([`move_to_new_log`]).
#[derive(Debug, Clone)]
pub struct MovedPartition {
    /// The partition.
    pub source: crate::checkpoint::SourcePartition,
    /// What the checkpoint's move did.
    pub reset: crate::ingest::PartitionReset,
    /// When its table's ledger for the partition was set aside (ms), if it had one.
    pub set_aside_at: Option<i64>,
}

impl MovedPartition {
    /// `orders/0: checkpoint 3000 → 0 (window and dedup state moved with it)`.
    pub fn line(&self) -> String {
        format!(
            "{}/{}: checkpoint {} → {}{}",
            self.source.topic,
            self.source.partition,
            self.reset.from,
            self.reset.to,
            if self.reset.state_moved {
                " (window and dedup state moved with it)"
            } else {
                ""
            }
        )
    }
}

/// Moves `source` (of `table`'s topic) to a new log: its checkpoint from `from` to `to` with
/// its window and dedup state, in one conditional write, then its ledger of delivered offsets
/// on the table set aside (the audit leaves the old log's rows out). The table keeps its rows.
pub async fn move_to_new_log(
    backend: &Backend,
    table: &crate::spec::TableSpec,
    ingestor: &Ingestor,
    source: &crate::checkpoint::SourcePartition,
    from: i64,
    to: i64,
) -> Result<MovedPartition> {
    let reset = ingestor.reset_partition(source, from, to).await?;
    let mut set_aside_at = None;
    if table.land {
        let ident = iceberg::TableIdent::new(
            iceberg::NamespaceIdent::new(backend.namespace.clone()),
            table.name.clone(),
        );
        let now = backend.clock.now_ms();
        let old_end = Some((reset.from, reset.old_newest_ms));
        if crate::commit::ledger::set_aside(backend, &ident, source, now, old_end).await? {
            set_aside_at = Some(now);
        }
    }
    Ok(MovedPartition {
        source: source.clone(),
        reset,
        set_aside_at,
    })
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
