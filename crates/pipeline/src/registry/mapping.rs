//! A table's columns read off a registry schema (`columns = "from-registry"`).
//!
//! Every field whose type a column can hold becomes an optional column named after the field,
//! lowercased; the fields of a nested record (Avro) or message (Protobuf) become columns named
//! `parent_child` whose path descends into it (`$.customer.id`), as Kafka Connect's `Flatten`
//! names them. Fields no column type holds (arrays, maps, bytes, unions of several types) are
//! skipped with the reason, which `streamtable check` prints. Columns are optional whatever the
//! schema says: the registry decides what a writer must send, and an optional column is the one
//! a later version may stop sending without the table refusing it.

use prost_reflect::{Kind, MessageDescriptor};

use crate::decode::avro::schema::{Schema as AvroSchema, Type as AvroType};
use crate::spec::{ColumnSpec, ColumnType, Format, JsonPath, is_identifier};

/// How deep nested records are flattened into columns.
const MAX_DEPTH: usize = 8;
/// Most columns a registry schema may give a table.
pub const MAX_COLUMNS: usize = 1_000;
/// Most fields looked at while flattening one schema (nested records reused as fields multiply
/// them): a schema beyond it is refused naming the limit, never walked without end.
pub const MAX_FIELDS: usize = 10_000;

/// The columns of a registry schema, and the fields left out with why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchemaColumns {
    /// The columns, in the schema's field order (depth first).
    pub columns: Vec<ColumnSpec>,
    /// `field path: reason` for each field that is not a column.
    pub skipped: Vec<String>,
}

/// The columns of `schema` (an Avro schema's JSON or a `.proto` file, as `format` says; of a
/// `.proto` file, `message`'s fields, by default its first message's). `Err` when the schema
/// cannot be read, its root is not a record, or it has no such message.
pub fn of_schema(
    format: Format,
    schema: &str,
    message: Option<&str>,
) -> Result<SchemaColumns, String> {
    let mut out = Collector::default();
    match format {
        Format::Avro => {
            let parsed = AvroSchema::parse(schema)?;
            let AvroType::Record(root) = parsed.root else {
                return Err(format!(
                    "the schema's root is {}, not a record; a table's columns come from a record's fields",
                    parsed.describe(&parsed.root)
                ));
            };
            out.avro_record(&parsed, root, &[], &mut vec![root]);
        }
        Format::Protobuf => {
            let compiled = crate::decode::protobuf::compile(schema)?;
            let message = match message {
                Some(name) => compiled.message(name).ok_or_else(|| {
                    format!(
                        "the .proto file has no message {name:?}; it has {}",
                        compiled.message_names().join(", ")
                    )
                })?,
                None => compiled
                    .first_message()
                    .ok_or("the .proto file defines no message")?,
            };
            out.message(&message, &[], &mut vec![message.full_name().to_string()]);
        }
        Format::Json => {
            return Err("a JSON topic has no registry schema; list its columns".into());
        }
    }
    if out.visited > MAX_FIELDS {
        return Err(format!(
            "flattening the schema's nested records looks at more than {MAX_FIELDS} fields (the limit); give the table a message or record with fewer nested fields, or list its columns"
        ));
    }
    if out.done.columns.len() > MAX_COLUMNS {
        return Err(format!(
            "the schema gives {} columns, more than {MAX_COLUMNS} (the limit); list the table's columns instead",
            out.done.columns.len()
        ));
    }
    Ok(out.done)
}

#[derive(Default)]
struct Collector {
    done: SchemaColumns,
    /// The columns' names (the duplicate check is one look-up, not a scan).
    names: std::collections::HashSet<String>,
    /// Fields looked at; past [`MAX_FIELDS`] the walk stops.
    visited: usize,
}

impl Collector {
    /// Counts one field; `false` once past [`MAX_FIELDS`] (the walk stops).
    fn visit(&mut self) -> bool {
        self.visited += 1;
        self.visited <= MAX_FIELDS && self.done.columns.len() <= MAX_COLUMNS
    }

    fn push(&mut self, path: &[String], ty: Option<ColumnType>, why_not: impl FnOnce() -> String) {
        let shown = path.join(".");
        let Some(column_type) = ty else {
            self.done.skipped.push(format!("{shown}: {}", why_not()));
            return;
        };
        let name = path.join("_").to_lowercase();
        if !is_identifier(&name) {
            self.done.skipped.push(format!(
                "{shown}: {name:?} is not a column name Athena accepts (letters a-z, digits, _)"
            ));
            return;
        }
        if name.starts_with("kafka_") {
            self.done.skipped.push(format!(
                "{shown}: {name:?} is reserved for the Kafka columns streamtable adds"
            ));
            return;
        }
        if !self.names.insert(name.clone()) {
            self.done.skipped.push(format!(
                "{shown}: another field already gives the column {name:?}"
            ));
            return;
        }
        self.done.columns.push(ColumnSpec {
            path: JsonPath(path.to_vec()),
            ..ColumnSpec::optional(&name, column_type)
        });
    }

