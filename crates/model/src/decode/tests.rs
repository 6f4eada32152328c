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
    let spec =
        PipelineSpec::parse(SPEC, Path::new("test.toml"), &crate::spec::NoSql).expect("valid");
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

mod structs {
    use std::sync::Arc;

    use arrow_array::{Array, Int64Array, StringArray, StructArray};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::kafka::RecordMeta;
    use crate::schema::TableLayout;

    const SPEC: &str = r#"
[[tables]]
name = "t"
topic = "t"
columns = [
  { name = "id", type = "string", required = true },
  { name = "c", type = "struct", path = "$.customer", fields = [
      { name = "name", type = "string" },
      { name = "geo", type = "struct", fields = [{ name = "zip", type = "long" }] },
  ] },
]
"#;

    /// A customer object: absent, null, or an object with each field absent, null or set.
    fn customer() -> impl Strategy<Value = Option<Value>> {
        let field = |v: BoxedStrategy<Value>| {
            prop_oneof![Just(None), Just(Some(Value::Null)), v.prop_map(Some)]
        };
        let name = field("[a-z]{0,4}".prop_map(Value::from).boxed());
        let zip = field(any::<i64>().prop_map(Value::from).boxed());
        let geo = field(
            zip.prop_map(|z| {
                let mut o = serde_json::Map::new();
                if let Some(z) = z {
                    o.insert("zip".into(), z);
                }
                Value::Object(o)
            })
            .boxed(),
        );
        prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            (name, geo).prop_map(|(n, g)| {
                let mut o = serde_json::Map::new();
                if let Some(n) = n {
                    o.insert("name".into(), n);
                }
                if let Some(g) = g {
                    o.insert("geo".into(), g);
                }
                Some(Value::Object(o))
            }),
        ]
    }

    proptest! {
        /// Every row's struct, and the struct inside it, is NULL exactly when none of its
        /// fields has a value, and each field holds what the record said.
        #[test]
        fn struct_columns_hold_what_each_record_says(customers in proptest::collection::vec(customer(), 1..40)) {
            let spec = PipelineSpec::parse(SPEC, Path::new("t.toml"), &crate::spec::NoSql).expect("spec");
            let table = &spec.tables[0];
            let layout = Arc::new(TableLayout::for_table(table).expect("layout"));
            let decoder = RecordDecoder::new(table);
            let mut rows = RowBuilder::new(table, layout, customers.len()).expect("builder");
            let texts: Vec<String> = customers
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut v = json!({"id": i.to_string()});
                    if let Some(c) = c {
                        v["customer"] = c.clone();
                    }
                    v.to_string()
                })
                .collect();
            for (i, text) in texts.iter().enumerate() {
                let cells = decoder.decode(text).expect("decodes");
                rows.append(&cells, RecordMeta { partition: 0, offset: i as i64, timestamp_us: 0, key: None, headers: &[] });
            }
            let batch = rows.finish().expect("batch");
            let c = batch.column(1).as_any().downcast_ref::<StructArray>().expect("struct");
            let name = c.column(0).as_any().downcast_ref::<StringArray>().expect("name");
            let geo = c.column(1).as_any().downcast_ref::<StructArray>().expect("geo");
            let zip = geo.column(0).as_any().downcast_ref::<Int64Array>().expect("zip");
            for (i, cust) in customers.iter().enumerate() {
                let want_name = cust.as_ref().and_then(|c| c.get("name")).and_then(Value::as_str);
                let want_zip = cust.as_ref().and_then(|c| c.get("geo")).and_then(|g| g.get("zip")).and_then(Value::as_i64);
                prop_assert_eq!(name.is_valid(i).then(|| name.value(i)), want_name);
                prop_assert_eq!(zip.is_valid(i).then(|| zip.value(i)), want_zip);
                prop_assert_eq!(geo.is_valid(i), want_zip.is_some());
                prop_assert_eq!(c.is_valid(i), want_name.is_some() || want_zip.is_some());
            }
        }
    }
}

/// The records' headers in `kafka_headers`, after the other Kafka columns.
mod headers {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::{Array, RecordBatch};

    use super::*;
    use crate::esm::EsmHeader;
    use crate::kafka::{self, RecordMeta};
    use crate::schema::TableLayout;
    use crate::spec::TableSpec;

    /// A table with a struct column (its fields' ids come before the headers' nested ones).
    fn table(headers: bool) -> TableSpec {
        let text = format!(
            r#"
[[tables]]
name = "t"
topic = "t"
kafka_headers = {headers}
columns = [
  {{ name = "id", type = "string", required = true }},
  {{ name = "c", type = "struct", path = "$.customer", fields = [{{ name = "name", type = "string" }}] }},
]
"#
        );
        PipelineSpec::parse(&text, Path::new("t.toml"), &crate::spec::NoSql)
            .expect("spec")
            .tables
            .remove(0)
    }

    fn header(key: &str, value: Option<&[u8]>) -> EsmHeader {
        EsmHeader {
            key: key.into(),
            value: value.map(<[u8]>::to_vec),
        }
    }

    /// The rows of `records` (JSON value, headers) for `table`, written with `layout`.
    fn batch(
        table: &TableSpec,
        layout: TableLayout,
        records: &[(&str, Vec<EsmHeader>)],
    ) -> RecordBatch {
        let decoder = RecordDecoder::new(table);
        let mut rows = RowBuilder::new(table, Arc::new(layout), records.len()).expect("builder");
        for (i, (json, headers)) in records.iter().enumerate() {
            let cells = decoder.decode(json).expect("decodes");
            rows.append(
                &cells,
                RecordMeta {
                    partition: 0,
                    offset: i as i64,
                    timestamp_us: 0,
                    key: None,
                    headers,
                },
            );
        }
        rows.finish().expect("batch")
    }

