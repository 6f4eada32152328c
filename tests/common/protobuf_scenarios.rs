//! Protobuf topics behind a schema registry, with records serialized by Google's protobuf library
//! from `protoc`-compiled classes and framed as the Confluent and Glue serializers frame them
//! (`tests/py/proto_records.py`); read back through pyiceberg and DuckDB after each step.

use serde_json::{Value, json};

use super::Harness;
use super::format_scenarios::{
    Framing, T0, business, dead_letters, land, records, registry_url, row, run_producer, spec_in,
    ts,
};

/// The producers' first schema: a nested message, an enum, a well-known timestamp, a repeated
/// field the table does not take, and a second top-level message before it (so the message
/// indexes matter).
const PROTO_V1: &str = r#"
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Refund { string refund_id = 1; }

message Order {
  message Customer { string id = 1; string tier = 2; }
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  string order_id = 1;
  Customer customer = 2;
  string amount = 3;
  int32 qty = 4;
  Status status = 5;
  google.protobuf.Timestamp created_at = 6;
  repeated string tags = 7;
}
"#;

/// The next version: a new optional field.
fn proto_v2() -> String {
    PROTO_V1.replace(
        "  repeated string tags = 7;\n",
        "  repeated string tags = 7;\n  optional string coupon = 8;\n",
    )
}

fn order(n: i64, customer: Option<&str>, amount: &str, coupon: Option<&str>) -> Value {
    let at = chrono::DateTime::from_timestamp_millis(T0 + n)
        .expect("time")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut v = json!({
        "order_id": format!("o{n}"), "amount": amount, "qty": n, "status": "PAID",
        "created_at": at, "tags": ["a"],
    });
    if let Some(c) = customer {
        v["customer"] = json!({"id": c, "tier": "gold"});
    }
    if let Some(c) = coupon {
        v["coupon"] = json!(c);
    }
    v
}

fn produce(proto: &str, records: &[Value], framing: &Framing<'_>) -> Vec<Vec<u8>> {
    run_producer(
        "proto_records.py",
        &["--proto", proto, "--message", "shop.Order"],
        records,
        framing,
    )
}

/// Protobuf records of two schema versions (and, with `glue`, Glue-framed records plain and
/// zlib) land with their values; bad values are dead letters with reasons; the table evolves.
pub async fn protobuf_records_land_and_evolve(h: &Harness, glue: Option<&str>) {
    let url = registry_url();
    let topic = format!("orders-{}", uuid::Uuid::new_v4().simple());
    let subject = format!("{topic}-value");
    let confluent = Framing::Confluent {
        url: &url,
        subject: &subject,
    };
    let v1 = spec_in(&url, &topic, "", "protobuf");
    let mut values = produce(
        PROTO_V1,
        &[
            order(1, Some("c1"), "19.99", None),
            order(2, None, "-5.00", None),
        ],
        &confluent,
    );
    if let Some(registry) = glue {
        let target = format!("{registry}:{topic}");
        values.extend(produce(
            PROTO_V1,
            &[order(3, Some("c3"), "0.01", None)],
            &Framing::Glue {
                target: &target,
                zlib: false,
            },
        ));
        values.extend(produce(
            PROTO_V1,
            &[order(4, Some("c4"), "123456789.10", None)],
            &Framing::Glue {
                target: &target,
                zlib: true,
            },
        ));
    }
    let good = values.len() as i64;
    // An id the registry never issued, and a cut-off body.
    let mut unknown = vec![0u8, 0x7f, 0xff, 0xff, 0xf0];
    unknown.extend_from_slice(&values[0][5..]);
    let cut = values[0][..values[0].len() - 4].to_vec();
    values.extend([unknown, cut]);
    land(h, &v1, &records(&topic, 0, values)).await;

    let mut expected = vec![
        row(&["o1", "c1", "19.99", "1", "PAID", &ts(1)]),
        row(&["o2", "NULL", "-5.00", "2", "PAID", &ts(2)]),
    ];
    if glue.is_some() {
        expected.push(row(&["o3", "c3", "0.01", "3", "PAID", &ts(3)]));
        expected.push(row(&["o4", "c4", "123456789.10", "4", "PAID", &ts(4)]));
    }
    assert_eq!(business(h, None, 6), expected);
    let dead = dead_letters(h);
    let kinds: Vec<(i64, &str)> = dead.iter().map(|d| (d.0, d.1.as_str())).collect();
    assert_eq!(
        kinds,
        [(good, "unknown_schema"), (good + 1, "schema_mismatch")],
        "{dead:?}"
    );
    let s1 = h.read_external("pyiceberg", "orders")["current_snapshot_id"]
        .as_i64()
        .expect("snapshot");

    // v2 adds an optional field; the spec takes it. v1 records still arriving read it as NULL.
    let v2 = spec_in(
        &url,
        &topic,
        r#"{ name = "coupon", type = "string" },"#,
        "protobuf",
    );
    let mut values = produce(
        &proto_v2(),
        &[order(10, Some("c10"), "1.50", Some("XMAS"))],
        &confluent,
    );
    values.extend(produce(
        PROTO_V1,
        &[order(11, Some("c11"), "2.50", None)],
        &confluent,
    ));
    land(h, &v2, &records(&topic, good + 2, values)).await;
    let mut all: Vec<Vec<String>> = expected
        .iter()
        .map(|r| [r.clone(), vec!["NULL".to_string()]].concat())
        .collect();
    all.push(row(&["o10", "c10", "1.50", "10", "PAID", &ts(10), "XMAS"]));
    all.push(row(&["o11", "c11", "2.50", "11", "PAID", &ts(11), "NULL"]));
    all.sort();
    assert_eq!(business(h, None, 7), all);
    assert_eq!(
        h.read_external("duckdb", "orders")["count"],
        all.len() as i64
    );
    assert_eq!(
        h.read_external_at("pyiceberg", "orders", Some(s1))["count"],
        expected.len() as i64
    );
}
