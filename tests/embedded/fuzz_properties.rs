//! The fuzz targets' properties (`fuzz/targets.rs`) over structured, adversarial inputs: MSK
//! events with extreme partitions, offsets and timestamps, record values built from the spec's
//! field names with hostile JSON leaves, and pipeline specs mutated from the example. The
//! coverage-guided fuzzers (`scripts/fuzz`) explore the same targets from raw bytes; every
//! input they ever found is replayed here from `fuzz/regressions/`.

#[path = "../../fuzz/targets.rs"]
mod targets;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use proptest::prelude::*;
use serde_json::{Value, json};

/// JSON leaves chosen to hit every edge of the decoder: number forms and magnitudes, timestamps
/// of every era, strings with escapes, and the wrong types.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![
            Just("1e400"),
            Just("-0"),
            Just("123456789012345678901234567890123456789012"),
            Just("0.000000000000000000000000000000000000001"),
            Just("9223372036854775808"),
            Just("8300000000000000"),
            Just("-62135596800001"),
            Just("253402300800000"),
            Just("1.5e2"),
        ]
        .prop_map(|n| serde_json::from_str::<Value>(n).unwrap_or(Value::Null)),
        (
            -300_000i64..300_000,
            1u32..13,
            1u32..29,
            0u32..24,
            "[+-]?[0-9]{2}:[0-9]{2}|Z"
        )
            .prop_map(|(y, m, d, h, z)| json!(format!("{y:04}-{m:02}-{d:02}T{h:02}:00:00{z}"))),
        (-300_000i64..300_000, 1u32..13, 1u32..29)
            .prop_map(|(y, m, d)| json!(format!("{y:04}-{m:02}-{d:02}"))),
        "[0-9.eE+-]{0,30}".prop_map(Value::String),
        ".{0,40}".prop_map(Value::String),
    ]
}

/// A record value: an object over the example tables' field names (and strangers), nested
/// objects where paths expect leaves and the reverse; sometimes not JSON at all.
fn value_bytes() -> impl Strategy<Value = Vec<u8>> {
    let names = prop::sample::select(vec![
        "order_id",
        "customer_id",
        "amount",
        "currency",
        "country",
        "status",
        "created_at",
        "payment_id",
        "method",
        "attempted_at",
        "sensor_id",
        "site",
        "temperature",
        "humidity",
        "reported_at",
        "other",
    ]);
    let field = (
        names,
        prop_oneof![4 => leaf(), 1 => prop::collection::vec(leaf(), 0..3).prop_map(Value::Array), 1 => Just(json!({"nested": {"x": 1}}))],
    );
    prop_oneof![
        8 => prop::collection::vec(field, 0..10).prop_map(|fs| {
            let obj: serde_json::Map<String, Value> =
                fs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
        }),
        1 => leaf().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn record() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["orders", "payments", "readings", "nobody"]),
        prop_oneof![8 => 0i64..4, 1 => any::<i64>()],
        prop_oneof![8 => 0i64..50, 1 => any::<i64>()],
        prop_oneof![8 => 1_795_946_400_000i64..1_795_946_500_000, 1 => any::<i64>()],
        prop::option::of(prop::collection::vec(any::<u8>(), 0..12)),
        prop::option::of(value_bytes()),
        prop_oneof![10 => Just(false), 1 => Just(true)],
    )
        .prop_map(|(topic, partition, offset, ts, key, value, garble)| {
            let encode = |b: &Vec<u8>| {
                let s = STANDARD.encode(b);
                if garble { format!("{s}@!") } else { s }
            };
            json!({
                "topic": topic, "partition": partition, "offset": offset, "timestamp": ts,
                "key": key.as_ref().map(encode), "value": value.as_ref().map(encode),
                "headers": [],
            })
        })
}

fn event() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(record(), 0..12).prop_map(|records| {
        let mut by_key = serde_json::Map::new();
        for r in records {
            let key = format!("{}-{}", r["topic"].as_str().unwrap_or(""), r["partition"]);
            if let Some(a) = by_key
                .entry(key)
                .or_insert_with(|| json!([]))
                .as_array_mut()
            {
                a.push(r);
            }
        }
        serde_json::to_vec(&json!({"eventSource": "aws:kafka", "records": by_key}))
            .unwrap_or_default()
    })
}

/// The example spec with random edits: a range replaced by random text, or type names and
/// transforms swapped for others.
fn spec_text() -> impl Strategy<Value = String> {
    let base = targets::PIPELINE.to_string();
    let len = base.len();
    prop_oneof![
        (0..len, 0usize..40, ".{0,20}").prop_map({
            let base = base.clone();
            move |(at, cut, with)| {
                let mut s = base.clone();
                let at = (0..=at).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
                let end = (at + cut..=s.len())
                    .find(|i| s.is_char_boundary(*i))
                    .unwrap_or(s.len());
                s.replace_range(at..end, &with);
                s
            }
        }),
        (
            prop::sample::select(vec![
                "decimal(18,2)",
                "timestamp",
                "string",
                "double",
                "day(created_at)"
            ]),
            prop::sample::select(vec![
                "decimal(0,0)",
                "decimal(39,2)",
                "decimal(2,3)",
                "date",
                "hour(created_at)",
                "bucket(0, order_id)",
                "truncate(4, amount)",
                "identity(temperature)",
                "int",
                "day(nope)",
                "",
                "\u{0}",
            ]),
        )
            .prop_map(move |(from, to)| base.replacen(from, to, 1)),
        ".{0,200}",
    ]
}

