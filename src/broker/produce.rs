//! `streamtable produce`: the demo's generator into a real topic, bad records included.

use std::time::{Duration, Instant};

use futures::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::{Connection, kafka_error};
use crate::cli::{Disorder, Timeline, synthetic_stream};
use crate::error::{Error, Result};
use crate::generate::{EventFactory, SourceRecord};

/// Arguments of `streamtable produce`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    /// The cluster.
    pub connection: Connection,
    /// The topic; its records are the demo's for that name (orders, payments, readings, or
    /// a prefixed name such as demo-orders).
    #[arg(long, default_value = "orders")]
    pub topic: String,
    /// Records to produce (the generator adds a producer retry's copy of about one in 211, as
    /// the demo's streams have).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Records per second at most (0: as fast as the broker takes them).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Partitions of the topic when it is created (an existing topic keeps its own), 1 to
    /// 100,000.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=100_000))]
    pub partitions: i32,
    /// Every Nth record is a bad one (0: none).
    #[arg(long, default_value_t = 250)]
    pub bad_every: u64,
    /// Compression of the record batches: none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "lz4")]
    pub compression: String,
}

/// The business ids (order numbers) of records produced into a cluster start here, past the
/// embedded demo's (which count from 0 in its home): the orders of `demo` and of `demo
/// --bootstrap-servers` or `produce` are never taken for each other's producer retries by a
/// dedup. A topic's next ids continue from the sum of its partitions' ends, so `produce
/// --topic orders` then `produce --topic payments` of as many records pay the same orders.
pub const CLUSTER_IDS: u64 = 1_000_000_000;

/// The first business id of records produced into a topic whose partitions' ends sum to
/// `ends`.
pub fn first_cluster_id(ends: i64) -> u64 {
    CLUSTER_IDS + ends.max(0) as u64
}

/// Creates `topic` with `partitions` partitions unless it exists; returns its partitions.
pub async fn ensure_topic(connection: &Connection, topic: &str, partitions: i32) -> Result<i32> {
    let config = connection.client_config()?;
    let admin: AdminClient<DefaultClientContext> = config
        .create()
        .map_err(|e| kafka_error("create the admin client", e))?;
    let new = NewTopic::new(topic, partitions.max(1), TopicReplication::Fixed(1));
    let results = admin
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .map_err(|e| kafka_error(&format!("create topic {topic}"), e))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(Error::Config(format!("kafka: create topic {name}: {code}")));
            }
        }
    }
    let (count, _) = watermarks(connection, topic)?;
    Ok(count)
}

/// The number of partitions of `topic` and the sum of their high watermarks. Right after a
/// topic is created its partitions may have no leader yet: that is waited for (up to 30 s).
pub fn watermarks(connection: &Connection, topic: &str) -> Result<(i32, i64)> {
    let consumer: BaseConsumer = connection
        .client_config()?
        .create()
        .map_err(|e| kafka_error("create a client", e))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let retry = |e: rdkafka::error::KafkaError, what: &str| -> Result<()> {
        let transient = matches!(
            e.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::NotLeaderForPartition
                    | RDKafkaErrorCode::LeaderNotAvailable
                    | RDKafkaErrorCode::UnknownTopicOrPartition
                    | RDKafkaErrorCode::UnknownPartition
                    | RDKafkaErrorCode::UnknownTopic
                    | RDKafkaErrorCode::OperationTimedOut
                    | RDKafkaErrorCode::RequestTimedOut
            )
        );
        if transient && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        } else {
            Err(kafka_error(what, e))
        }
    };
    loop {
        let metadata = match tokio::task::block_in_place(|| {
            consumer.fetch_metadata(Some(topic), Duration::from_secs(30))
        }) {
            Ok(m) => m,
            Err(e) => {
                retry(e, &format!("read the metadata of topic {topic}"))?;
                continue;
            }
        };
        let partitions: Vec<(i32, i32)> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions().iter().map(|p| (p.id(), p.leader())))
            .collect();
        if partitions.iter().any(|(_, leader)| *leader < 0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let mut sum = 0;
        let mut again = false;
        for (p, _) in &partitions {
            match tokio::task::block_in_place(|| {
                consumer.fetch_watermarks(topic, *p, Duration::from_secs(30))
            }) {
                Ok((_, high)) => sum += high.max(0),
                Err(e) => {
                    retry(e, &format!("read the end of {topic}/{p}"))?;
                    again = true;
                    break;
                }
            }
        }
        if !again {
            return Ok((partitions.len() as i32, sum));
        }
    }
}