    fn avro_record(
        &mut self,
        schema: &AvroSchema,
        record: usize,
        prefix: &[String],
        open: &mut Vec<usize>,
    ) {
        let Some(r) = schema.records.get(record) else {
            return;
        };
        for field in &r.fields {
            if !self.visit() {
                return;
            }
            let path: Vec<String> = prefix.iter().cloned().chain([field.name.clone()]).collect();
            // An optional field is a union of null and one type.
            let ty = match &field.ty {
                AvroType::Union(branches) => {
                    let mut other = branches.iter().filter(|b| **b != AvroType::Null);
                    match (other.next(), other.next()) {
                        (Some(t), None) => t,
                        _ => {
                            self.push(&path, None, || {
                                format!(
                                    "a union {} is not one column type",
                                    schema.describe(&field.ty)
                                )
                            });
                            continue;
                        }
                    }
                }
                t => t,
            };
            if let AvroType::Record(inner) = ty {
                if open.contains(inner) || open.len() > MAX_DEPTH {
                    self.push(&path, None, || {
                        "a recursive or too deeply nested record".into()
                    });
                } else {
                    open.push(*inner);
                    self.avro_record(schema, *inner, &path, open);
                    open.pop();
                }
                continue;
            }
            let column = match ty {
                AvroType::Boolean => Some(ColumnType::Boolean),
                AvroType::Int => Some(ColumnType::Int),
                AvroType::Long => Some(ColumnType::Long),
                AvroType::Float => Some(ColumnType::Float),
                AvroType::Double => Some(ColumnType::Double),
                AvroType::String | AvroType::Enum(_) => Some(ColumnType::String),
                AvroType::Date => Some(ColumnType::Date),
                AvroType::TimestampMillis
                | AvroType::TimestampMicros
                | AvroType::TimestampNanos => Some(ColumnType::Timestamp),
                AvroType::TimeOfDay => Some(ColumnType::Long),
                AvroType::Decimal {
                    precision, scale, ..
                } if (1..=38).contains(precision) && scale <= precision => {
                    Some(ColumnType::Decimal {
                        precision: *precision as u8,
                        scale: *scale as u8,
                    })
                }
                _ => None,
            };
            self.push(&path, column, || {
                format!("{} has no column type", schema.describe(ty))
            });
        }
    }

