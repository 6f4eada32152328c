//! How the event source mapping cuts a stream into invocations, without Kafka: records are
//! buffered per topic-partition as they are fetched, and an invocation's event is due when the
//! buffer holds `BatchSize` records, when its payload would reach the 6 MB invocation limit, or
//! when its oldest record has waited `MaximumBatchingWindowInSeconds`. An event takes records
//! partition by partition, in offset order, up to those limits; what it leaves stays buffered
//! for the next one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::esm::{EsmEvent, EsmRecord};

/// The payload limit of a synchronous Lambda invocation: 6 MB.
pub const MAX_PAYLOAD_BYTES: usize = 6 * 1024 * 1024;

/// The event's JSON outside its records (event source, ARN, servers), bytes at most.
const EVENT_OVERHEAD: usize = 1024;

/// The event source the events name, as Lambda sets `eventSource`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventSource {
    /// Amazon MSK: `aws:kafka`, with the cluster's ARN.
    Msk {
        /// The `eventSourceArn` the events carry.
        arn: String,
    },
    /// A self-managed cluster: `SelfManagedKafka`, no ARN.
    SelfManaged,
}

/// The batching settings of an event source mapping.
#[derive(Debug, Clone)]
pub struct BatchShape {
    /// `BatchSize`: records per invocation at most (1..=10,000).
    pub batch_size: usize,
    /// `MaximumBatchingWindowInSeconds`: how long a record may wait for its batch to fill.
    pub window: Duration,
    /// The payload cap, bytes.
    pub max_payload: usize,
    /// `eventSource` (and ARN) of the events.
    pub source: EventSource,
    /// `bootstrapServers` of the events.
    pub bootstrap_servers: String,
}

/// The offsets an event carried for one topic-partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The event's first offset of it.
    pub first: i64,
    /// One past the event's last offset of it: where the partition resumes once it lands.
    pub next: i64,
    /// Records of it in the event.
    pub records: usize,
}

/// One invocation's event and what it carries per topic-partition.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The event, as the handler receives it.
    pub event: EsmEvent,
    /// Per topic-partition, its offsets in the event.
    pub carried: Vec<Carried>,
    /// The event's payload, bytes (an upper bound of its JSON).
    pub bytes: usize,
}

#[derive(Debug, Default)]
struct Buffered {
    records: std::collections::VecDeque<(EsmRecord, usize)>,
    /// When its oldest record was fetched.
    since: Option<Instant>,
}

/// Records fetched and not yet handed to an invocation.
#[derive(Debug)]
pub struct Batcher {
    shape: BatchShape,
    buffers: BTreeMap<(String, i32), Buffered>,
    records: usize,
    bytes: usize,
}

/// An upper bound of a record's JSON in the event, bytes.
pub fn record_bytes(topic: &str, r: &EsmRecord) -> usize {
    let headers: usize = r
        .headers
        .iter()
        .map(|h| 8 + h.key.len() * 6 + h.value.as_ref().map_or(4, |v| v.len() * 5))
        .sum();
    // Field names, numbers and punctuation: 200 bytes covers them with room.
    200 + topic.len()
        + r.key.as_ref().map_or(4, String::len)
        + r.value.as_ref().map_or(4, String::len)
        + headers
}

impl Batcher {
    /// An empty buffer for events of `shape`.
    pub fn new(shape: BatchShape) -> Batcher {
        Batcher {
            shape,
            buffers: BTreeMap::new(),
            records: 0,
            bytes: 0,
        }
    }

    /// The settings.
    pub fn shape(&self) -> &BatchShape {
        &self.shape
    }

    /// Buffers one fetched record of `topic`/`partition`.
    pub fn push(&mut self, topic: &str, partition: i32, record: EsmRecord, now: Instant) {
        let size = record_bytes(topic, &record);
        let b = self
            .buffers
            .entry((topic.to_string(), partition))
            .or_default();
        b.since.get_or_insert(now);
        b.records.push_back((record, size));
        self.records += 1;
        self.bytes += size;
    }

    /// Records buffered.
    pub fn len(&self) -> usize {
        self.records
    }

    /// Bytes buffered (an upper bound of their JSON).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Whether `topic`/`partition` has records buffered.
    pub fn holds(&self, topic: &str, partition: i32) -> bool {
        self.buffers
            .get(&(topic.to_string(), partition))
            .is_some_and(|b| !b.records.is_empty())
    }

    /// When the oldest buffered record's batching window ends.
    pub fn deadline(&self) -> Option<Instant> {
        self.buffers
            .values()
            .filter_map(|b| b.since)
            .min()
            .map(|t| t + self.shape.window)
    }

    /// Whether an invocation is due at `now`: a full batch, a full payload or a window ended.
    pub fn due(&self, now: Instant) -> bool {
        !self.is_empty()
            && (self.records >= self.shape.batch_size
                || self.bytes + EVENT_OVERHEAD >= self.shape.max_payload
                || self.deadline().is_some_and(|d| d <= now))
    }