/// Sends `records` to their topics and partitions (at most `rate` per second when not 0);
/// `progress` is called with the count delivered so far. Returns the records delivered.
pub async fn send(
    connection: &Connection,
    compression: &str,
    records: Vec<SourceRecord>,
    rate: u64,
    progress: impl Fn(u64),
) -> Result<u64> {
    let mut config = connection.client_config()?;
    config
        .set("compression.type", compression)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("message.max.bytes", "10485760");
    let producer: FutureProducer = config
        .create()
        .map_err(|e| kafka_error("create the producer", e))?;
    let started = Instant::now();
    let mut delivered = 0u64;
    let mut sends = futures::stream::iter(records.into_iter().enumerate())
        .map(|(i, r)| {
            let producer = &producer;
            async move {
                if rate > 0 {
                    let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
                    tokio::time::sleep_until(due.into()).await;
                }
                let value = match (&r.raw_value_field, &r.value) {
                    (Some(raw), _) => Some(raw.as_bytes()),
                    (None, v) => v.as_deref(),
                };
                let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&r.topic)
                    .partition(r.partition)
                    // Never ahead of the clock (a broker refuses a record stamped more than
                    // an hour ahead, `log.message.timestamp.after.max.ms`).
                    .timestamp(r.timestamp_ms.min(crate::clock::now_ms()));
                if let Some(k) = r.key.as_deref() {
                    record = record.key(k);
                }
                if let Some(v) = value {
                    record = record.payload(v);
                }
                producer
                    .send(record, Duration::from_secs(60))
                    .await
                    .map_err(|(e, _)| kafka_error(&format!("produce to {}", r.topic), e))
            }
        })
        .buffer_unordered(if rate > 0 { 1 << 20 } else { 20_000 });
    while let Some(result) = sends.next().await {
        result?;
        delivered += 1;
        if delivered.is_multiple_of(1000) {
            progress(delivered);
        }
    }
    drop(sends);
    producer
        .flush(Duration::from_secs(60))
        .map_err(|e| kafka_error("flush the producer", e))?;
    progress(delivered);
    Ok(delivered)
}

/// The demo's records for `topic` (the demo topic its name contains), `count` of them over
/// `partitions`, ids from `first_id`, every `bad_every`-th bad, a producer retry's copy now
/// and then, event times on `timeline`, out of order by up to 10 s.
pub fn demo_records(
    topic: &str,
    count: u64,
    partitions: i32,
    first_id: u64,
    bad_every: u64,
    timeline: &Timeline,
) -> Vec<SourceRecord> {
    let base = crate::cli::demo_kind(topic);
    let mut factory = EventFactory::new(first_id ^ topic.len() as u64);
    let mut offsets = vec![0i64; partitions.max(1) as usize];
    let mut records = synthetic_stream(
        &mut factory,
        base,
        count,
        &mut offsets,
        first_id,
        bad_every,
        timeline,
        &Disorder::demo(),
    );
    for r in &mut records {
        r.topic = topic.to_string();
    }
    records
}

/// The latest Kafka timestamp (ms) of the last records of `topic`'s partitions, `None` when
/// they are empty: where a generator's next run continues.
pub fn latest_stamp(connection: &Connection, topic: &str, partitions: i32) -> Result<Option<i64>> {
    let ends: Vec<(String, i32, i64)> = (0..partitions.max(1))
        .map(|p| (topic.to_string(), p, i64::MAX))
        .collect();
    let stamps =
        tokio::task::block_in_place(|| crate::broker::log::stamps_below(connection, &ends, 4))?;
    Ok(stamps.values().flatten().map(|(_, ts)| *ts).max())
}

