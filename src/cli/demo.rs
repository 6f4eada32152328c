//! `streamtable demo`: the whole pipeline on the embedded default, in one command.
//!
//! Synthetic orders, payments and sensor readings (with bad records, and with re-delivered
//! batches as the ESM sends them after a lost response) go through the ingest handler as ESM
//! batches, one topic per task; then the scheduled stage commits and compacts them; then the
//! dashboard queries answer in the terminal.

use std::sync::Arc;
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::backend::{Backend, BackendConfig};
use crate::checkpoint::SourcePartition;
use crate::cli::local_events::{LocalEvents, newest_in_home};
use crate::cli::synthetic::HOUR_MS;
use crate::cli::{Disorder, Timeline, synthetic_stream};
use crate::clock::now_ms;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::avro::AvroProducer;
use crate::generate::{EventFactory, kafka_event};
use crate::ingest::{IngestSummary, Ingestor};
use crate::query::{QueryEngine, TimeTravel};
use crate::registry::{DirRegistry, Registries};
use crate::spec::Format;
use crate::tables::TableSet;

/// Arguments of `streamtable demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Events per topic.
    #[arg(long, default_value_t = 50_000)]
    pub events: u64,
    /// Records per ESM batch (the ESM allows up to 10,000; template.yaml's BatchSize default).
    #[arg(long, default_value_t = 10_000)]
    pub batch_size: u64,
    /// Kafka partitions per topic.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Rows shown per dashboard answer.
    #[arg(long, default_value_t = 10)]
    pub rows: usize,
    /// Iceberg namespace (Glue database) for the demo's tables; required on the aws backend,
    /// where it must differ from the pipeline's own.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Prefix of the demo's topic names (`demo-` makes `demo-orders`…), so its checkpoints are
    /// its own; required on the aws backend.
    #[arg(long)]
    pub topic_prefix: Option<String>,
    /// Run the demo through a Kafka cluster (e.g. scripts/kafka-local's): produce the events
    /// into its topics, then read them back with the local event source mapping
    /// (`streamtable run`) instead of handing batches to the handler directly.
    #[arg(long)]
    pub bootstrap_servers: Option<String>,
}

/// Refuses to run the demo where it would write into production state: on the aws backend the
/// demo's synthetic events would advance the real topics' checkpoints, and real records at
/// those offsets would later be skipped as already seen.
pub fn check_target(backend: &BackendConfig, args: &DemoArgs) -> Result<()> {
    let BackendConfig::Aws { glue_database, .. } = backend else {
        return Ok(());
    };
    let why = "on the aws backend the demo's synthetic events would advance the checkpoints of \
               the pipeline's real topics, and real records at those offsets would later be \
               skipped as already seen";
    let prefix_ok = args.topic_prefix.as_deref().is_some_and(|p| !p.is_empty());
    let namespace_ok = args
        .namespace
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != glue_database);
    if prefix_ok && namespace_ok {
        return Ok(());
    }
    Err(Error::Config(format!(
        "refusing to run the demo: {why}. Run it on the embedded backend (unset \
         STREAMTABLE_BACKEND), or give it a place of its own: \
         --namespace {glue_database}_demo --topic-prefix demo-"
    )))
}

/// Every `BAD_EVERY`-th record is bad; every `REDELIVER_EVERY`-th batch (the first included) is
/// delivered twice.
const BAD_EVERY: u64 = 250;
const REDELIVER_EVERY: u64 = 4;

