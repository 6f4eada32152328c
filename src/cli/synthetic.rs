//! Synthetic streams for the demo, `produce` and `generate`: the demo's events in Kafka
//! partitions, with event times on a [`Timeline`] that follows the clock, some disorder, bad
//! records and producer retries.
//!
//! Event time never runs ahead of the clock, and a second run continues after the first: a
//! run's events lie between the latest event an earlier run stamped (or an hour ago) and now,
//! in business-id order per topic, shifted by a bounded jitter. Payments follow their order by
//! 20 to 25 s. So a stream's records are in order per partition but for the jitter (±10 s in
//! the demo's streams, less than the spec's 30 s watermark delays) and the deliberately late
//! ones, and the topics agree with each other and with the clock.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::generate::{EventFactory, ORDER_STATUS_TOPIC, Rng, SourceRecord, esm_event};

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

/// One hour: how far back a run's event times start at most.
pub const HOUR_MS: i64 = 3_600_000;

/// Event time of a generated stream: business id `origin` at `start_ms`, each next id
/// `step_us` microseconds later, never past `end_ms` (the clock when the run started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    /// The business id of the run's first event.
    pub origin: u64,
    /// Its event time, ms.
    pub start_ms: i64,
    /// Event time between successive ids, µs.
    pub step_us: i64,
    /// No event is stamped later than this, ms.
    pub end_ms: i64,
}

impl Timeline {
    /// `count` events from id `origin`, spread evenly up to `now_ms` over `span_ms` at most,
    /// starting after `after_ms` (the latest event time an earlier run stamped) when that is
    /// later: a second run continues where the first ended, and never runs ahead of the clock.
    pub fn ending(
        now_ms: i64,
        origin: u64,
        count: u64,
        span_ms: i64,
        after_ms: Option<i64>,
    ) -> Timeline {
        let start = (now_ms - span_ms.max(0))
            .max(after_ms.map_or(i64::MIN, |a| a.saturating_add(1)))
            .min(now_ms);
        let count = i64::try_from(count.max(1)).unwrap_or(i64::MAX);
        Timeline {
            origin,
            start_ms: start,
            step_us: (now_ms - start).saturating_mul(1000) / count,
            end_ms: now_ms,
        }
    }

    /// From `start_ms` on, an event every `step_us`, with no end (the benchmarks' fixed base).
    pub fn from(start_ms: i64, step_us: i64) -> Timeline {
        Timeline {
            origin: 0,
            start_ms,
            step_us,
            end_ms: i64::MAX,
        }
    }

    /// The event time of business id `n`, before jitter.
    pub fn at(&self, n: u64) -> i64 {
        let k = i128::from(n.saturating_sub(self.origin));
        let t = i128::from(self.start_ms) + k * i128::from(self.step_us) / 1000;
        t.min(i128::from(self.end_ms)) as i64
    }
}

/// How a stream's event times and copies deviate from a clean feed (the demo's streams).
#[derive(Debug, Clone, Copy)]
pub struct Disorder {
    /// Event times are shifted by up to ± half of this, ms (out of order).
    pub jitter_ms: i64,
    /// Every n-th record is late: alternately by `late_by_ms` and by a third of it (0: none).
    pub late_every: u64,
    /// How late those records are, ms.
    pub late_by_ms: i64,
    /// Every n-th record is re-sent at the next offset, as a producer retry does (0: none).
    pub duplicate_every: u64,
}

impl Default for Disorder {
    /// A plain feed: out of order by up to half a second either way, nothing late, no copies.
    fn default() -> Disorder {
        Disorder {
            jitter_ms: 1_000,
            late_every: 0,
            late_by_ms: 0,
            duplicate_every: 0,
        }
    }
}

impl Disorder {
    /// The demo's streams: out of order by up to 10 s either way, one in 997 late (alternately
    /// 7 minutes, past the windows' allowed lateness, and 2 minutes 20 s: a correction), one in
    /// 211 re-sent by its producer.
    pub fn demo() -> Disorder {
        Disorder {
            jitter_ms: 20_000,
            late_every: 997,
            late_by_ms: 420_000,
            duplicate_every: 211,
        }
    }
}

