//! The records of a batch by topic-partition, and each partition's records as planned against
//! its checkpoint.

use std::collections::BTreeMap;

use crate::checkpoint::{Checkpoint, SourcePartition, SourceRange, plan};
use crate::error::{Error, Result};
use crate::esm::{EsmEvent, EsmRecord};

/// One partition's new records, as planned against its checkpoint.
pub(super) struct Planned<'a> {
    pub source: SourcePartition,
    pub checkpoint: Checkpoint,
    pub next_offset: i64,
    /// In offset order, each offset once.
    pub records: Vec<&'a EsmRecord>,
}

impl<'a> Planned<'a> {
    /// The records of `source` at or past `checkpoint`, or `None` when there are none.
    pub fn new(
        source: &SourcePartition,
        checkpoint: Checkpoint,
        records: &[&'a EsmRecord],
    ) -> Option<Self> {
        let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
        let p = plan(checkpoint, &offsets);
        if p.accept.is_empty() {
            return None;
        }
        Some(Planned {
            source: source.clone(),
            checkpoint,
            next_offset: p.next_offset,
            records: p.accept.iter().map(|&i| records[i]).collect(),
        })
    }

    pub fn first_offset(&self) -> i64 {
        self.records.first().map_or(0, |r| r.offset)
    }

    pub fn last_offset(&self) -> i64 {
        self.records.last().map_or(0, |r| r.offset)
    }

    pub fn range(&self) -> SourceRange {
        SourceRange {
            source: self.source.clone(),
            first_offset: self.first_offset(),
            last_offset: self.last_offset(),
        }
    }
}

/// Groups an event's records by topic-partition. Each record's own topic and partition count;
/// the map key (`topic-partition`) names the topic when a record lacks one. An event with a
/// negative or oversized partition, or a negative offset, is not an MSK event and is refused.
pub fn group_by_partition(event: &EsmEvent) -> Result<BTreeMap<SourcePartition, Vec<&EsmRecord>>> {
    let mut groups: BTreeMap<SourcePartition, Vec<&EsmRecord>> = BTreeMap::new();
    for (key, records) in &event.records {
        for r in records {
            let topic = match &r.topic {
                Some(t) => t.clone(),
                None => key
                    .rsplit_once('-')
                    .map_or(key.as_str(), |(t, _)| t)
                    .to_string(),
            };
            let partition = i32::try_from(r.partition)
                .ok()
                .filter(|p| *p >= 0)
                .ok_or_else(|| Error::Event {
                    origin: key.clone(),
                    message: format!(
                        "partition {} of offset {} is not a Kafka partition number",
                        r.partition, r.offset
                    ),
                })?;
            // A negative offset is no Kafka offset: below every checkpoint, such a record
            // would be dropped as already seen.
            if r.offset < 0 {
                return Err(Error::Event {
                    origin: key.clone(),
                    message: format!(
                        "offset {} of partition {partition} is not a Kafka offset",
                        r.offset
                    ),
                });
            }
            groups
                .entry(SourcePartition::new(topic, partition))
                .or_default()
                .push(r);
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::{IngestOptions, MAX_ATTEMPTS};
    use crate::spec::PipelineSpec;

    fn event(partition: i64, offset: i64) -> EsmEvent {
        serde_json::from_str(&format!(
            r#"{{"records":{{"orders-0":[{{"topic":"orders","partition":{partition},"offset":{offset},"timestamp":1}}]}}}}"#
        ))
        .expect("event")
    }

    #[test]
    fn options_come_from_the_spec_and_the_environment() {
        let spec = PipelineSpec::parse(
            crate::config::BUILTIN_PIPELINE,
            std::path::Path::new("p"),
            &crate::process::Planner,
        )
        .expect("spec");
        let o = IngestOptions::from_lookup(&spec, |k| match k {
            "STREAMTABLE_INGEST_ZSTD_LEVEL" => Some("3".into()),
            _ => None,
        })
        .expect("options");
        assert_eq!((o.zstd_level, o.max_attempts), (3, MAX_ATTEMPTS));
        assert_eq!(o.max_record_bytes, spec.settings.max_record_bytes);
        let err = IngestOptions::from_lookup(&spec, |k| {
            (k == "STREAMTABLE_INGEST_MAX_ATTEMPTS").then(|| "0".into())
        })
        .expect_err("zero attempts");
        assert!(err.to_string().contains("from 1 to 100"), "{err}");
    }

    #[test]
    fn records_without_kafka_coordinates_are_refused_not_dropped() {
        // Found by fuzzing: offset -1 lay below every checkpoint and was counted as already seen.
        let err = group_by_partition(&event(0, -1)).expect_err("negative offset");
        assert!(err.to_string().contains("not a Kafka offset"), "{err}");
        assert!(group_by_partition(&event(-3, 5)).is_err());
        assert!(group_by_partition(&event(1 << 40, 5)).is_err());
        let valid = event(2, 0);
        let groups = group_by_partition(&valid).expect("valid");
        assert_eq!(
            groups.keys().next(),
            Some(&SourcePartition::new("orders", 2))
        );
    }
}