fn bar(multi: &MultiProgress, len: u64, prefix: &str) -> ProgressBar {
    let pb = multi.add(ProgressBar::new(len));
    pb.set_style(
        ProgressStyle::with_template("{prefix:>9} [{bar:32}] {pos}/{len} events {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(prefix.to_string());
    pb
}

/// The topic the demo produces as Avro (Confluent framing), to show a registry format next to
/// the JSON topics.
const AVRO_TOPIC: &str = "readings";

/// Sends `events` events of `topic` through the handler, in ESM batches (written as Avro by
/// `avro` when given), their event times over the hour before `now_ms` or from `after_ms` on.
#[allow(clippy::too_many_arguments)]
async fn feed(
    ingestor: Arc<Ingestor>,
    backend: Backend,
    topic: String,
    args: (u64, u64, i32),
    (now_ms, after_ms): (i64, Option<i64>),
    avro: Option<Arc<AvroProducer>>,
    pb: ProgressBar,
) -> Result<IngestSummary> {
    let (events, batch, partitions) = args;
    let mut offsets = Vec::new();
    for p in 0..partitions {
        offsets.push(
            backend
                .state
                .checkpoint(&SourcePartition::new(&topic, p))
                .await?
                .next_offset,
        );
    }
    let first_id: u64 = offsets.iter().map(|o| *o as u64).sum();
    let mut factory = EventFactory::new(first_id ^ topic.len() as u64);
    let timeline = Timeline::ending(now_ms, first_id, events, HOUR_MS, after_ms);
    let disorder = Disorder::demo();
    let mut total = IngestSummary::default();
    let (mut sent, mut n) = (0u64, 0u64);
    while sent < events {
        let count = batch.min(events - sent);
        // A prefixed topic (`demo-payments`) carries the events of its demo topic.
        let mut records = synthetic_stream(
            &mut factory,
            super::demo_kind(&topic),
            count,
            &mut offsets,
            first_id + sent,
            BAD_EVERY,
            &timeline,
            &disorder,
        );
        for r in &mut records {
            r.topic.clone_from(&topic);
        }
        if let Some(p) = &avro {
            // A record the producer's serializer refuses stays as it is (a bad producer).
            for r in &mut records {
                let json = r.value.as_deref().and_then(|v| std::str::from_utf8(v).ok());
                if let Some(value) = json.and_then(|j| p.encode_json(j).ok()) {
                    r.value = Some(value);
                }
            }
        }
        let event = kafka_event(&records);
        total.add(&ingestor.handle(&event).await?);
        if n % REDELIVER_EVERY == 0 {
            total.add(&ingestor.handle(&event).await?);
        }
        sent += count;
        n += 1;
        pb.set_position(sent);
    }
    pb.finish_with_message(format!("dead-lettered {}", total.dead_lettered));
    Ok(total)
}

/// Runs the demo.
pub async fn run(config: &Config, args: &DemoArgs) -> Result<()> {
    let started = Instant::now();
    check_target(&config.backend, args)?;
    let mut spec = config.load_pipeline()?;
    if let Some(prefix) = &args.topic_prefix {
        for t in &mut spec.tables {
            t.topic = format!("{prefix}{}", t.topic);
        }
        for d in &mut spec.derived {
            d.table.topic = format!("{prefix}{}", d.table.topic);
        }
    }
    let mut backend = Backend::connect(&config.backend).await?;
    if let Some(ns) = &args.namespace {
        backend.namespace = ns.clone();
    }
    let tables = TableSet::new(&spec, &backend.namespace)?;
    seed_currency_rates(&backend, &tables).await?;
    let topics: Vec<String> = spec.tables.iter().map(|t| t.topic.clone()).collect();
    let notes = LocalEvents::open(config)?;
    // Event time continues after the latest event the home's partitions took, over the hour
    // before now at most: a second run never stamps ahead of the clock or behind the first.
    let now = now_ms();
    let after = newest_in_home(&backend, &topics, args.partitions).await?;

    println!(
        "1. ingest: {} events per topic, ESM batches of {}",
        args.events, args.batch_size
    );
    let mut total = IngestSummary::default();
    let multi = MultiProgress::new();
    let mut tasks = Vec::new();
    if let Some(bootstrap) = &args.bootstrap_servers {
        // Batches of local events still pending would keep their partitions from moving to
        // the cluster's logs: committed first, before anything is produced.
        if !backend.state.pending().await?.is_empty() {
            println!("   committing the pending batches first (the scheduled stage)");
            crate::scheduled::run(
                &backend,
                &tables,
                &crate::scheduled::ScheduledOptions::default(),
            )
            .await?;
        }
        // The spec's formats as they are: a plain `run` on the same cluster reads them.
        let ingestor = Arc::new(Ingestor::connect(&spec, &backend).await?);
        let run = (ingestor, notes);
        total = through_broker(bootstrap, &spec, run, &backend, args, (now, after)).await?;
    } else {
        let (avro, registries) = avro_topic(config, &mut spec)?;
        let ingestor = Arc::new(
            Ingestor::connect(&spec, &backend)
                .await?
                .with_registries(registries),
        );
        if let Some(mut notes) = notes {
            // These checkpoints count the demo's own events, not a cluster's log: never those
            // of partitions a cluster feeds.
            let sources: Vec<SourcePartition> = topics
                .iter()
                .flat_map(|t| (0..args.partitions.max(1)).map(move |p| SourcePartition::new(t, p)))
                .collect();
            let fed = notes.cluster_fed(&sources)?;
            if !fed.is_empty() {
                return Err(Error::Config(format!(
                    "a Kafka cluster feeds partitions of this home ({}): the demo's own events \
                     would take offsets of those logs, and `streamtable run` would then skip \
                     the cluster's records at them. Run the demo through the cluster \
                     (`streamtable demo --bootstrap-servers HOST:PORT`) or in another home \
                     (`--home DIR`)",
                    fed.join(", ")
                )));
            }
            let checkpoints = backend.state.checkpoints(&sources).await?;
            notes.note_local(&sources, &checkpoints)?;
        }
        for t in &spec.tables {
            let pb = bar(&multi, args.events, &t.topic);
            let producer = (t.format == Format::Avro).then(|| avro.clone());
            let job = feed(
                ingestor.clone(),
                backend.clone(),
                t.topic.clone(),
                (
                    args.events,
                    args.batch_size.clamp(1, 10_000),
                    args.partitions.max(1),
                ),
                (now, after),
                producer,
                pb,
            );
            tasks.push((t.name.clone(), tokio::spawn(job)));
        }
    }
    for (name, task) in tasks {
        let s = task
            .await
            .map_err(|e| Error::Internal(format!("ingest task {name}: {e}")))??;
        total.add(&s);
    }
    println!("   {}", total.line());
    let kinds = |m: &std::collections::BTreeMap<String, u64>| {
        if m.is_empty() {
            "none".to_string()
        } else {
            m.iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        }
    };
    println!(
        "   dead letters: {} (records that did not land in their table)",
        kinds(&total.dead_letters_by_kind)
    );
    println!(
        "   derived tables' dead letters: {} (records in their topic's table that a derived \
         table could not take: too late for its window, or its SQL failed on them)",
        kinds(&total.derived_dead_letters_by_kind)
    );

    println!("2. commit, compact, maintain (the scheduled compaction Lambda)");
    let spinner = ProgressBar::new_spinner();
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let report = crate::scheduled::run(
        &backend,
        &tables,
        &crate::scheduled::ScheduledOptions::default(),
    )
    .await;
    spinner.finish_and_clear();
    for line in report?.lines() {
        println!("   {line}");
    }

    println!("3. the dashboard questions, answered by SQL over the Iceberg tables");
    let engine = QueryEngine::new(&backend, TimeTravel::Current).await?;
    for d in crate::cli::dashboard::load(Some(std::path::Path::new("infra/dashboards")))? {
        let batches = engine.query(&d.sql).await?;
        println!("\n   {}", d.title);
        let last = d.chart == crate::cli::dashboard::ChartKind::Line;
        println!(
            "{}",
            crate::cli::analyst::render_limited(&batches, args.rows, last)?
        );
    }
    let info = crate::cli::table_list::overview(&backend).await?;
    println!("\n{}", crate::cli::table_list::render(&info, now_ms()));
    println!(
        "\ndone in {:.1} s. Next: streamtable query \"SELECT country, sum(amount) FROM orders GROUP BY 1\", \
         streamtable dashboard --out dashboard.html",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The demo's events through a Kafka cluster: produced into the spec's topics (in the
/// spec's formats, so that a plain `streamtable run` reads them too), then read back by the
/// local event source mapping into the handler, until caught up. Event time continues after
/// the latest of the home's partitions and the topics' logs.
async fn through_broker(
    bootstrap: &str,
    spec: &crate::spec::PipelineSpec,
    (ingestor, notes): (Arc<Ingestor>, Option<LocalEvents>),
    backend: &Backend,
    args: &DemoArgs,
    (now, after): (i64, Option<i64>),
) -> Result<IngestSummary> {
    use crate::broker::source::{LocalEsm, RunArgs, Stop, spec_topics};
    use crate::broker::{Connection, produce};
    let connection = Connection::plaintext(bootstrap);
    let multi = MultiProgress::new();
    let mut topics = Vec::new();
    let mut after = after;
    // One first id for every topic (the highest), so that payment n pays order n even after
    // more orders than payments were produced.
    let mut first_id = 0;
    for t in &spec.tables {
        let partitions = produce::ensure_topic(&connection, &t.topic, args.partitions).await?;
        let (_, ends) = produce::watermarks(&connection, &t.topic)?;
        after = after.max(produce::latest_stamp(&connection, &t.topic, partitions)?);
        first_id = first_id.max(produce::first_cluster_id(ends));
        topics.push((t.topic.clone(), partitions));
    }
    for (topic, partitions) in topics {
        let timeline = Timeline::ending(now, first_id, args.events, HOUR_MS, after);
        let records = produce::demo_records(
            &topic,
            args.events,
            partitions,
            first_id,
            BAD_EVERY,
            &timeline,
        );
        let pb = bar(&multi, records.len() as u64, &topic);
        produce::send(&connection, "lz4", records, 0, |n| pb.set_position(n)).await?;
        pb.finish_with_message(format!("produced to {bootstrap}"));
    }
    let mut run = RunArgs::new(bootstrap);
    run.batch_size = args.batch_size.clamp(1, 10_000) as u32;
    run.maximum_batching_window = 0.5;
    run.until_idle = Some(1.0);
    run.schedule_interval = 0.0;
    run.group_id = "streamtable-demo".into();
    println!("   reading them back: the local event source mapping (streamtable run)");
    let esm = LocalEsm::new(
        run,
        spec_topics(spec),
        ingestor,
        backend.clone(),
        None,
        Stop::on_signals(),
    )?
    .with_local_events(notes, spec);
    let report = esm.run().await?;
    Ok(report.ingest)
}

/// Makes [`AVRO_TOPIC`]'s table an Avro topic: its writer schema (derived from the table's
/// columns) registered as id 1 in a directory registry under the embedded home (or a temporary
/// directory on the aws backend).
fn avro_topic(
    config: &Config,
    spec: &mut crate::spec::PipelineSpec,
) -> Result<(Arc<AvroProducer>, Registries)> {
    let table = spec
        .tables
        .iter_mut()
        .find(|t| crate::cli::demo_kind(&t.topic) == AVRO_TOPIC)
        .ok_or_else(|| {
            Error::Config(format!(
                "the demo needs a table whose topic's name contains {AVRO_TOPIC}"
            ))
        })?;
    let topic = table.topic.clone();
    table.format = Format::Avro;
    let producer = Arc::new(AvroProducer::new(table, 1));
    let dir = match &config.backend {
        BackendConfig::Embedded { home } => home.join("registry"),
        BackendConfig::Aws { .. } => std::env::temp_dir().join("streamtable-demo-registry"),
    };
    let path = dir.join("1.avsc");
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, producer.schema()))
        .map_err(|source| Error::Io {
            op: "write the demo's schema",
            path: path.clone(),
            source,
        })?;
    println!(
        "topic {topic} is produced as Avro (Confluent framing, writer schema id 1 in {})",
        dir.display()
    );
    let registries = Registries::of(Some(Arc::new(DirRegistry::new(dir))), None);
    Ok((producer, registries))
}

/// Fills the `currency_rates` reference table (when the spec has it and it is empty), as an
/// analyst would with Athena.
async fn seed_currency_rates(backend: &Backend, tables: &TableSet) -> Result<()> {
    const NAME: &str = "currency_rates";
    if !tables.references.contains_key(NAME) {
        return Ok(());
    }
    tables.ensure_references(backend).await?;
    if let Some((t, _)) = backend.catalog.load(&tables.ident(NAME)).await?
        && t.metadata().current_snapshot().is_some()
    {
        return Ok(());
    }
    println!(
        "0. reference table {NAME}: {} rates",
        crate::generate::CURRENCY_RATES.len()
    );
    crate::references::append_rows(backend, tables, NAME, &crate::generate::currency_rates()?).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(namespace: Option<&str>, prefix: Option<&str>) -> DemoArgs {
        DemoArgs {
            events: 1,
            batch_size: 1,
            partitions: 1,
            rows: 1,
            namespace: namespace.map(str::to_string),
            topic_prefix: prefix.map(str::to_string),
            bootstrap_servers: None,
        }
    }

    #[test]
    fn the_demo_refuses_production_state_unless_given_its_own() {
        let aws = BackendConfig::Aws {
            bucket: "b".into(),
            prefix: "warehouse".into(),
            state_table: "t".into(),
            glue_database: "streamtable".into(),
        };
        let err = check_target(&aws, &args(None, None)).expect_err("production state");
        assert!(err.to_string().contains("skipped as already seen"), "{err}");
        assert!(err.to_string().contains("--topic-prefix"), "{err}");
        assert!(check_target(&aws, &args(Some("streamtable"), Some("demo-"))).is_err());
        assert!(check_target(&aws, &args(Some("demo"), None)).is_err());
        assert!(check_target(&aws, &args(Some("demo"), Some(""))).is_err());
        assert!(check_target(&aws, &args(Some("demo"), Some("demo-"))).is_ok());
        let embedded = BackendConfig::Embedded { home: ".".into() };
        assert!(check_target(&embedded, &args(None, None)).is_ok());
    }
}
