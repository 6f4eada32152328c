//! The properties the fuzz targets check, shared by the coverage-guided fuzzers (`fuzz/`,
//! `cargo fuzz run …`) and the property tests of the test suite (`tests/fuzz_properties.rs`).
//!
//! Every input must end as rows or dead letters (or, for an input that is not an MSK event at
//! all, as an error the handler reports); nothing may panic.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use streamtable::backend::{Backend, BackendConfig};
use streamtable::esm::{EsmEvent, EsmRecord};
use streamtable::ingest::Ingestor;
use streamtable::spec::PipelineSpec;

/// The example pipeline: orders, payments, readings, and their derived tables.
pub const PIPELINE: &str = include_str!("../infra/pipeline.toml");

/// Topics whose values are registry-framed Avro (schema id 1) and Protobuf (schema id 2).
const REGISTRY_TABLES: &str = r#"

[[tables]]
name = "orders_avro"
topic = "orders-avro"
format = "avro"
columns = [
  { name = "order_id",   type = "string",        required = true },
  { name = "amount",     type = "decimal(18,2)", required = true },
  { name = "qty",        type = "int" },
  { name = "country",    type = "string" },
  { name = "created_at", type = "timestamp",     required = true },
]

[[tables]]
name = "orders_proto"
topic = "orders-proto"
format = "protobuf"
columns = [
  { name = "order_id",    type = "string",        required = true },
  { name = "customer_id", type = "string",        path = "$.customer.id" },
  { name = "amount",      type = "decimal(18,2)" },
  { name = "status",      type = "string" },
  { name = "created_at",  type = "timestamp" },
]
"#;

/// The Protobuf topic's schema.
const PROTO: &str = r#"
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  message Customer { string id = 1; }
  enum Status { NEW = 0; PAID = 1; }
  string order_id = 1;
  Customer customer = 2;
  string amount = 3;
  Status status = 4;
  google.protobuf.Timestamp created_at = 5;
  repeated Order children = 6;
}
"#;

/// The example pipeline as this build can run it: whole with SQL (the test suite), its topics'
/// tables only without (the fuzz crate builds without DataFusion unless `--features sql`).
fn pipeline() -> &'static str {
    if cfg!(feature = "sql") {
        PIPELINE
    } else {
        PIPELINE
            .split("\n# ----- Reference tables -----")
            .next()
            .unwrap_or(PIPELINE)
    }
}

struct Fixture {
    runtime: tokio::runtime::Runtime,
    ingestor: Ingestor,
    /// Tables that take each record at most once: the topics' tables and `dead_letters`.
    once: BTreeSet<String>,
    _home: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let home = tempfile::tempdir().expect("home");
        let registry = home.path().join("registry");
        std::fs::create_dir_all(&registry).expect("registry dir");
        let text = format!(
            "{}{REGISTRY_TABLES}\n[registry]\nurl = \"file:{}\"\n",
            pipeline(),
            registry.display()
        );
        let spec = PipelineSpec::parse(
            &text,
            Path::new("pipeline.toml"),
            &streamtable::process::Planner,
        )
        .expect("spec");
        // The Avro topic's writer schema (id 1), as its producer would register it, and the
        // Protobuf topic's .proto (id 2).
        let avro = spec
            .tables
            .iter()
            .find(|t| t.topic == "orders-avro")
            .expect("avro table");
        let producer = streamtable::generate::avro::AvroProducer::new(avro, 1);
        std::fs::write(registry.join("1.avsc"), producer.schema()).expect("schema");
        std::fs::write(registry.join("2.proto"), PROTO).expect("schema");
        let mut once: BTreeSet<String> = spec.tables.iter().map(|t| t.name.clone()).collect();
        once.insert("dead_letters".into());
        let ingestor = runtime.block_on(async {
            let backend = Backend::connect(&BackendConfig::Embedded {
                home: home.path().to_path_buf(),
            })
            .await
            .expect("backend");
            Ingestor::new(&spec, &backend).expect("ingestor")
        });
        Fixture {
            runtime,
            ingestor,
            once,
            _home: home,
        }
    })
}

/// Decodes and encodes every record of an event as ingest does (no I/O): each distinct
/// (topic, partition, offset) becomes exactly one row of its table or of `dead_letters`.
pub fn ingest_event(event: &EsmEvent) {
    let f = fixture();
    let Ok(encoded) = f.runtime.block_on(f.ingestor.encode_event_counted(event)) else {
        // Only an event with a record that has no Kafka coordinates is refused whole.
        assert!(
            event
                .records
                .values()
                .flatten()
                .any(|r| i32::try_from(r.partition).is_err() || r.partition < 0 || r.offset < 0),
            "a well-formed event was refused"
        );
        return;
    };
    let distinct: BTreeSet<(String, i64, i64)> = event
        .records
        .iter()
        .flat_map(|(key, rs)| {
            rs.iter().map(move |r| {
                let topic = r.topic.clone().unwrap_or_else(|| {
                    key.rsplit_once('-').map_or(key.as_str(), |(t, _)| t).into()
                });
                (topic, r.partition, r.offset)
            })
        })
        .collect();
    assert_eq!(
        encoded.records,
        distinct.len() as u64,
        "every distinct record is processed once"
    );
    // Derived tables take a subset (or, joined, a multiple) of the rows on top; a record a
    // derived table fails on is also a dead letter.
    let rows: u64 = encoded
        .files
        .iter()
        .filter(|file| f.once.contains(&file.table))
        .map(|file| file.data_file.record_count())
        .sum();
    assert_eq!(
        rows,
        encoded.records + encoded.transform_failures,
        "every record is a row or a dead letter"
    );
}

