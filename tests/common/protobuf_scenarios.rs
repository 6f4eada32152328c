//! Protobuf topics behind a schema registry, with records serialized by Google's protobuf library
//! from `protoc`-compiled classes and framed as the Confluent and Glue serializers frame them
//! (`tests/py/proto_records.py`); the scenario is the Avro one's (`land_and_evolve`).

use serde_json::{Value, json};

use super::Harness;
use super::format_scenarios::{FormatCase, Framing, T0, land_and_evolve, run_producer};

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

/// Protobuf records serialized by Google's library: [`land_and_evolve`].
pub async fn protobuf_records_land_and_evolve(h: &Harness, glue: Option<&str>) {
    let produce = |version: u8, records: &[Value], framing: &Framing<'_>| {
        let proto = if version == 1 {
            PROTO_V1.to_string()
        } else {
            proto_v2()
        };
        run_producer(
            "proto_records.py",
            &["--proto", &proto, "--message", "shop.Order"],
            records,
            framing,
        )
    };
    let case = FormatCase {
        format: "protobuf",
        produce: &produce,
        order,
        foreign: Vec::new(),
    };
    land_and_evolve(h, glue, &case).await;
}
