//! The framing and the column mapping on messages encoded here by prost-reflect. Messages
//! written by Python's `protobuf` (from `protoc`-compiled classes) are read in
//! `tests/formats_*.rs`.

use std::path::Path;

use prost::Message;

use super::*;
use crate::spec::PipelineSpec;

const PROTO: &str = r#"
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Other { string x = 1; }

message Order {
  message Customer { string id = 1; string tier = 2; }
  enum Status { NEW = 0; PAID = 1; }
  string order_id = 1;
  Customer customer = 2;
  string amount = 3;
  int32 qty = 4;
  Status status = 5;
  google.protobuf.Timestamp created_at = 6;
  optional string coupon = 7;
  repeated string tags = 8;
}
"#;

const SPEC: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
format = "protobuf"
columns = [
  { name = "order_id",    type = "string",        required = true },
  { name = "customer_id", type = "string",        path = "$.customer.id" },
  { name = "amount",      type = "decimal(18,2)", required = true },
  { name = "qty",         type = "long" },
  { name = "status",      type = "string" },
  { name = "created_at",  type = "timestamp",     required = true },
  { name = "coupon",      type = "string" },
]
"#;

fn decoder() -> ProtobufDecoder {
    let spec = PipelineSpec::parse(SPEC, Path::new("t.toml"), &crate::spec::NoSql).expect("spec");
    let d = ProtobufDecoder::new(&spec.tables[0]);
    d.add_schema(SchemaId::Confluent(5), "PROTOBUF", PROTO);
    d
}

fn order(customer: Option<&str>, coupon: Option<&str>) -> Vec<u8> {
    let compiled = compile(PROTO).expect("compiles");
    let desc = compiled.top[1].clone();
    let mut m = DynamicMessage::new(desc.clone());
    m.set_field_by_name("order_id", Value::String("o-1".into()));
    if let Some(c) = customer {
        let cdesc = desc.child_messages().next().expect("Customer");
        let mut cm = DynamicMessage::new(cdesc);
        cm.set_field_by_name("id", Value::String(c.into()));
        m.set_field_by_name("customer", Value::Message(cm));
    }
    m.set_field_by_name("amount", Value::String("19.99".into()));
    m.set_field_by_name("status", Value::EnumNumber(1));
    let ts_desc = desc
        .get_field_by_name("created_at")
        .and_then(|f| f.kind().as_message().cloned())
        .expect("Timestamp");
    let mut ts = DynamicMessage::new(ts_desc);
    ts.set_field_by_name("seconds", Value::I64(1_795_946_400));
    ts.set_field_by_name("nanos", Value::I32(123_456_000));
    m.set_field_by_name("created_at", Value::Message(ts));
    if let Some(c) = coupon {
        m.set_field_by_name("coupon", Value::String(c.into()));
    }
    m.encode_to_vec()
}

/// Confluent framing: magic, id, message indexes [1] (the second top-level message).
fn confluent(body: &[u8]) -> Vec<u8> {
    let mut v = vec![0, 0, 0, 0, 5, 2, 2];
    v.extend_from_slice(body);
    v
}

fn decode(value: &[u8]) -> Result<Vec<Cell<'static>>, Rejection> {
    let mut scratch = Vec::new();
    let d = decoder();
    let cells = d.decode(value, &mut scratch, 1 << 20)?;
    Ok(cells
        .into_iter()
        .map(|c| match c {
            Cell::Str(s) => Cell::Str(Cow::Owned(s.into_owned())),
            Cell::Null => Cell::Null,
            Cell::Int(v) => Cell::Int(v),
            Cell::Long(v) => Cell::Long(v),
            Cell::Float(v) => Cell::Float(v),
            Cell::Double(v) => Cell::Double(v),
            Cell::Bool(v) => Cell::Bool(v),
            Cell::Date(v) => Cell::Date(v),
            Cell::Timestamp(v) => Cell::Timestamp(v),
            Cell::Decimal(v) => Cell::Decimal(v),
        })
        .collect())
}

#[test]
fn reads_nested_fields_enums_timestamps_defaults_and_presence() {
    let cells = decode(&confluent(&order(Some("c-9"), Some("XMAS")))).expect("decodes");
    assert_eq!(cells[0], Cell::Str("o-1".into()));
    assert_eq!(cells[1], Cell::Str("c-9".into()));
    assert_eq!(cells[2], Cell::Decimal(1999));
    // qty was not set: proto3's default, as every reader sees it.
    assert_eq!(cells[3], Cell::Long(0));
    assert_eq!(cells[4], Cell::Str("PAID".into()));
    assert_eq!(cells[5], Cell::Timestamp(1_795_946_400_123_456));
    assert_eq!(cells[6], Cell::Str("XMAS".into()));
    // An unset message field and an unset `optional` field are NULL.
    let cells = decode(&confluent(&order(None, None))).expect("decodes");
    assert_eq!(cells[1], Cell::Null);
    assert_eq!(cells[6], Cell::Null);
}

