//! The compressed body of a pending item: its file list and the ranges of its other
//! partitions, as zstd-compressed JSON.
//!
//! DynamoDB bills a pending item by the kilobyte twice (2 write units per KB in the batch's
//! transaction, 1 per KB when its commit deletes it), and a body of a few files with their
//! column statistics is a few kilobytes of JSON that compresses poorly alone: zstd has no
//! history to find its repeats in. So a body is compressed against a dictionary of its shape
//! ([`DICTIONARY_V1`]), with each file's statistics in column order (iceberg writes them in
//! hash order, which costs a byte an entry) — the shipped spec's orders batch goes from 1.5 KB
//! to under 1 KB. A byte in front names the layout; each stays readable:
//!
//! | first byte | body |
//! |---|---|
//! | `0x28` (zstd's magic) | a plain zstd frame (the first layout) |
//! | `0x01` | a zstd frame compressed against [`DICTIONARY_V1`] |
//!
//! Any other first byte is refused as unreadable, naming it (a newer release's body): the item
//! is kept, and blocks its partition's later batches, until a release that reads it runs.
//! Ingest writes the dictionary layout only once the scheduled stage of a release that reads
//! it has marked the state table's layout item (see [`super::BODY_LAYOUT`]), and goes back to
//! the first one when that stage runs with `STREAMTABLE_PENDING_BODIES=first`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::checkpoint::{
    PendingFile, SourcePartition, SourceRange, decode_ranges, encode_ranges, ranges_beyond_limits,
};
use crate::error::{Error, Result};

/// The first byte of a body compressed against [`DICTIONARY_V1`].
const DICTIONARY_V1_TAG: u8 = 0x01;

/// The first byte of a plain zstd frame (its magic number is `FD2FB528`, little-endian).
const ZSTD_FRAME_TAG: u8 = 0x28;

/// The dictionary of [`DICTIONARY_V1_TAG`] bodies, as zstd "raw content": a made-up pending
/// body (two files' JSON with every field iceberg writes, no user data). Frozen — bodies in
/// DynamoDB are decoded with it — so a better one is a new tag, never an edit (a test pins it).
const DICTIONARY_V1: &[u8] = include_bytes!("body.v1.dict");

/// zstd level of bodies: a body is a few KB, so even 19 costs well under a millisecond.
const LEVEL: i32 = 19;

/// The per-column statistics of an iceberg `DataFile` in JSON: lists of `{"key": field id, …}`.
const STATISTICS: [&str; 6] = [
    "column_sizes",
    "value_counts",
    "null_value_counts",
    "nan_value_counts",
    "lower_bounds",
    "upper_bounds",
];

/// `data_file` (iceberg's JSON of a `DataFile`) with its statistics in field-id order, the
/// order [`DICTIONARY_V1`] predicts (they are maps; iceberg writes them in hash order). Every
/// other byte stays as written — the fields in iceberg's order, the partition's fields in the
/// partition spec's (iceberg reads a partition by position), every value — so iceberg reads
/// the same file; unchanged if it is not a JSON object.
fn in_column_order(data_file: &str) -> String {
    let Ok(Fields(fields)) = serde_json::from_str::<Fields<'_>>(data_file) else {
        return data_file.to_string();
    };
    let mut out = String::with_capacity(data_file.len());
    out.push('{');
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let Ok(key) = serde_json::to_string(name) else {
            return data_file.to_string();
        };
        out.push_str(&key);
        out.push(':');
        let list = STATISTICS
            .contains(&name.as_str())
            .then(|| serde_json::from_str::<Vec<&RawValue>>(value.get()).ok())
            .flatten();
        match list {
            Some(mut list) => {
                list.sort_by_cached_key(|e| {
                    serde_json::from_str::<FieldId>(e.get()).ok().map(|k| k.key)
                });
                out.push('[');
                for (j, e) in list.iter().enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    out.push_str(e.get());
                }
                out.push(']');
            }
            None => out.push_str(value.get()),
        }
    }
    out.push('}');
    out
}

/// A statistics entry's field id.
#[derive(Deserialize)]
struct FieldId {
    key: i64,
}

