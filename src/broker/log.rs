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