#[test]
fn glue_framing_picks_the_message_by_sorted_index() {
    let d = decoder();
    let uuid = uuid::Uuid::from_u128(7);
    d.add_schema(SchemaId::Glue(uuid), "PROTOBUF", PROTO);
    // Sorted full names: shop.Order (0), shop.Order.Customer (1), shop.Other (2).
    let mut v = vec![3, 0];
    v.extend_from_slice(uuid.as_bytes());
    v.push(0);
    v.extend_from_slice(&order(Some("c"), None));
    let mut scratch = Vec::new();
    let cells = d.decode(&v, &mut scratch, 1 << 20).expect("decodes");
    assert_eq!(cells[1], Cell::Str("c".into()));
}

#[test]
fn every_bad_value_is_a_rejection_with_a_reason() {
    let good = order(Some("c"), None);
    let mut other_message = vec![0, 0, 0, 0, 5, 0];
    other_message.extend_from_slice(&good);
    for (value, kind, says) in [
        (
            b"{}".to_vec(),
            RejectKind::NoSchemaId,
            "no schema registry header",
        ),
        (
            [vec![0, 0, 0, 0, 6, 0], good.clone()].concat(),
            RejectKind::UnknownSchema,
            "schema id 6",
        ),
        (
            [vec![0, 0, 0, 0, 5, 2, 40], good.clone()].concat(),
            RejectKind::SchemaMismatch,
            "message indexes [20]",
        ),
        (
            confluent(&good[..good.len() - 3]),
            RejectKind::SchemaMismatch,
            "does not decode",
        ),
        // Index [0] is shop.Other: its fields are not the table's, so order_id is missing.
        (other_message, RejectKind::MissingField, "order_id"),
    ] {
        let r = decode(&value).expect_err("rejected");
        assert_eq!(r.kind, kind, "{}", r.message);
        assert!(r.message.contains(says), "{}", r.message);
    }
    let d = decoder();
    d.add_schema(SchemaId::Confluent(9), "AVRO", "\"string\"");
    d.add_schema(
        SchemaId::Confluent(10),
        "PROTOBUF",
        "syntax = \"proto3\"; message {",
    );
    let mut scratch = Vec::new();
    for id in [9u8, 10] {
        let r = d
            .decode(&[0, 0, 0, 0, id, 0, 10, 1, b'x'], &mut scratch, 1 << 20)
            .expect_err("unusable schema");
        assert_eq!(r.kind, RejectKind::UnknownSchema, "{}", r.message);
    }
}

proptest::proptest! {
    /// No payload makes the decoder panic.
    #[test]
    fn any_bytes_decode_or_are_rejected(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
        let _ = decode(&confluent(&body));
    }
}

#[test]
fn values_convert_to_columns_exactly_or_are_refused() {
    use ColumnType as C;
    let k = Kind::Double;
    let cell = |v: Value, kind: &Kind, col: ColumnType| to_cell(&v, kind, col);
    assert!(matches!(cell(Value::F64(1.5), &k, C::Float), Ok(Cell::Float(f)) if f == 1.5));
    assert!(matches!(
        cell(Value::F64(1e300), &k, C::Float),
        Err(CellError::Value(RejectKind::OutOfRange, _))
    ));
    assert!(matches!(
        cell(Value::F64(f64::NAN), &k, C::Double),
        Err(CellError::Value(RejectKind::OutOfRange, _))
    ));
    assert!(matches!(
        cell(Value::U64(u64::MAX), &Kind::Uint64, C::Long),
        Err(CellError::Value(RejectKind::OutOfRange, _))
    ));
    assert!(matches!(
        cell(
            Value::I64(7),
            &Kind::Int64,
            C::Decimal {
                precision: 4,
                scale: 2
            }
        ),
        Ok(Cell::Decimal(700))
    ));
    assert!(matches!(
        cell(
            Value::I64(700),
            &Kind::Int64,
            C::Decimal {
                precision: 4,
                scale: 2
            }
        ),
        Err(CellError::Value(RejectKind::OutOfRange, _))
    ));
    assert!(matches!(
        cell(Value::Bool(true), &Kind::Bool, C::String),
        Err(CellError::Wrong(_))
    ));
    assert!(matches!(
        cell(Value::I64(1_795_946_400_000), &Kind::Int64, C::Timestamp),
        Ok(Cell::Timestamp(1_795_946_400_000_000))
    ));
}