    /// Takes the next event: records partition by partition in offset order, up to the batch
    /// size and the payload cap (a record larger than the cap on its own goes alone, so that
    /// nothing is stuck behind it). `None` when nothing is buffered.
    pub fn take(&mut self) -> Option<Batch> {
        if self.is_empty() {
            return None;
        }
        let mut event = EsmEvent {
            event_source: Some(match &self.shape.source {
                EventSource::Msk { .. } => "aws:kafka".to_string(),
                EventSource::SelfManaged => "SelfManagedKafka".to_string(),
            }),
            event_source_arn: match &self.shape.source {
                EventSource::Msk { arn } => Some(arn.clone()),
                EventSource::SelfManaged => None,
            },
            bootstrap_servers: Some(self.shape.bootstrap_servers.clone()),
            records: BTreeMap::new(),
        };
        let mut carried = Vec::new();
        let (mut count, mut bytes) = (0usize, EVENT_OVERHEAD);
        'partitions: for ((topic, partition), b) in self.buffers.iter_mut() {
            let mut taken: Vec<EsmRecord> = Vec::new();
            let key_bytes = topic.len() + 16;
            while let Some((_, size)) = b.records.front() {
                let size = *size + if taken.is_empty() { key_bytes } else { 0 };
                let full = count >= self.shape.batch_size
                    || (count > 0 && bytes + size > self.shape.max_payload);
                if full {
                    break;
                }
                let Some((record, s)) = b.records.pop_front() else {
                    break;
                };
                self.records -= 1;
                self.bytes -= s;
                count += 1;
                bytes += size;
                taken.push(record);
            }
            if let (Some(first), Some(last)) = (taken.first(), taken.last()) {
                carried.push(Carried {
                    topic: topic.clone(),
                    partition: *partition,
                    first: first.offset,
                    next: last.offset.saturating_add(1),
                    records: taken.len(),
                });
                event.records.insert(format!("{topic}-{partition}"), taken);
            }
            if b.records.is_empty() {
                b.since = None;
            }
            if count >= self.shape.batch_size || bytes >= self.shape.max_payload {
                break 'partitions;
            }
        }
        self.buffers.retain(|_, b| !b.records.is_empty());
        Some(Batch {
            event,
            carried,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch_size: usize, window_ms: u64, max_payload: usize) -> BatchShape {
        BatchShape {
            batch_size,
            window: Duration::from_millis(window_ms),
            max_payload,
            source: EventSource::SelfManaged,
            bootstrap_servers: "127.0.0.1:9092".into(),
        }
    }

    fn record(partition: i32, offset: i64, value_len: usize) -> EsmRecord {
        EsmRecord {
            topic: Some("t".into()),
            partition: partition as i64,
            offset,
            value: Some("A".repeat(value_len)),
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_is_due_when_full_or_when_its_window_ends() {
        let t0 = Instant::now();
        let mut b = Batcher::new(shape(3, 500, MAX_PAYLOAD_BYTES));
        assert!(!b.due(t0) && b.take().is_none());
        b.push("t", 0, record(0, 10, 1), t0);
        b.push("t", 1, record(1, 4, 1), t0);
        assert!(!b.due(t0 + Duration::from_millis(499)));
        assert!(b.due(t0 + Duration::from_millis(500)));
        b.push("t", 0, record(0, 12, 1), t0);
        assert!(b.due(t0), "three records fill a batch of three");
        let batch = b.take().expect("a batch");
        assert_eq!(batch.event.len(), 3);
        assert_eq!(
            batch.event.event_source.as_deref(),
            Some("SelfManagedKafka")
        );
        assert_eq!(batch.event.event_source_arn, None);
        assert_eq!(
            batch.carried,
            vec![
                Carried {
                    topic: "t".into(),
                    partition: 0,
                    first: 10,
                    next: 13,
                    records: 2
                },
                Carried {
                    topic: "t".into(),
                    partition: 1,
                    first: 4,
                    next: 5,
                    records: 1
                }
            ]
        );
        assert!(b.is_empty() && b.deadline().is_none());
    }

    #[test]
    fn an_event_never_exceeds_the_batch_size_and_the_rest_stays_in_order() {
        let t0 = Instant::now();
        let mut b = Batcher::new(shape(4, 500, MAX_PAYLOAD_BYTES));
        for o in 0..10 {
            b.push("t", (o % 2) as i32, record((o % 2) as i32, o, 1), t0);
        }
        let mut seen: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        while let Some(batch) = b.take() {
            assert!(batch.event.len() <= 4);
            for recs in batch.event.records.values() {
                for r in recs {
                    seen.entry(r.partition as i32).or_default().push(r.offset);
                }
            }
        }
        assert_eq!(seen[&0], vec![0, 2, 4, 6, 8]);
        assert_eq!(seen[&1], vec![1, 3, 5, 7, 9]);
    }

    #[test]
    fn the_payload_cap_splits_events_and_an_oversized_record_goes_alone() {
        let t0 = Instant::now();
        let cap = 10_000;
        let mut b = Batcher::new(shape(10_000, 500, cap));
        for o in 0..10 {
            b.push("t", 0, record(0, o, 3_000), t0);
        }
        b.push("t", 0, record(0, 10, 50_000), t0);
        b.push("t", 0, record(0, 11, 10), t0);
        assert!(b.due(t0), "the payload is over the cap");
        let mut sizes = Vec::new();
        while let Some(batch) = b.take() {
            let json = serde_json::to_string(&batch.event).expect("serialises");
            assert!(
                json.len() <= batch.bytes,
                "{} > {}",
                json.len(),
                batch.bytes
            );
            if batch.event.len() > 1 {
                assert!(batch.bytes <= cap);
            }
            sizes.push(batch.event.len());
        }
        assert_eq!(sizes.iter().sum::<usize>(), 12);
        assert!(sizes.contains(&1), "the 50 kB record went alone: {sizes:?}");
    }

    #[test]
    fn the_size_bound_holds_for_headers_with_every_byte() {
        let mut r = record(0, 1, 10);
        r.headers = (0..50)
            .map(|i| crate::esm::EsmHeader {
                key: format!("k\"\u{1}{i}"),
                value: Some((0..=255).collect()),
            })
            .collect();
        r.key = Some("a".repeat(100));
        let json = serde_json::to_string(&r).expect("serialises");
        assert!(json.len() <= record_bytes("t", &r), "{}", json.len());
    }
}