    fn message(&mut self, message: &MessageDescriptor, prefix: &[String], open: &mut Vec<String>) {
        for field in message.fields() {
            if !self.visit() {
                return;
            }
            let path: Vec<String> = prefix
                .iter()
                .cloned()
                .chain([field.name().to_string()])
                .collect();
            if field.is_list() || field.is_map() {
                self.push(&path, None, || {
                    "a repeated or map field has no column type".into()
                });
                continue;
            }
            let column = match field.kind() {
                Kind::Double => Some(ColumnType::Double),
                Kind::Float => Some(ColumnType::Float),
                Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Some(ColumnType::Int),
                Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint32 | Kind::Fixed32 => {
                    Some(ColumnType::Long)
                }
                Kind::Uint64 | Kind::Fixed64 => Some(ColumnType::Decimal {
                    precision: 20,
                    scale: 0,
                }),
                Kind::Bool => Some(ColumnType::Boolean),
                Kind::String | Kind::Enum(_) => Some(ColumnType::String),
                Kind::Bytes => None,
                Kind::Message(m) if m.full_name() == "google.protobuf.Timestamp" => {
                    Some(ColumnType::Timestamp)
                }
                Kind::Message(m) => {
                    let name = m.full_name().to_string();
                    if open.contains(&name) || open.len() > MAX_DEPTH {
                        self.push(&path, None, || {
                            "a recursive or too deeply nested message".into()
                        });
                    } else {
                        open.push(name);
                        self.message(&m, &path, open);
                        open.pop();
                    }
                    continue;
                }
            };
            self.push(&path, column, || "bytes have no column type".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(c: &SchemaColumns) -> Vec<String> {
        c.columns
            .iter()
            .map(|c| format!("{} {} {}", c.name, c.column_type, c.path))
            .collect()
    }

    #[test]
    fn avro_fields_become_optional_columns_and_nested_records_flatten() {
        let schema = r#"{"type": "record", "name": "Order", "fields": [
            {"name": "order_id", "type": "string"},
            {"name": "customer", "type": ["null", {"type": "record", "name": "Customer", "fields": [
                {"name": "id", "type": "string"}, {"name": "Tier", "type": "int"}]}]},
            {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
            {"name": "status", "type": {"type": "enum", "name": "S", "symbols": ["A"]}},
            {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "either", "type": ["int", "string"]},
            {"name": "next", "type": ["null", "Order"]},
            {"name": "coupon", "type": ["null", "string"], "default": null}
        ]}"#;
        let c = of_schema(Format::Avro, schema, None).expect("columns");
        assert_eq!(
            names(&c),
            [
                "order_id string $.order_id",
                "customer_id string $.customer.id",
                "customer_tier int $.customer.Tier",
                "amount decimal(12,2) $.amount",
                "status string $.status",
                "created_at timestamp $.created_at",
                "day date $.day",
                "coupon string $.coupon",
            ]
        );
        assert!(c.columns.iter().all(|c| !c.required));
        assert_eq!(c.skipped.len(), 3, "{:?}", c.skipped);
        assert!(c.skipped[0].starts_with("tags: array"), "{:?}", c.skipped);
        assert!(c.skipped[2].contains("recursive"), "{:?}", c.skipped);
    }

    #[test]
    fn protobuf_fields_become_columns_and_nested_messages_flatten() {
        let proto = r#"syntax = "proto3";
            package shop;
            import "google/protobuf/timestamp.proto";
            message Order {
              string order_id = 1;
              Customer customer = 2;
              int32 qty = 3;
              uint64 big = 4;
              google.protobuf.Timestamp created_at = 5;
              repeated string tags = 6;
              bytes blob = 7;
              optional string coupon = 8;
            }
            message Customer { string id = 1; Order last = 2; }"#;
        let c = of_schema(Format::Protobuf, proto, None).expect("columns");
        assert_eq!(
            names(&c),
            [
                "order_id string $.order_id",
                "customer_id string $.customer.id",
                "qty int $.qty",
                "big decimal(20,0) $.big",
                "created_at timestamp $.created_at",
                "coupon string $.coupon",
            ]
        );
        assert_eq!(c.skipped.len(), 3, "{:?}", c.skipped);
    }

    #[test]
    fn a_protobuf_tables_message_is_chosen_by_its_full_name() {
        let proto = r#"syntax = "proto3";
            package shop;
            message Refund { string refund_id = 1; }
            message Order { string order_id = 1; message Line { int64 qty = 1; } Line line = 2; }"#;
        let names = |m: Option<&str>| -> Vec<String> {
            of_schema(Format::Protobuf, proto, m)
                .expect("columns")
                .columns
                .into_iter()
                .map(|c| c.name)
                .collect()
        };
        assert_eq!(names(None), ["refund_id"]);
        assert_eq!(names(Some("shop.Order")), ["order_id", "line_qty"]);
        assert_eq!(names(Some("shop.Order.Line")), ["qty"]);
        let e = of_schema(Format::Protobuf, proto, Some("Order")).expect_err("not a full name");
        assert!(
            e.contains("shop.Order, shop.Order.Line, shop.Refund"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_schemas_and_non_record_roots_say_why() {
        let e = of_schema(Format::Avro, r#""string""#, None).expect_err("not a record");
        assert!(e.contains("not a record"), "{e}");
        let e = of_schema(Format::Avro, "{", None).expect_err("not JSON");
        assert!(e.contains("not JSON"), "{e}");
        assert!(of_schema(Format::Protobuf, "syntax = ", None).is_err());
        let e = of_schema(
            Format::Avro,
            r#"{"type": "record", "name": "R", "fields": [
            {"name": "a", "type": "int"}, {"name": "A", "type": "int"}]}"#,
            None,
        )
        .expect("columns");
        assert_eq!(e.columns.len(), 1);
        assert!(e.skipped[0].contains("already gives"), "{:?}", e.skipped);
    }

    /// Fan-out 40 over 4 levels of nested records (40^4 fields) made `check` hang; it is
    /// refused naming the limit after at most MAX_FIELDS fields.
    #[test]
    fn a_schema_that_flattens_into_too_many_fields_is_refused_naming_the_limit() {
        let mut ty = r#""string""#.to_string();
        for level in 0..4 {
            let fields: Vec<String> = (0..40)
                .map(|i| {
                    if i == 0 {
                        format!(r#"{{"name":"f{i}","type":{ty}}}"#)
                    } else {
                        format!(r#"{{"name":"f{i}","type":"R{level}"}}"#)
                    }
                })
                .collect();
            ty = if level == 0 {
                format!(
                    r#"{{"type":"record","name":"R{level}","fields":[{}]}}"#,
                    fields
                        .join(",")
                        .replace(r#""type":"R0""#, r#""type":"string""#)
                )
            } else {
                format!(
                    r#"{{"type":"record","name":"R{level}","fields":[{}]}}"#,
                    fields.join(",").replace(
                        &format!(r#""type":"R{level}""#),
                        &format!(r#""type":"R{}""#, level - 1)
                    )
                )
            };
        }
        let schema =
            format!(r#"{{"type":"record","name":"Top","fields":[{{"name":"x","type":{ty}}}]}}"#);
        let e = of_schema(Format::Avro, &schema, None).expect_err("refused");
        assert!(e.contains("(the limit)"), "{e}");
        // Many columns, each its own field: refused by the column limit.
        let fields: Vec<String> = (0..1_200)
            .map(|i| format!(r#"{{"name":"c{i}","type":"long"}}"#))
            .collect();
        let wide = format!(
            r#"{{"type":"record","name":"W","fields":[{}]}}"#,
            fields.join(",")
        );
        let e = of_schema(Format::Avro, &wide, None).expect_err("refused");
        assert!(e.contains("more than 1000 (the limit)"), "{e}");
    }
}