/// A payment follows its order by this much, plus up to [`PAYMENT_SPREAD_MS`].
const PAYMENT_DELAY_MS: i64 = 20_000;
const PAYMENT_SPREAD_MS: u64 = 5_000;
/// One payment in this many is for an order placed elsewhere (not on the orders topic): it
/// finds no order in the interval join.
const PAID_ELSEWHERE_EVERY: u64 = 50;

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
/// numbers the business ids; id `n` happens `n` ms after `start_ms` (a plain feed of a
/// thousand events a second, with no end: the benchmarks').
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
        &Timeline::from(start_ms, 1_000),
        &Disorder::default(),
    )
}

/// [`synthetic_records`] with event times on `timeline`, deviating and copied as `disorder`
/// says.
#[allow(clippy::too_many_arguments)]
pub fn synthetic_stream(
    factory: &mut EventFactory,
    topic: &str,
    count: u64,
    next_offsets: &mut [i64],
    first_id: u64,
    bad_every: u64,
    timeline: &Timeline,
    disorder: &Disorder,
) -> Vec<SourceRecord> {
    let partitions = next_offsets.len().max(1);
    let mut rng = Rng::new(first_id ^ count);
    let mut out = Vec::with_capacity(count as usize);
    let jitter = disorder.jitter_ms.max(1);
    for i in 0..count {
        let n = first_id + i;
        let base = timeline.at(n);
        // Business id n's jitter is its own (the same in every topic): payment n follows
        // order n by the payment delay exactly.
        let mut at = base + Rng::new(n ^ 0x6a17).below(jitter as u64) as i64 - jitter / 2;
        if topic == "payments" {
            at += PAYMENT_DELAY_MS + rng.below(PAYMENT_SPREAD_MS) as i64;
        }
        if disorder.late_every > 0 && n % disorder.late_every == disorder.late_every - 1 {
            let k = n / disorder.late_every;
            at -= if k.is_multiple_of(2) {
                disorder.late_by_ms
            } else {
                disorder.late_by_ms / 3
            };
        }
        // Never ahead of the clock the run started at. The Kafka timestamp is when the record
        // is produced: a moment after the event, or on the timeline for an event that comes
        // late (its producer sends it now), so timestamps only go forward but for the jitter,
        // and never precede the run's start (where an earlier run's records end).
        let at = at.min(timeline.end_ms);
        let timestamp_ms = base
            .max(at)
            .saturating_add(250)
            .min(timeline.end_ms)
            .max(at);
        // Readings are keyed by their sensor, as a producer keying by sensor_id would: a
        // sensor's readings share a partition (sessions per sensor are exact).
        // Order status changes are keyed by their order: an order's changes share a
        // partition, and the last one wins in the upsert table.
        let status = (topic == ORDER_STATUS_TOPIC).then(|| crate::generate::status_event(n));
        let p = if topic == "readings" {
            // By the sensor's hash, as Kafka's partitioner hashes the key: every partition
            // gets sensors, however short the run's span (a slot's sensors share a residue).
            let sensor = crate::generate::sensor_of(n, at);
            (Rng::new(sensor ^ 0x5e45).next_u64() % partitions as u64) as usize
        } else if let Some((k, _)) = status {
            crate::generate::order_partition(k, partitions as u64) as usize
        } else {
            (i % partitions as u64) as usize
        };
        let offset = next_offsets.get(p).copied().unwrap_or(0);
        if let Some(o) = next_offsets.get_mut(p) {
            *o += 1;
        }
        let value = match status {
            Some((k, step)) => factory.status_change(k, step, at).map(String::into_bytes),
            None if topic == "payments" && n % PAID_ELSEWHERE_EVERY == PAID_ELSEWHERE_EVERY - 1 => {
                Some(
                    factory
                        .payment_for(n, &format!("ext-{n:010}"), at)
                        .into_bytes(),
                )
            }
            None => Some(factory.event(topic, n, at).into_bytes()),
        };
        let record = SourceRecord {
            topic: topic.to_string(),
            partition: p as i32,
            offset,
            timestamp_ms,
            key: Some(match status {
                Some((k, _)) => crate::generate::order_id(k).into_bytes(),
                None => format!("k-{}", n % 997).into_bytes(),
            }),
            value,
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

/// `streamtable generate`: one ESM event file of `--records` records (stamped a millisecond
/// apart, ending now), and a line saying what it holds.
pub fn generate(args: &GenerateArgs) -> Result<()> {
    let mut factory = EventFactory::new(args.seed);
    let partitions = args.partitions.max(1);
    let mut offsets = vec![args.start_offset; partitions as usize];
    let first_id = args.start_offset.max(0) as u64 * partitions as u64;
    let timeline = Timeline::ending(
        crate::clock::now_ms(),
        first_id,
        args.records,
        plain_span_ms(args.records),
        None,
    );
    let records = synthetic_stream(
        &mut factory,
        &args.topic,
        args.records,
        &mut offsets,
        first_id,
        args.bad_every,
        &timeline,
        &Disorder::default(),
    );
    let json = esm_event(&records);
    let summary = format!(
        "{} records of topic {} over {partitions} partition(s), offsets from {} to at most {} \
         in each, event times {} to {}",
        records.len(),
        args.topic,
        args.start_offset,
        offsets.iter().max().copied().unwrap_or(args.start_offset) - 1,
        crate::clock::rfc3339_ms(timeline.start_ms),
        crate::clock::rfc3339_ms(timeline.end_ms),
    );
    match &args.out {
        Some(path) => {
            std::fs::write(path, json).map_err(|e| Error::io("write event", path, e))?;
            eprintln!("{}: {summary}", path.display());
            Ok(())
        }
        None => {
            println!("{json}");
            eprintln!("{summary}");
            Ok(())
        }
    }
}

/// How much event time a plain run of `records` spans: a millisecond a record (a thousand
/// events a second), an hour at most.
pub fn plain_span_ms(records: u64) -> i64 {
    i64::try_from(records).unwrap_or(i64::MAX).min(HOUR_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(
        topic: &str,
        timeline: &Timeline,
        count: u64,
        partitions: usize,
    ) -> Vec<SourceRecord> {
        let mut offsets = vec![0; partitions];
        synthetic_stream(
            &mut EventFactory::new(1),
            topic,
            count,
            &mut offsets,
            timeline.origin,
            0,
            timeline,
            &Disorder::demo(),
        )
    }

    /// The event time a record carries (its JSON's time field).
    fn event_ms(r: &SourceRecord) -> i64 {
        let v: serde_json::Value =
            serde_json::from_slice(r.value.as_deref().unwrap_or(b"{}")).unwrap_or_default();
        for k in ["created_at", "reported_at", "updated_at"] {
            if let Some(s) = v[k].as_str() {
                return chrono::DateTime::parse_from_rfc3339(s)
                    .map(|d| d.timestamp_millis())
                    .unwrap_or(-1);
            }
        }
        v["attempted_at"].as_i64().unwrap_or(-1)
    }

    #[test]
    fn event_time_never_runs_ahead_of_the_clock_and_a_second_run_continues() {
        let now = 1_800_000_000_000;
        for topic in ["orders", "payments", "readings", ORDER_STATUS_TOPIC] {
            let first = Timeline::ending(now, 0, 50_000, HOUR_MS, None);
            assert_eq!(first.start_ms, now - HOUR_MS);
            let records = stream(topic, &first, 50_000, 4);
            let last = records.iter().map(event_ms).max().unwrap_or(0);
            assert!(last <= now, "{topic}: {last} > {now}");
            assert!(records.iter().all(|r| r.timestamp_ms <= now), "{topic}");
            // Five minutes later, a second run of the same size continues after the first's
            // latest Kafka timestamp (what a checkpoint keeps): every record is stamped after
            // it, so the two runs' records are told apart by their stamps.
            let stamped = records.iter().map(|r| r.timestamp_ms).max().unwrap_or(0);
            let later = now + 300_000;
            let second = Timeline::ending(later, 50_000, 50_000, HOUR_MS, Some(stamped));
            assert_eq!(second.start_ms, stamped + 1);
            let records = stream(topic, &second, 50_000, 4);
            assert!(
                records.iter().all(|r| r.timestamp_ms > stamped),
                "{topic}: a record stamped before the second run"
            );
            let late = records
                .iter()
                .filter(|r| r.value.is_some() && event_ms(r) < last - 30_000)
                .count();
            // Only the deliberately late ones (one in 997) fall behind the first run's end.
            assert!(late <= 50_000 / 997 + 1, "{topic}: {late} late");
            assert!(records.iter().all(|r| event_ms(r) <= later), "{topic}");
        }
    }

    #[test]
    fn each_partition_is_in_order_but_for_a_bounded_jitter() {
        let now = 1_800_000_000_000;
        for topic in ["orders", "payments", "readings"] {
            let t = Timeline::ending(now, 0, 20_000, HOUR_MS, None);
            let records = stream(topic, &t, 20_000, 4);
            for p in 0..4 {
                let mut newest = i64::MIN;
                for r in records.iter().filter(|r| r.partition == p) {
                    let at = event_ms(r);
                    // Behind the partition's newest event by less than the spec's 30 s
                    // watermark delay, but for the deliberately late ones.
                    let behind = newest.saturating_sub(at);
                    assert!(
                        !(30_000..=100_000).contains(&behind),
                        "{topic}/{p}: {behind} ms behind"
                    );
                    newest = newest.max(at);
                }
            }
        }
    }

    #[test]
    fn a_payment_follows_its_order_by_20_to_25_seconds_and_readings_reach_every_partition() {
        let now = 1_800_000_000_000;
        let t = Timeline::ending(now, 0, 5_000, HOUR_MS, None);
        let orders: std::collections::HashMap<String, i64> = stream("orders", &t, 5_000, 4)
            .iter()
            .filter_map(|r| {
                let v: serde_json::Value = serde_json::from_slice(r.value.as_deref()?).ok()?;
                Some((v["order_id"].as_str()?.to_string(), event_ms(r)))
            })
            .collect();
        let mut checked = 0;
        for r in stream("payments", &t, 5_000, 4) {
            let v: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap_or(b"{}")).unwrap_or_default();
            let at = event_ms(&r);
            let Some(placed) = v["order_id"].as_str().and_then(|o| orders.get(o)) else {
                continue;
            };
            if at == now {
                continue; // held at the clock
            }
            let after = at - placed;
            assert!(
                (20_000..25_000).contains(&after),
                "{v}: {after} ms after its order"
            );
            checked += 1;
        }
        assert!(checked > 4_500, "{checked}");
        // A run packed into a few seconds still spreads readings over every partition.
        let short = Timeline::ending(now, 0, 2_000, 3_000, None);
        let partitions: std::collections::BTreeSet<i32> = stream("readings", &short, 2_000, 4)
            .iter()
            .map(|r| r.partition)
            .collect();
        assert_eq!(partitions.len(), 4, "{partitions:?}");
    }

    #[test]
    fn a_plain_feed_never_wraps() {
        // `generate --records 10000 --partitions 4`: each partition's times only go forward
        // (but for the half-second jitter).
        let now = 1_800_000_000_000;
        let t = Timeline::ending(now, 0, 10_000, plain_span_ms(10_000), None);
        let mut offsets = vec![0; 4];
        let records = synthetic_stream(
            &mut EventFactory::new(1),
            "orders",
            10_000,
            &mut offsets,
            0,
            0,
            &t,
            &Disorder::default(),
        );
        for p in 0..4 {
            let times: Vec<i64> = records
                .iter()
                .filter(|r| r.partition == p)
                .map(event_ms)
                .collect();
            assert!(
                times.windows(2).all(|w| w[1] > w[0] - 1_000),
                "partition {p} goes back in time"
            );
        }
        assert!(
            records
                .iter()
                .all(|r| event_ms(r) <= now && event_ms(r) >= now - 10_500)
        );
    }
}