/// Where `produce`'s records lie in event time: at `--rate`, each when it is due to be sent
/// (so a stamp is never ahead of the clock, and a slow run keeps time); at full speed, a
/// millisecond apart up to now. Either continues after the topic's latest record.
pub fn produce_timeline(
    now_ms: i64,
    first_id: u64,
    records: u64,
    rate: u64,
    after: Option<i64>,
) -> Timeline {
    if rate == 0 {
        return Timeline::ending(
            now_ms,
            first_id,
            records,
            crate::cli::synthetic::plain_span_ms(records),
            after,
        );
    }
    // The demo's jitter is ±10 s: starting 10 s back keeps every stamp behind its send time;
    // never ahead of the clock, whatever the topic's latest record says.
    let start = (now_ms - 10_000)
        .max(after.map_or(i64::MIN, |a| a.saturating_add(1)))
        .min(now_ms);
    Timeline {
        origin: first_id,
        start_ms: start,
        step_us: i64::try_from(1_000_000 / rate.max(1)).unwrap_or(1),
        end_ms: i64::MAX,
    }
}

/// The latest Kafka timestamp the embedded home's checkpoints of `topic` took, when there is
/// a home (its state.db): `produce` continues after it, so that what it produces is newer than
/// what the home's windows and the audit already saw (the demo's events included).
async fn newest_in_home(
    config: &crate::config::Config,
    topic: &str,
    partitions: i32,
) -> Result<Option<i64>> {
    let crate::backend::BackendConfig::Embedded { home } = &config.backend else {
        return Ok(None);
    };
    if !home.join("state.db").exists() {
        return Ok(None);
    }
    let backend = crate::backend::Backend::connect(&config.backend).await?;
    crate::cli::local_events::newest_in_home(&backend, &[topic.to_string()], partitions).await
}

/// `streamtable produce`.
pub async fn run(args: &ProduceArgs, config: &crate::config::Config) -> Result<()> {
    let partitions = ensure_topic(&args.connection, &args.topic, args.partitions).await?;
    let (_, ends) = watermarks(&args.connection, &args.topic)?;
    let first_id = first_cluster_id(ends);
    let after = latest_stamp(&args.connection, &args.topic, partitions)?
        .max(newest_in_home(config, &args.topic, partitions).await?);
    let timeline = produce_timeline(
        crate::clock::now_ms(),
        first_id,
        args.records,
        args.rate,
        after,
    );
    let records = demo_records(
        &args.topic,
        args.records,
        partitions,
        first_id,
        args.bad_every,
        &timeline,
    );
    let total = records.len() as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:32}] {pos}/{len} records {per_sec}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(args.topic.clone());
    let started = Instant::now();
    let sent = send(
        &args.connection,
        &args.compression,
        records,
        args.rate,
        |n| bar.set_position(n),
    )
    .await?;
    bar.finish_and_clear();
    let copies = sent.saturating_sub(args.records);
    let bad = args.records.checked_div(args.bad_every).unwrap_or(0);
    println!(
        "{}: {sent} records produced to {partitions} partitions in {:.1} s: the {} asked \
         for ({bad} of them bad on purpose) and {copies} producer-retry copies; event times \
         from {}",
        args.topic,
        started.elapsed().as_secs_f64(),
        args.records,
        crate::clock::rfc3339_ms(timeline.start_ms),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: super::ProduceArgs,
    }

    #[test]
    fn a_topic_has_at_least_one_partition() {
        for bad in ["--partitions=0", "--partitions=-3", "--partitions=100001"] {
            let e = Cli::try_parse_from(["produce", "--bootstrap-servers", "b:9092", bad])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("--partitions"), "{bad}: {e}");
        }
        let ok = Cli::try_parse_from([
            "produce",
            "--bootstrap-servers",
            "b:9092",
            "--partitions",
            "8",
        ])
        .expect("8 partitions");
        assert_eq!(ok.args.partitions, 8);
    }
}