/// A JSON object's fields in their order, each value as written.
struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> std::result::Result<Fields<'a>, M::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'a RawValue>()? {
                    fields.push(entry);
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// Largest body accepted when decompressing (a DynamoDB item holds 400 KB; a body that
/// inflates beyond this is corrupt, not a batch).
const MAX_BODY_BYTES: usize = 64 << 20;

#[derive(Serialize, Deserialize)]
struct Body {
    files: Vec<PendingFile>,
    /// The other partitions' ranges in [`crate::checkpoint::encode_ranges`]' form (the first
    /// layout).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    more: String,
    /// The same in steps ([`DICTIONARY_V1_TAG`] bodies; see [`ranges_in_steps`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    ranges: BTreeMap<String, Vec<[i64; 3]>>,
}

impl Body {
    fn json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self)
            .map_err(|e| Error::Internal(format!("serialize pending batch: {e}")))
    }
}

/// `ranges` per topic, by partition, each as `[partition − the one before, first offset − the
/// one before, last offset − first offset]` (from 0 and 0): a topic's partitions are
/// consecutive and at similar offsets, so 63 ranges take a few bytes each, not 25.
fn ranges_in_steps(ranges: &[SourceRange]) -> BTreeMap<String, Vec<[i64; 3]>> {
    let mut by_topic: BTreeMap<&str, Vec<&SourceRange>> = BTreeMap::new();
    for r in ranges {
        by_topic.entry(&r.source.topic).or_default().push(r);
    }
    by_topic
        .into_iter()
        .map(|(topic, mut rs)| {
            rs.sort();
            let (mut partition, mut first) = (0i64, 0i64);
            let steps = rs
                .into_iter()
                .map(|r| {
                    let p = i64::from(r.source.partition);
                    let step = [
                        p - partition,
                        r.first_offset.wrapping_sub(first),
                        r.last_offset.wrapping_sub(r.first_offset),
                    ];
                    (partition, first) = (p, r.first_offset);
                    step
                })
                .collect();
            (topic.to_string(), steps)
        })
        .collect()
}

/// [`ranges_in_steps`] read back, or why a step is impossible.
fn ranges_from_steps(
    steps: BTreeMap<String, Vec<[i64; 3]>>,
) -> std::result::Result<Vec<SourceRange>, String> {
    if let Some(why) = ranges_beyond_limits(steps.iter().map(|(t, rs)| (t.len(), rs.len()))) {
        return Err(format!("ranges: {why}"));
    }
    let mut out = Vec::new();
    for (topic, rs) in steps {
        let (mut partition, mut first) = (0i64, 0i64);
        for [dp, dfirst, len] in rs {
            partition = partition
                .checked_add(dp)
                .filter(|p| i32::try_from(*p).is_ok())
                .ok_or_else(|| format!("ranges of {topic}: partition step {dp} is out of range"))?;
            first = first.wrapping_add(dfirst);
            let last = first
                .checked_add(len)
                .filter(|_| len >= 0)
                .ok_or_else(|| format!("ranges of {topic}: range length {len} is impossible"))?;
            out.push(SourceRange {
                source: SourcePartition::new(topic.clone(), partition as i32),
                first_offset: first,
                last_offset: last,
            });
        }
    }
    out.sort();
    Ok(out)
}

/// `more` if every range is one [`decode`] reads back (an impossible range would only be
/// found unreadable after its transaction moved the checkpoint).
fn checked(more: &[SourceRange]) -> Result<&[SourceRange]> {
    let bad = |why: String| Err(Error::Internal(format!("pending batch ranges: {why}")));
    if let Some(why) = ranges_beyond_limits(more.iter().map(|r| (r.source.topic.len(), 1))) {
        return bad(why);
    }
    for r in more {
        if r.last_offset < r.first_offset {
            return bad(format!(
                "{}: {}..={} cannot be stored",
                r.source, r.first_offset, r.last_offset
            ));
        }
    }
    Ok(more)
}

/// The body of `files` and `more` in the first layout (plain zstd), which every release reads:
/// what ingest writes until the commit stage reads the dictionary layout.
pub(super) fn encode_first_layout(files: &[PendingFile], more: &[SourceRange]) -> Result<Vec<u8>> {
    let more = checked(more)?;
    let body = Body {
        files: files.to_vec(),
        more: if more.is_empty() {
            String::new()
        } else {
            encode_ranges(more)
        },
        ranges: BTreeMap::new(),
    };
    zstd::bulk::compress(&body.json()?, 9)
        .map_err(|e| Error::Internal(format!("compress pending batch: {e}")))
}

