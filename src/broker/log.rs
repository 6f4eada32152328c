//! A topic's own log, read for `streamtable audit --bootstrap-servers`: the offsets of its
//! committed records (`isolation.level=read_committed`: aborted records and transaction markers
//! are not records) over a range, with the log's first offset.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::{Connection, kafka_error};
use crate::audit::{LogRead, TopicLog};
use crate::error::{Error, Result};

/// How long a read may go without a record or the end of the partition before it gives up.
const STALL: Duration = Duration::from_secs(60);

/// Reads topics' logs through one consumer (no group: nothing is committed).
pub struct KafkaLog {
    connection: Connection,
}

impl KafkaLog {
    /// A reader of the cluster `connection` names (checked when the first log is read).
    pub fn new(connection: Connection) -> Result<KafkaLog> {
        connection.client_config()?;
        Ok(KafkaLog { connection })
    }

    fn read_blocking(
        self: &KafkaLog,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
    ) -> Result<LogRead> {
        let mut config = self.connection.client_config()?;
        config
            .set("group.id", "streamtable-audit")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            // Retention deleting the start of the log mid-read must fail the read, not jump to
            // its end (and pass on what was not read).
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "true");
        let consumer: BaseConsumer = config
            .create()
            .map_err(|e| kafka_error("connect to read the topic's log", e))?;
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(30))
            .map_err(|e| kafka_error(&format!("read the watermarks of {topic}-{partition}"), e))?;
        let start = from.max(low);
        let end = to.min(high);
        let mut out = LogRead {
            low,
            offsets: Vec::new(),
        };
        if start >= end {
            return Ok(out);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(start))
            .map_err(|e| kafka_error("assign the partition", e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| kafka_error(&format!("assign {topic}-{partition}"), e))?;
        let mut progress = Instant::now();
        loop {
            match consumer.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    progress = Instant::now();
                    if m.offset() >= end {
                        break;
                    }
                    out.offsets.push(m.offset());
                    if m.offset() + 1 >= end {
                        break;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e))
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut) => {}
                Some(Err(e)) => {
                    return Err(kafka_error(&format!("read {topic}-{partition}"), e));
                }
                None => {}
            }
            if progress.elapsed() > STALL {
                return Err(Error::Config(format!(
                    "reading {topic}-{partition}'s log stalled for {}s at offset {} (of {start}..{end}): the broker stopped answering",
                    STALL.as_secs(),
                    out.offsets.last().map_or(start, |o| o + 1)
                )));
            }
        }
        Ok(out)
    }
}

impl TopicLog for KafkaLog {
    fn read<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        from: i64,
        to: i64,
    ) -> Pin<Box<dyn Future<Output = Result<LogRead>> + Send + 'a>> {
        let reader = KafkaLog {
            connection: self.connection.clone(),
        };
        let topic = topic.to_string();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || reader.read_blocking(&topic, partition, from, to))
                .await
                .map_err(|e| Error::Internal(format!("reading the topic's log: {e}")))?
        })
    }
}

/// Per topic-partition, records' offsets and Kafka timestamps (ms).
pub type Stamps = std::collections::BTreeMap<(String, i32), Vec<(i64, i64)>>;

/// The offsets and Kafka timestamps (ms) of the last records below `to` (at most `n`) of each
/// partition of `below` (topic, partition, to), read through one consumer (no group): what
/// `streamtable run` checks a partition's log against its checkpoint with before it resumes
/// there ([`crate::checkpoint::recreated`]). A partition whose log starts at or after its `to`
/// has nothing below it to read.
pub fn stamps_below(
    connection: &Connection,
    below: &[(String, i32, i64)],
    n: i64,
) -> Result<Stamps> {
    use std::collections::BTreeMap;
    let mut out = Stamps::new();
    if below.is_empty() {
        return Ok(out);
    }
    let mut config = connection.client_config()?;
    config
        .set("group.id", "streamtable-probe")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "error")
        .set("enable.partition.eof", "true");
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| kafka_error("connect to read the logs below the checkpoints", e))?;
    let mut tpl = TopicPartitionList::new();
    let mut ends: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (topic, partition, to) in below {
        let (low, high) = consumer
            .fetch_watermarks(topic, *partition, Duration::from_secs(30))
            .map_err(|e| kafka_error(&format!("read the watermarks of {topic}-{partition}"), e))?;
        let end = (*to).min(high);
        let start = end.saturating_sub(n).max(low);
        if start >= end {
            continue;
        }
        tpl.add_partition_offset(topic, *partition, Offset::Offset(start))
            .map_err(|e| kafka_error("assign the partition", e))?;
        ends.insert((topic.clone(), *partition), end);
    }
    if ends.is_empty() {
        return Ok(out);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| kafka_error("assign the partitions below their checkpoints", e))?;
    let mut progress = Instant::now();
    while !ends.is_empty() {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                progress = Instant::now();
                let key = (m.topic().to_string(), m.partition());
                let Some(end) = ends.get(&key).copied() else {
                    continue;
                };
                if m.offset() < end {
                    let ts = m.timestamp().to_millis().unwrap_or(-1);
                    out.entry(key.clone()).or_default().push((m.offset(), ts));
                }
                if m.offset() + 1 >= end {
                    ends.remove(&key);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                ends.retain(|(_, partition), _| *partition != p);
            }
            Some(Err(e)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut) => {
            }
            Some(Err(e)) => return Err(kafka_error("read the logs below the checkpoints", e)),
            None => {}
        }
        if progress.elapsed() > STALL {
            return Err(Error::Config(format!(
                "reading the logs below the checkpoints stalled for {}s: the broker stopped answering",
                STALL.as_secs()
            )));
        }
    }
    Ok(out)
}