    /// Each row's headers: `None` for NULL, else (key, value) in order.
    type Headers = Option<Vec<(String, Option<Vec<u8>>)>>;

    fn headers_of(batch: &RecordBatch) -> Vec<Headers> {
        let list = batch
            .column_by_name(kafka::HEADERS)
            .expect("kafka_headers")
            .as_list::<i32>();
        (0..list.len())
            .map(|i| {
                list.is_valid(i).then(|| {
                    let entries = list.value(i);
                    let entries = entries.as_struct();
                    let keys = entries.column(0).as_string::<i32>();
                    let values = entries.column(1).as_binary::<i64>();
                    (0..entries.len())
                        .map(|j| {
                            let value = values.is_valid(j).then(|| values.value(j).to_vec());
                            (keys.value(j).to_string(), value)
                        })
                        .collect()
                })
            })
            .collect()
    }

    fn records() -> Vec<(&'static str, Vec<EsmHeader>)> {
        vec![
            (
                r#"{"id": "1", "customer": {"name": "x"}}"#,
                vec![
                    header("trace", Some(b"a")),
                    header("trace", Some(b"b")),
                    header("flag", None),
                    header("trace", Some(b"")),
                ],
            ),
            (r#"{"id": "2"}"#, vec![]),
            (r#"{"id": "3"}"#, vec![header("source", Some(b"web"))]),
        ]
    }

    #[test]
    fn a_batch_carries_each_records_headers_in_order() {
        let t = table(true);
        let layout = TableLayout::for_table(&t).expect("layout");
        let b = batch(&t, layout, &records());
        let names: Vec<&str> = b
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names[2..7], kafka::NAMES);
        assert_eq!(names[7..], [kafka::HEADERS]);
        let h = |k: &str, v: Option<&[u8]>| (k.to_string(), v.map(<[u8]>::to_vec));
        assert_eq!(
            headers_of(&b),
            [
                // Repeated keys in the record's order; a header without a value has NULL.
                Some(vec![
                    h("trace", Some(b"a")),
                    h("trace", Some(b"b")),
                    h("flag", None),
                    h("trace", Some(b"")),
                ]),
                // No headers: an empty list, not NULL.
                Some(vec![]),
                Some(vec![h("source", Some(b"web"))]),
            ]
        );
        // The business columns are still assembled in front of the Kafka columns.
        let c = b.column(1).as_struct();
        assert!(c.is_valid(0) && !c.is_valid(1));
        assert_eq!(
            b.column_by_name(kafka::OFFSET)
                .expect("offset")
                .as_primitive::<arrow_array::types::Int64Type>()
                .values(),
            &[0, 1, 2]
        );
    }

    #[test]
    fn a_table_without_the_option_has_no_headers_column() {
        let t = table(false);
        let layout = TableLayout::for_table(&t).expect("layout");
        assert!(!layout.has_headers());
        let b = batch(&t, layout, &records());
        assert_eq!(b.num_columns(), 2 + kafka::COLUMNS.len());
        assert!(b.column_by_name(kafka::HEADERS).is_none());
    }

    #[test]
    fn a_table_that_kept_the_column_gets_null_once_the_option_is_off() {
        // The catalog's table has the column; the spec no longer asks for it.
        let kept = TableLayout::for_table(&table(true)).expect("layout");
        let off = table(false);
        let spec_layout = TableLayout::for_table(&off).expect("layout");
        assert!(kept.fits(&spec_layout) && !kept.same_shape(&spec_layout));
        assert!(!spec_layout.fits(&kept));
        let b = batch(&off, kept, &records());
        assert_eq!(headers_of(&b), [None, None, None]);
    }
}

#[test]
fn a_json_topic_says_when_its_values_look_registry_framed() {
    let spec =
        PipelineSpec::parse(SPEC, Path::new("test.toml"), &crate::spec::NoSql).expect("valid");
    let json = Decoder::new(&spec.tables[0]);
    let mut scratch = Vec::new();
    // An Avro value behind a Confluent header (magic 0, schema id 1), and behind Glue's.
    let confluent = [0u8, 0, 0, 0, 1, 2, b'x', 0xff];
    let e = json
        .decode(&confluent, &mut scratch, 1 << 20)
        .expect_err("not JSON");
    assert_eq!(e.kind, RejectKind::NotJson);
    assert!(
        e.message.contains("schema id 1") && e.message.contains("set format = \"avro\""),
        "{}",
        e.message
    );
    let mut glue = vec![3u8, 0];
    glue.extend([7u8; 16]);
    glue.extend(b"body");
    let e = json
        .decode(&glue, &mut scratch, 1 << 20)
        .expect_err("not JSON");
    assert!(
        e.message.contains("Glue Schema Registry header"),
        "{}",
        e.message
    );
    assert!(debezium::change(&confluent).is_err_and(|e| e.message.contains("registry-framed")));
    // A JSON Schema serializer's framing (JSON behind the header): not told to use Avro.
    let mut json_schema = vec![0u8, 0, 0, 0, 9];
    json_schema.extend(br#"{"order_id":"o-1"}"#);
    let e = json
        .decode(&json_schema, &mut scratch, 1 << 20)
        .expect_err("framed");
    assert!(
        e.message.contains("JSON Schema serializer") && !e.message.contains("\"avro\""),
        "{}",
        e.message
    );
    // Plain bytes that are not UTF-8 stay what they were.
    let e = json
        .decode(&[b'{', 0xff, b'}'], &mut scratch, 1 << 20)
        .expect_err("not UTF-8");
    assert_eq!(e.kind, RejectKind::InvalidUtf8);
}