/// The compressed body of `files` and `more`, against the dictionary.
pub(super) fn encode(files: &[PendingFile], more: &[SourceRange]) -> Result<Vec<u8>> {
    let more = checked(more)?;
    let body = Body {
        files: files
            .iter()
            .map(|f| PendingFile {
                data_file: in_column_order(&f.data_file),
                ..f.clone()
            })
            .collect(),
        more: String::new(),
        ranges: ranges_in_steps(more),
    };
    let json = body.json()?;
    let frame = zstd::bulk::Compressor::with_dictionary(LEVEL, DICTIONARY_V1)
        .and_then(|mut c| {
            // 4 bytes that tell damage (or a wrong dictionary) from a body.
            c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
            c.compress(&json)
        })
        .map_err(|e| Error::Internal(format!("compress pending batch: {e}")))?;
    let mut out = Vec::with_capacity(frame.len() + 1);
    out.push(DICTIONARY_V1_TAG);
    out.extend_from_slice(&frame);
    Ok(out)
}

/// The files and ranges of a compressed body, or why it cannot be read.
pub(super) fn decode(
    bytes: &[u8],
) -> std::result::Result<(Vec<PendingFile>, Vec<SourceRange>), String> {
    let json = match bytes.split_first() {
        Some((&ZSTD_FRAME_TAG, _)) => zstd::bulk::decompress(bytes, MAX_BODY_BYTES),
        Some((&DICTIONARY_V1_TAG, frame)) => {
            zstd::bulk::Decompressor::with_dictionary(DICTIONARY_V1)
                .and_then(|mut d| d.decompress(frame, MAX_BODY_BYTES))
        }
        Some((other, _)) => {
            return Err(format!(
                "pending item body has layout {other:#04x}, which this release does not read \
                 (written by a newer release: deploy it again)"
            ));
        }
        None => return Err("pending item body is empty".to_string()),
    }
    .map_err(|e| format!("pending item body does not decompress: {e}"))?;
    let body: Body =
        serde_json::from_slice(&json).map_err(|e| format!("pending item body is corrupt: {e}"))?;
    let mut more = if body.more.is_empty() {
        Vec::new()
    } else {
        decode_ranges(&body.more)?
    };
    more.extend(ranges_from_steps(body.ranges)?);
    more.sort();
    Ok((body.files, more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bodies_round_trip_and_garbage_is_refused() {
        let files = vec![PendingFile {
            table: "orders".into(),
            data_file: "{\"file_path\":\"s3://b/w/orders/data/x.parquet\"}".into(),
            rows: 10,
            bytes: 2048,
            partitioning: Some(vec!["day(created_at)".into()]),
            carried: None,
            key_deletes: None,
        }];
        let more = vec![SourceRange {
            source: SourcePartition::new("orders", 3),
            first_offset: 1_000_000_000,
            last_offset: 1_000_000_099,
        }];
        let b = encode(&files, &more).expect("encode");
        assert_eq!(decode(&b).expect("decode"), (files.clone(), more));
        assert_eq!(
            decode(&encode(&files, &[]).expect("encode"))
                .expect("decode")
                .1,
            vec![]
        );
        assert!(decode(b"not zstd").unwrap_err().contains("layout 0x6e"));
        assert!(decode(b"").unwrap_err().contains("empty"));
        let not_json = zstd::bulk::compress(b"[1,2", 3).expect("compress");
        assert!(decode(&not_json).unwrap_err().contains("corrupt"));
        let mut damaged = b.clone();
        damaged.truncate(b.len() / 2);
        assert!(decode(&damaged).unwrap_err().contains("decompress"));
    }

    proptest! {
        /// Ranges in steps read back as they were, whatever the partitions and offsets; steps
        /// that name no range are refused, never a panic.
        #[test]
        fn ranges_in_steps_round_trip(
            rs in proptest::collection::btree_map(
                (prop_oneof![Just("orders".to_string()), Just("t".to_string())], 0..i32::MAX),
                (any::<i64>(), 0..1_000_000i64),
                0..70,
            ),
            garbage in proptest::collection::vec(any::<[i64; 3]>(), 0..5),
        ) {
            let ranges: Vec<SourceRange> = rs
                .into_iter()
                .map(|((topic, p), (first, len))| SourceRange {
                    source: SourcePartition::new(topic, p),
                    first_offset: first,
                    last_offset: first.saturating_add(len),
                })
                .collect();
            let mut sorted = ranges.clone();
            sorted.sort();
            prop_assert_eq!(ranges_from_steps(ranges_in_steps(&ranges)).unwrap(), sorted);
            let _ = ranges_from_steps(BTreeMap::from([("g".to_string(), garbage)]));
        }
    }

    /// A body of the first layout (plain zstd of the JSON, iceberg's field order), as items
    /// written before the dictionary hold it, reads as it did.
    #[test]
    fn bodies_of_the_first_layout_still_read() {
        let json = br#"{"files":[{"table":"orders","data_file":"{\"content\":0,\"file_path\":\"s3://b/w/orders/data/x.parquet\",\"column_sizes\":[{\"key\":2,\"value\":5},{\"key\":1,\"value\":7}]}","rows":3,"bytes":900}],"more":"{\"orders\":[[4,10,19]]}"}"#;
        let old = zstd::bulk::compress(json, 9).expect("compress");
        let (files, more) = decode(&old).expect("first layout");
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].rows, 3);
        assert!(
            files[0]
                .data_file
                .contains(r#"{"key":2,"value":5},{"key":1"#)
        );
        assert_eq!(more[0].source, SourcePartition::new("orders", 4));
        assert_eq!((more[0].first_offset, more[0].last_offset), (10, 19));
    }

    /// Statistics come out in field-id order and every other byte as written — the fields and
    /// the partition's fields in their order — and what is not a JSON object passes through.
    #[test]
    fn only_statistics_are_put_in_field_id_order() {
        let hashed = r#"{"file_path":"s3://b/x.parquet","content":0,"upper_bounds":[{"value":[9],"key":3},{"key":1,"value":[7]}],"column_sizes":[{"key":12,"value":5},{"key":2,"value":6}],"partition":{"b":1,"a":null},"record_count":18446744073709551615,"x":1.50}"#;
        assert_eq!(
            in_column_order(hashed),
            r#"{"file_path":"s3://b/x.parquet","content":0,"upper_bounds":[{"key":1,"value":[7]},{"value":[9],"key":3}],"column_sizes":[{"key":2,"value":6},{"key":12,"value":5}],"partition":{"b":1,"a":null},"record_count":18446744073709551615,"x":1.50}"#
        );
        for odd in [
            "not json {",
            "[1,2]",
            "\"s\"",
            "{\"a\":1",
            "{\"column_sizes\":[{\"key\":\"x\"},3]}",
        ] {
            let out = in_column_order(odd);
            assert!(
                out == odd || serde_json::from_str::<serde_json::Value>(&out).is_ok(),
                "{odd} -> {out}"
            );
        }
    }

    /// A real data file of a table partitioned on two fields whose names are not in
    /// alphabetical order (iceberg reads a partition by position) reads back through iceberg
    /// as the same file after the reordering, statistics and all.
    #[test]
    fn a_data_file_reads_back_the_same_through_iceberg() {
        use iceberg::spec::{
            DataContentType, DataFileBuilder, DataFileFormat, Datum, FormatVersion, Literal,
            NestedField, PrimitiveType, Schema, Struct, Transform, Type, UnboundPartitionSpec,
            deserialize_data_file_from_json, serialize_data_file_to_json,
        };
        use std::collections::HashMap;
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::required(2, "at", Type::Primitive(PrimitiveType::Date)).into(),
                NestedField::optional(3, "name", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .expect("schema");
        let spec = UnboundPartitionSpec::builder()
            .add_partition_field(1, "id_bucket", Transform::Bucket(8))
            .expect("field")
            .add_partition_field(2, "at_day", Transform::Day)
            .expect("field")
            .build()
            .bind(schema.clone())
            .expect("spec");
        let partition_type = spec.partition_type(&schema).expect("type");
        let file = DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_format(DataFileFormat::Parquet)
            .file_path("s3://b/w/t/data/id_bucket=3/at_day=2026-12-01/f.parquet".into())
            .file_size_in_bytes(4096)
            .record_count(100)
            .partition_spec_id(spec.spec_id())
            .partition(Struct::from_iter([
                Some(Literal::int(3)),
                Some(Literal::date(20423)),
            ]))
            .column_sizes(HashMap::from_iter((1..=3).map(|k| (k, 100 * k as u64))))
            .value_counts(HashMap::from_iter((1..=3).map(|k| (k, 100))))
            .null_value_counts(HashMap::from_iter((1..=3).map(|k| (k, k as u64 - 1))))
            .lower_bounds(HashMap::from([
                (1, Datum::long(-5)),
                (2, Datum::date(20423)),
                (3, Datum::string("ab\u{e9}\"")),
            ]))
            .upper_bounds(HashMap::from([
                (1, Datum::long(i64::MAX)),
                (2, Datum::date(20423)),
                (3, Datum::string("zz")),
            ]))
            .build()
            .expect("data file");
        let json = serialize_data_file_to_json(file.clone(), &partition_type, FormatVersion::V2)
            .expect("json");
        let reordered = in_column_order(&json);
        let back =
            deserialize_data_file_from_json(&reordered, spec.spec_id(), &partition_type, &schema)
                .expect("iceberg reads it");
        assert_eq!(back, file);
        let files = vec![PendingFile {
            table: "t".into(),
            data_file: json,
            rows: 100,
            bytes: 4096,
            partitioning: None,
            carried: None,
            key_deletes: None,
        }];
        let (decoded, _) = decode(&encode(&files, &[]).expect("encode")).expect("decode");
        let again = deserialize_data_file_from_json(
            &decoded[0].data_file,
            spec.spec_id(),
            &partition_type,
            &schema,
        )
        .expect("iceberg reads the stored one");
        assert_eq!(again, file);
    }

    /// A body whose ranges would expand past their limits (a forged megabyte-long topic named
    /// by every step) is refused before it is expanded; so is a range encode cannot store.
    #[test]
    fn ranges_beyond_their_limits_are_refused() {
        let topic = "t".repeat(1 << 20);
        let json = format!(
            r#"{{"files":[],"ranges":{{"{topic}":[{}[0,0,0]]}}}}"#,
            "[0,0,0],".repeat(100_000)
        );
        let frame = zstd::bulk::Compressor::with_dictionary(3, DICTIONARY_V1)
            .and_then(|mut c| c.compress(json.as_bytes()))
            .expect("compress");
        let mut body = vec![DICTIONARY_V1_TAG];
        body.extend_from_slice(&frame);
        let err = decode(&body).expect_err("refused");
        assert!(err.contains("ranges"), "{err}");
        let backwards = SourceRange {
            source: SourcePartition::new("orders", 1),
            first_offset: 10,
            last_offset: 9,
        };
        assert!(encode(&[], std::slice::from_ref(&backwards)).is_err());
        assert!(encode_first_layout(&[], &[backwards]).is_err());
    }

    /// The first layout, as ingest writes it until the commit stage reads the dictionary, reads
    /// back too.
    #[test]
    fn the_first_layout_is_still_written_and_read() {
        let files = vec![PendingFile {
            table: "orders".into(),
            data_file: "{\"file_path\":\"s3://b/w/orders/data/x.parquet\"}".into(),
            rows: 10,
            bytes: 2048,
            partitioning: None,
            carried: None,
            key_deletes: None,
        }];
        let more = vec![SourceRange {
            source: SourcePartition::new("orders", 3),
            first_offset: 5,
            last_offset: 9,
        }];
        let b = encode_first_layout(&files, &more).expect("encode");
        assert_eq!(b[0], ZSTD_FRAME_TAG);
        assert_eq!(decode(&b).expect("decode"), (files, more));
    }

    /// The dictionary is part of the stored format: an edit would make every body written with
    /// it unreadable. A better dictionary is a new tag.
    #[test]
    fn the_dictionary_is_frozen() {
        let fnv = DICTIONARY_V1
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        assert_eq!((DICTIONARY_V1.len(), fnv), (4820, 0x0417_d153_b160_0fb5));
    }
}