/// An Avro schema built to be expensive: named records reused as the fields of the next
/// (each level doubling or more the values of a record), unions, arrays and maps of them,
/// recursion through a union; sometimes deep.
fn avro_schema() -> impl Strategy<Value = String> {
    (1usize..45, 1usize..5, any::<u8>()).prop_map(|(levels, fan, shape)| {
        let mut ty = r#"{"type":"record","name":"R0","fields":[{"name":"n","type":"null"},{"name":"order_id","type":["null","string"]}]}"#.to_string();
        for k in 1..levels {
            let reuse = |i: usize| match (shape >> (i % 8)) & 3 {
                0 => format!(r#""R{}""#, k - 1),
                1 => format!(r#"["null","R{}"]"#, k - 1),
                2 => format!(r#"{{"type":"array","items":"R{}"}}"#, k - 1),
                _ => format!(r#"{{"type":"map","values":"R{}"}}"#, k - 1),
            };
            let mut fields = vec![format!(r#"{{"name":"a","type":{ty}}}"#)];
            for i in 0..fan {
                fields.push(format!(r#"{{"name":"b{i}","type":{}}}"#, reuse(i)));
            }
            fields.push(format!(r#"{{"name":"self","type":["null","R{k}"]}}"#));
            ty = format!(r#"{{"type":"record","name":"R{k}","fields":[{}]}}"#, fields.join(","));
        }
        ty
    })
}

/// A `.proto` nested deep, or wide, with self-references.
fn proto_schema() -> impl Strategy<Value = String> {
    (1usize..200, 1usize..30).prop_map(|(depth, width)| {
        let mut text = String::from("syntax = \"proto3\";\n");
        for i in 0..depth {
            text.push_str(&format!("message M{i} {{\n"));
            for j in 0..width {
                text.push_str(&format!("  M{i} f{j} = {};\n", j + 1));
            }
        }
        text.push_str("string order_id = 100;\n");
        for _ in 0..depth {
            text.push('}');
        }
        text
    })
}

fn schema_input(avro: bool, text: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![if avro { 0 } else { 1 }];
    let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
    bytes.extend(len.to_le_bytes());
    bytes.extend(&text.as_bytes()[..usize::from(len)]);
    bytes.extend(body);
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_registry_schema_is_read_or_refused_within_its_limits(
        avro in avro_schema(),
        proto in proto_schema(),
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        targets::registry_schema(&schema_input(true, &avro, &body));
        targets::registry_schema(&schema_input(false, &proto, &body));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn every_event_ends_as_rows_or_dead_letters(bytes in event()) {
        targets::esm_event(&bytes);
    }

    #[test]
    fn every_record_value_ends_as_a_row_or_a_dead_letter(
        selector in any::<u8>(), ts in any::<i64>(), value in value_bytes()
    ) {
        let mut bytes = vec![selector];
        bytes.extend(ts.to_le_bytes());
        bytes.extend(value);
        targets::record_value(&bytes);
    }

    #[test]
    fn every_spec_is_refused_with_a_place_or_usable(text in spec_text()) {
        targets::pipeline_spec(&text);
    }
}

/// Every input the coverage-guided fuzzers found (and the seeds), replayed.
#[test]
fn fuzz_findings_stay_fixed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut n = 0;
    for (target, check) in [
        ("esm_event", targets::esm_event as fn(&[u8])),
        ("record_value", targets::record_value),
        ("pipeline_spec", |b: &[u8]| {
            if let Ok(t) = std::str::from_utf8(b) {
                targets::pipeline_spec(t)
            }
        }),
        ("registry_schema", targets::registry_schema),
    ] {
        let Ok(dir) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in dir.flatten() {
            let bytes = std::fs::read(entry.path()).expect("finding");
            check(&bytes);
            n += 1;
        }
    }
    assert!(
        n > 0,
        "fuzz/regressions holds the fuzzers' findings and seeds"
    );
}

/// The poison pill that once panicked ingest, through the fuzz target.
#[test]
fn the_epoch_poison_pill_is_a_dead_letter() {
    let mut bytes = vec![0u8]; // orders, no key
    bytes.extend(1_795_946_400_000i64.to_le_bytes());
    bytes.extend(br#"{"order_id":"o","amount":1,"created_at":8300000000000000}"#);
    targets::record_value(&bytes);
}

/// The registry topics' seeds are real records: they land in their tables, not as dead letters
/// (so the fuzzers start from bodies that reach the column mapping).
#[test]
fn the_registry_seeds_land_as_rows() {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/record_value");
    for (seed, table) in [
        ("seed-avro-order", "orders_avro"),
        ("seed-protobuf-order", "orders_proto"),
    ] {
        let bytes = std::fs::read(root.join(seed)).expect("seed");
        let tables = targets::record_value_tables(&bytes);
        assert!(
            tables.contains(table) && !tables.contains("dead_letters"),
            "{seed}: {tables:?}"
        );
    }
}