/// A `.proto` nested 3,000 messages deep overflowed the compiler's stack and aborted the
/// process; it is refused by its nesting before the compiler sees it, as an unknown schema.
#[test]
fn a_proto_nested_thousands_deep_is_an_unknown_schema_not_a_crash() {
    let mut text = String::from("syntax = \"proto3\";\n");
    for i in 0..3_000 {
        text.push_str(&format!("message M{i} {{\n"));
    }
    text.push_str("string order_id = 1;\n");
    for _ in 0..3_000 {
        text.push('}');
    }
    let Err(e) = compile(&text) else {
        panic!("a .proto nested 3,000 deep compiled")
    };
    assert!(e.contains("more than 64 levels deep (the limit)"), "{e}");
    let d = decoder();
    d.add_schema(SchemaId::Confluent(11), "PROTOBUF", &text);
    let mut scratch = Vec::new();
    let r = d
        .decode(&[0, 0, 0, 0, 11, 0, 10, 1, b'x'], &mut scratch, 1 << 20)
        .expect_err("unusable schema");
    assert_eq!(r.kind, RejectKind::UnknownSchema, "{}", r.message);
    // Braces inside strings and comments do not count; the shipped test schema compiles.
    assert!(check_limits("// {{{{\n/* {{{{ */ option x = \"{{{{\";").is_ok());
    assert!(compile(PROTO).is_ok());
    // An octal literal with an 8 in it is refused (the compiler's lexer asserts otherwise in
    // debug builds; a fuzzer found it), decimals and floats with zeros are not.
    let Err(e) = compile("syntax = \"proto3\";\nmessage M { string a = 0128; }") else {
        panic!("an octal 0128 compiled")
    };
    assert!(e.contains("octal"), "{e}");
    assert!(check_limits("option x = 0.89; option y = 10089; option z = 017; f09 = 1;").is_ok());
    assert!(
        check_limits("option x = 1e-09; option y = 2.5E+08; option z = 0x89; w = -010;").is_ok()
    );
    assert!(check_limits("option x = -089;").is_err());
    // Numbers are cut where the compiler cuts them: after an identifier a sign is no
    // exponent's, and after a float's `f` a number begins (the fuzzer's `N6-048`, `86F009`).
    for hidden in ["N6-048", "x6e-048", "a+09", "_e-08", "86F009", "1.5f09"] {
        assert!(check_limits(hidden).is_err(), "{hidden}");
    }
    assert!(check_limits("option x = 6e-048; option y = .5e-09; option z = 1.0E+09;").is_ok());
    assert!(
        check_limits("a = 017f09; b = 089.5; c = 0089e1; d = a.09; e = 12F; g = 0f; h = 0x1.09;")
            .is_ok()
    );
    // A `#` comment (a line comment to the compiler) cannot hide nesting behind a `/*`, and a
    // comment's `}` cannot cancel code's `{`: opening brackets count wherever they are.
    let mut hash = String::from("syntax = \"proto2\";\noption (opt) = { # /*\n");
    hash.push_str(&"a { ".repeat(200));
    hash.push_str(&"}".repeat(200));
    hash.push_str(";\n");
    assert!(check_limits(&hash).is_err());
    let mut cancel = String::from("syntax = \"proto3\";\n");
    cancel.push_str(&"message a { // }\n".repeat(100));
    assert!(check_limits(&cancel).is_err());
    // A balanced example in a comment is no nesting.
    let doc = format!(
        "syntax = \"proto3\";\n{}message A {{}}",
        "// e.g. {\"a\": {\"b\": 1}}\n".repeat(500)
    );
    assert!(check_limits(&doc).is_ok());
    // A custom option's value in text format nests with < >.
    let mut angle = String::from(
        "syntax = \"proto2\";\nimport \"google/protobuf/descriptor.proto\";\nmessage R { optional R a = 1; }\nextend google.protobuf.FileOptions { optional R opt = 50000; }\noption (opt) = { ",
    );
    angle.push_str(&"a <".repeat(1_000));
    angle.push_str(&">".repeat(1_000));
    angle.push_str(" };\n");
    let Err(e) = compile(&angle) else {
        panic!("an option nested 1,000 deep with <> compiled")
    };
    assert!(e.contains("(the limit)"), "{e}");
    // A string left open at the end of its line ends there, as the compiler reads it: what
    // follows on the next lines is counted.
    let mut open = String::from("syntax = \"proto3\";\noption java_package = \"x\n");
    open.push_str(&"message A {\n".repeat(5_000));
    open.push_str(&"}".repeat(5_000));
    open.push_str("\n\"");
    let Err(e) = compile(&open) else {
        panic!("a .proto nested 5,000 deep behind an open string compiled")
    };
    assert!(e.contains("(the limit)"), "{e}");
}