/// Arbitrary bytes as an MSK event: parsed or refused, and if parsed, fully accounted for.
pub fn esm_event(bytes: &[u8]) {
    if let Ok(event) = serde_json::from_slice::<EsmEvent>(bytes) {
        ingest_event(&event);
    }
}

/// Arbitrary bytes as one record: the first byte picks the topic and whether there is a key
/// (taken from the next bytes), the next eight the Kafka timestamp, the rest is the value. On the
/// registry topics (`orders-avro`: bits 0x30 = 0x10, `orders-proto`: 0x20), bit 0x08 puts their schema's Confluent
/// header in front of the value (Protobuf: with the first message's index).
pub fn record_value(bytes: &[u8]) {
    if let Some(event) = record_event(bytes) {
        ingest_event(&event);
    }
}

/// The tables [`record_value`]'s record lands in (its topic's table, or `dead_letters`).
pub fn record_value_tables(bytes: &[u8]) -> BTreeSet<String> {
    let f = fixture();
    let Some(event) = record_event(bytes) else {
        return BTreeSet::new();
    };
    let encoded = f
        .runtime
        .block_on(f.ingestor.encode_event_counted(&event))
        .expect("encodes");
    encoded
        .files
        .iter()
        .map(|file| file.table.clone())
        .collect()
}

fn record_event(bytes: &[u8]) -> Option<EsmEvent> {
    let (&selector, rest) = bytes.split_first()?;
    let topics = ["orders", "payments", "readings", "unknown"];
    let topic = match selector & 0x30 {
        0x10 => "orders-avro",
        0x20 => "orders-proto",
        _ => topics[usize::from(selector) % topics.len()],
    };
    let (timestamp, rest) = match rest.split_first_chunk::<8>() {
        Some((t, rest)) => (i64::from_le_bytes(*t), rest),
        None => (1_795_946_400_000, rest),
    };
    let (key, value) = if selector & 0x80 != 0 && rest.len() >= 4 {
        (Some(STANDARD.encode(&rest[..4])), &rest[4..])
    } else {
        (None, rest)
    };
    let framed: Vec<u8>;
    let value = match (topic, selector & 0x08 != 0) {
        ("orders-avro", true) => {
            framed = [&[0u8, 0, 0, 0, 1][..], value].concat();
            &framed[..]
        }
        ("orders-proto", true) => {
            framed = [&[0u8, 0, 0, 0, 2, 0][..], value].concat();
            &framed[..]
        }
        _ => value,
    };
    let record = EsmRecord {
        topic: Some(topic.to_string()),
        partition: 0,
        offset: 7,
        timestamp,
        key,
        value: (selector & 0x40 == 0).then(|| STANDARD.encode(value)),
        ..Default::default()
    };
    Some(EsmEvent {
        records: [(format!("{topic}-0"), vec![record])].into_iter().collect(),
        ..Default::default()
    })
}

/// Arbitrary text as a pipeline spec: refused with a message, or valid and then usable (every
/// table gets a layout and a decoder).
pub fn pipeline_spec(text: &str) {
    match PipelineSpec::parse(text, Path::new("fuzz.toml"), &streamtable::process::Planner) {
        Ok(spec) => {
            for t in &spec.tables {
                streamtable::schema::TableLayout::for_table(t).unwrap_or_else(|e| {
                    panic!("a valid spec's table {} has no layout: {e}", t.name)
                });
                let _ = streamtable::decode::Decoder::new(t);
            }
        }
        Err(e) => assert!(e.to_string().starts_with("fuzz.toml"), "{e}"),
    }
}

/// Arbitrary bytes as a schema a registry hands over: the first byte picks Avro (even) or
/// Protobuf (odd), the next two the length of the schema text, then the text, then a record
/// body. The schema's columns (`columns = "from-registry"`) are read off it or refused with a
/// message, and a decoder given it decodes the body into cells or a rejection: nothing panics,
/// and the work is bounded by the limits the decoders set.
pub fn registry_schema(bytes: &[u8]) {
    let Some((&selector, rest)) = bytes.split_first() else {
        return;
    };
    let Some((len, rest)) = rest.split_first_chunk::<2>() else {
        return;
    };
    let len = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    let (text, body) = rest.split_at(len);
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let (format, kind, table) = if selector % 2 == 0 {
        (streamtable::spec::Format::Avro, "AVRO", "orders-avro")
    } else {
        (
            streamtable::spec::Format::Protobuf,
            "PROTOBUF",
            "orders-proto",
        )
    };
    let _ = streamtable::registry::mapping::of_schema(format, text, None);
    static SPEC: OnceLock<PipelineSpec> = OnceLock::new();
    let spec = SPEC.get_or_init(|| {
        PipelineSpec::parse(
            &format!("{}{REGISTRY_TABLES}", pipeline()),
            Path::new("pipeline.toml"),
            &streamtable::process::Planner,
        )
        .expect("spec")
    });
    let Some(t) = spec.tables.iter().find(|t| t.topic == table) else {
        return;
    };
    let decoder = streamtable::decode::Decoder::new(t);
    let Some(registry) = decoder.registry() else {
        return;
    };
    let id = streamtable::decode::framing::SchemaId::Confluent(77);
    registry.add_schema(id, kind, text);
    let mut value = vec![0u8, 0, 0, 0, 77];
    if selector % 2 == 1 {
        value.push(0);
    }
    value.extend_from_slice(body);
    let mut scratch = Vec::new();
    let _ = decoder.decode(&value, &mut scratch, 1 << 20);
}
