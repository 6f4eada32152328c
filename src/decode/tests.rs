use std::borrow::Cow;
use std::path::Path;

use super::*;
use crate::spec::PipelineSpec;

const SPEC: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "customer_id", type = "string", path = "$.customer.id" },
  { name = "tier", type = "string", path = "$.customer['loyalty tier']" },
  { name = "amount", type = "decimal(18,2)", required = true },
  { name = "qty", type = "int" },
  { name = "created_at", type = "timestamp", required = true },
]
"#;

fn decoder() -> RecordDecoder {
    let spec = PipelineSpec::parse(SPEC, Path::new("test.toml")).expect("valid");
    RecordDecoder::new(&spec.tables[0])
}

fn kind(json: &str) -> RejectKind {
    decoder().decode(json).expect_err("should be rejected").kind
}

#[test]
fn picks_nested_paths_and_ignores_unknown_fields() {
    let d = decoder();
    let json = r#"{"extra":[1,{"x":2}],"order_id":"o-1","customer":{"id":"c-9","loyalty tier":"gold","n":1},
        "amount":"19.99","qty":3,"created_at":"2026-11-29T10:00:00Z","more":null}"#;
    let cells = d.decode(json).expect("decodes");
    assert_eq!(cells[0], Cell::Str(Cow::Borrowed("o-1")));
    assert_eq!(cells[1], Cell::Str(Cow::Borrowed("c-9")));
    assert_eq!(cells[2], Cell::Str(Cow::Borrowed("gold")));
    assert_eq!(cells[3], Cell::Decimal(1999));
    assert_eq!(cells[4], Cell::Int(3));
    assert_eq!(cells[5], Cell::Timestamp(1_795_946_400_000_000));
}

#[test]
fn optional_columns_may_be_absent_or_null() {
    let d = decoder();
    let cells = d
        .decode(
            r#"{"order_id":"o","amount":1,"created_at":1795946400000,"customer":null,"qty":null}"#,
        )
        .expect("decodes");
    assert_eq!(cells[1], Cell::Null);
    assert_eq!(cells[2], Cell::Null);
    assert_eq!(cells[4], Cell::Null);
}

#[test]
fn escaped_member_names_still_match() {
    let cells = decoder()
        .decode(r#"{"order\u005fid":"o","amount":1,"created_at":0}"#)
        .expect("decodes");
    assert_eq!(cells[0], Cell::Str(Cow::Borrowed("o")));
}

#[test]
fn each_bad_value_has_its_kind() {
    assert_eq!(
        kind(r#"{"order_id":"o","amount":1}"#),
        RejectKind::MissingField
    );
    assert_eq!(
        kind(r#"{"order_id":null,"amount":1,"created_at":0}"#),
        RejectKind::MissingField
    );
    assert_eq!(
        kind(r#"{"order_id":7,"amount":1,"created_at":0}"#),
        RejectKind::WrongType
    );
    assert_eq!(
        kind(r#"{"order_id":"o","amount":1,"created_at":"noon"}"#),
        RejectKind::InvalidTimestamp
    );
    assert_eq!(
        kind(r#"{"order_id":"o","amount":1.001,"created_at":0}"#),
        RejectKind::OutOfRange
    );
    assert_eq!(
        kind(r#"{"order_id":"o","amount":1,"qty":1e3,"created_at":0}"#),
        RejectKind::WrongType
    );
    assert_eq!(
        kind(r#"{"order_id":"o","amount":1,"customer":"c-1","created_at":0}"#),
        RejectKind::WrongType
    );
    assert_eq!(
        kind(r#"{"order_id":"o","amount":1,"created_at":0"#),
        RejectKind::NotJson
    );
    assert_eq!(
        kind(r#"{"order_id":"o","amount":1,"created_at":0} trailing"#),
        RejectKind::NotJson
    );
    assert_eq!(kind("not json"), RejectKind::NotJson);
    assert_eq!(kind("[1,2]"), RejectKind::NotAnObject);
    assert_eq!(kind("\"a string\""), RejectKind::NotAnObject);
    assert_eq!(kind("null"), RejectKind::NotAnObject);
    assert_eq!(kind("42"), RejectKind::NotAnObject);
}

#[test]
fn messages_name_the_column_and_path() {
    let err = decoder()
        .decode(r#"{"order_id":"o","amount":true,"created_at":0}"#)
        .expect_err("bool amount");
    assert_eq!(err.kind, RejectKind::WrongType);
    assert!(
        err.message.contains("column amount ($.amount)"),
        "{}",
        err.message
    );
    let err = decoder()
        .decode(r#"{"order_id":"o","amount":1,"created_at":0,"customer":[1]}"#)
        .expect_err("array customer");
    assert!(err.message.contains("$.customer"), "{}", err.message);
    assert!(err.message.contains("customer_id"), "{}", err.message);
}

#[test]
fn reject_kind_names_are_unique_snake_case() {
    let names: std::collections::HashSet<_> = RejectKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(names.len(), RejectKind::ALL.len());
    assert!(names.iter().all(|n| {
        n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    }));
}
