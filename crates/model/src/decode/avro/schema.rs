//! Avro schemas as a registry serves them (JSON text), parsed into the types the body reader
//! walks. Named types (records, enums, fixed) may be referenced by name, also recursively.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// One Avro type, with its logical type where the reader treats it differently.
#[derive(Debug, Clone, PartialEq)]
pub enum Type {
    /// `null`.
    Null,
    /// `boolean`.
    Boolean,
    /// `int`.
    Int,
    /// `long`.
    Long,
    /// `float`.
    Float,
    /// `double`.
    Double,
    /// `bytes`.
    Bytes,
    /// `string`.
    String,
    /// A record: index into [`Schema::records`].
    Record(usize),
    /// An enum's symbols.
    Enum(Vec<String>),
    /// An array of its items' type.
    Array(Box<Type>),
    /// A map from strings to its values' type.
    Map(Box<Type>),
    /// A union of its branches.
    Union(Vec<Type>),
    /// Fixed-size bytes.
    Fixed(usize),
    /// `int` days since 1970-01-01.
    Date,
    /// `long` milliseconds since the epoch (also `local-timestamp-millis`).
    TimestampMillis,
    /// `long` microseconds since the epoch (also `local-timestamp-micros`).
    TimestampMicros,
    /// `long` nanoseconds since the epoch (`timestamp-nanos`, Debezium's `NanoTimestamp`).
    TimestampNanos,
    /// A time of day as Debezium writes it in a long (`MicroTime`, `NanoTime`): its number, for
    /// a number column; not a timestamp.
    TimeOfDay,
    /// Two's-complement big-endian unscaled value in `bytes` (`fixed` = `None`) or `fixed`.
    Decimal {
        /// Digits in all.
        precision: u32,
        /// Digits after the point.
        scale: u32,
        /// The size of a `fixed`, or `None` for `bytes`.
        fixed: Option<usize>,
    },
}

/// A record type's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Its full name.
    pub name: String,
    /// Its fields, in order.
    pub fields: Vec<Field>,
}

/// One field of a record.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: Type,
}

/// A parsed schema: its root type and the records it defines.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    /// The type a body is.
    pub root: Type,
    /// The records it defines, referenced by index.
    pub records: Vec<Record>,
}

impl Schema {
    /// Parses a schema's JSON text; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<Schema, String> {
        let json: Value =
            serde_json::from_str(text).map_err(|e| format!("schema is not JSON: {e}"))?;
        let mut parser = Parser::default();
        let root = parser.parse(&json, "")?;
        Ok(Schema {
            root,
            records: parser.records,
        })
    }

    /// The name of a type, as messages show it.
    pub fn describe(&self, ty: &Type) -> String {
        match ty {
            Type::Null => "null".into(),
            Type::Boolean => "boolean".into(),
            Type::Int => "int".into(),
            Type::Long => "long".into(),
            Type::Float => "float".into(),
            Type::Double => "double".into(),
            Type::Bytes => "bytes".into(),
            Type::String => "string".into(),
            Type::Record(i) => match self.records.get(*i) {
                Some(r) => format!("record {}", r.name),
                None => "record".into(),
            },
            Type::Enum(_) => "enum".into(),
            Type::Array(_) => "array".into(),
            Type::Map(_) => "map".into(),
            Type::Union(branches) => {
                let names: Vec<_> = branches.iter().map(|b| self.describe(b)).collect();
                format!("[{}]", names.join(", "))
            }
            Type::Fixed(n) => format!("fixed({n})"),
            Type::Date => "int (date)".into(),
            Type::TimestampMillis => "long (timestamp-millis)".into(),
            Type::TimestampMicros => "long (timestamp-micros)".into(),
            Type::TimestampNanos => "long (timestamp-nanos)".into(),
            Type::TimeOfDay => "a time of day".into(),
            Type::Decimal {
                precision, scale, ..
            } => format!("decimal({precision},{scale})"),
        }
    }
}

#[derive(Default)]
struct Parser {
    records: Vec<Record>,
    /// Named types by full name (records as `Type::Record`).
    named: HashMap<String, Type>,
}

fn full_name(obj: &Map<String, Value>, namespace: &str) -> Result<(String, String), String> {
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .ok_or("a named type (record, enum, fixed) has no \"name\"")?;
    if name.contains('.') {
        let ns = name.rsplit_once('.').map(|(ns, _)| ns).unwrap_or("");
        return Ok((name.to_string(), ns.to_string()));
    }
    let ns = obj
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or(namespace);
    let full = if ns.is_empty() {
        name.to_string()
    } else {
        format!("{ns}.{name}")
    };
    Ok((full, ns.to_string()))
}

impl Parser {
    fn parse(&mut self, json: &Value, namespace: &str) -> Result<Type, String> {
        match json {
            Value::String(name) => self.named_or_primitive(name, namespace),
            Value::Array(branches) => {
                let types = branches
                    .iter()
                    .map(|b| self.parse(b, namespace))
                    .collect::<Result<Vec<_>, _>>()?;
                if types.iter().any(|t| matches!(t, Type::Union(_))) {
                    return Err("a union may not directly contain another union".into());
                }
                Ok(Type::Union(types))
            }
            Value::Object(obj) => self.parse_object(obj, namespace),
            other => Err(format!("{other} is not an Avro type")),
        }
    }

    fn named_or_primitive(&self, name: &str, namespace: &str) -> Result<Type, String> {
        Ok(match name {
            "null" => Type::Null,
            "boolean" => Type::Boolean,
            "int" => Type::Int,
            "long" => Type::Long,
            "float" => Type::Float,
            "double" => Type::Double,
            "bytes" => Type::Bytes,
            "string" => Type::String,
            _ => {
                let qualified = format!("{namespace}.{name}");
                let found = if namespace.is_empty() || name.contains('.') {
                    self.named.get(name)
                } else {
                    self.named.get(&qualified).or_else(|| self.named.get(name))
                };
                return found
                    .cloned()
                    .ok_or_else(|| format!("unknown type {name:?}"));
            }
        })
    }

    fn parse_object(&mut self, obj: &Map<String, Value>, namespace: &str) -> Result<Type, String> {
        let ty = obj.get("type").ok_or("a schema object has no \"type\"")?;
        let Value::String(kind) = ty else {
            // {"type": {...}} or {"type": [...]}: the type is nested.
            return self.parse(ty, namespace);
        };
        let logical = obj.get("logicalType").and_then(Value::as_str);
        let base = match kind.as_str() {
            "record" | "error" => return self.parse_record(obj, namespace),
            "enum" => {
                let (full, _) = full_name(obj, namespace)?;
                let symbols = obj
                    .get("symbols")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("enum {full} has no \"symbols\""))?
                    .iter()
                    .map(|s| s.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| format!("enum {full}: symbols must be strings"))?;
                let t = Type::Enum(symbols);
                self.named.insert(full, t.clone());
                return Ok(t);
            }
            "array" => {
                let items = obj.get("items").ok_or("an array has no \"items\"")?;
                return Ok(Type::Array(Box::new(self.parse(items, namespace)?)));
            }
            "map" => {
                let values = obj.get("values").ok_or("a map has no \"values\"")?;
                return Ok(Type::Map(Box::new(self.parse(values, namespace)?)));
            }
            "fixed" => {
                let (full, _) = full_name(obj, namespace)?;
                let size = obj
                    .get("size")
                    .and_then(Value::as_u64)
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| format!("fixed {full} has no valid \"size\""))?;
                let t = match logical {
                    Some("decimal") => decimal(obj, Some(size))?,
                    _ => Type::Fixed(size),
                };
                self.named.insert(full, t.clone());
                return Ok(t);
            }
            other => self.named_or_primitive(other, namespace)?,
        };
        // Kafka Connect's semantic types that Avro has no logical type for, as Debezium's
        // temporal types are written by the AvroConverter (`connect.name`).
        match (obj.get("connect.name").and_then(Value::as_str), &base) {
            (Some("io.debezium.time.Date"), Type::Int) => return Ok(Type::Date),
            (Some("io.debezium.time.Timestamp"), Type::Long) => return Ok(Type::TimestampMillis),
            (Some("io.debezium.time.MicroTimestamp"), Type::Long) => {
                return Ok(Type::TimestampMicros);
            }
            (Some("io.debezium.time.NanoTimestamp"), Type::Long) => {
                return Ok(Type::TimestampNanos);
            }
            (Some("io.debezium.time.MicroTime" | "io.debezium.time.NanoTime"), Type::Long) => {
                return Ok(Type::TimeOfDay);
            }
            _ => {}
        }
        // Logical types on primitives; an unknown or misplaced one leaves the base type (as the
        // Avro specification says readers must).
        Ok(match (logical, &base) {
            (Some("date"), Type::Int) => Type::Date,
            (Some("timestamp-millis" | "local-timestamp-millis"), Type::Long) => {
                Type::TimestampMillis
            }
            (Some("timestamp-micros" | "local-timestamp-micros"), Type::Long) => {
                Type::TimestampMicros
            }
            (Some("timestamp-nanos" | "local-timestamp-nanos"), Type::Long) => Type::TimestampNanos,
            (Some("decimal"), Type::Bytes) => decimal(obj, None).unwrap_or(base),
            _ => base,
        })
    }

    fn parse_record(&mut self, obj: &Map<String, Value>, namespace: &str) -> Result<Type, String> {
        let (full, ns) = full_name(obj, namespace)?;
        let index = self.records.len();
        self.records.push(Record {
            name: full.clone(),
            fields: Vec::new(),
        });
        // Registered before its fields: a field may refer to the record itself.
        self.named.insert(full.clone(), Type::Record(index));
        let fields = obj
            .get("fields")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("record {full} has no \"fields\" list"))?;
        let mut parsed = Vec::with_capacity(fields.len());
        for f in fields {
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("a field of record {full} has no \"name\""))?;
            let ty = f
                .get("type")
                .ok_or_else(|| format!("field {full}.{name} has no \"type\""))?;
            let ty = self
                .parse(ty, &ns)
                .map_err(|e| format!("field {full}.{name}: {e}"))?;
            parsed.push(Field {
                name: name.to_string(),
                ty,
            });
        }
        if let Some(r) = self.records.get_mut(index) {
            r.fields = parsed;
        }
        Ok(Type::Record(index))
    }
}

fn decimal(obj: &Map<String, Value>, fixed: Option<usize>) -> Result<Type, String> {
    let precision = obj
        .get("precision")
        .and_then(Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or("a decimal has no valid \"precision\"")?;
    let scale = obj
        .get("scale")
        .map(|s| s.as_u64().and_then(|s| u32::try_from(s).ok()))
        .unwrap_or(Some(0))
        .filter(|s| *s <= precision)
        .ok_or("a decimal's \"scale\" must be between 0 and its precision")?;
    Ok(Type::Decimal {
        precision,
        scale,
        fixed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_records_logical_types_and_references() {
        let s = Schema::parse(
            r#"{"type":"record","name":"Order","namespace":"shop","fields":[
                {"name":"id","type":"string"},
                {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":18,"scale":2}},
                {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
                {"name":"customer","type":["null",{"type":"record","name":"Customer","fields":[{"name":"id","type":"string"}]}]},
                {"name":"previous","type":["null","Customer"]},
                {"name":"next","type":["null","Order"]},
                {"name":"odd","type":{"type":"string","logicalType":"no-such-type"}}
            ]}"#,
        )
        .expect("parses");
        assert_eq!(s.root, Type::Record(0));
        let f = &s.records[0].fields;
        assert_eq!(
            f[1].ty,
            Type::Decimal {
                precision: 18,
                scale: 2,
                fixed: None
            }
        );
        assert_eq!(f[2].ty, Type::TimestampMillis);
        assert_eq!(f[3].ty, Type::Union(vec![Type::Null, Type::Record(1)]));
        assert_eq!(f[4].ty, Type::Union(vec![Type::Null, Type::Record(1)]));
        assert_eq!(f[5].ty, Type::Union(vec![Type::Null, Type::Record(0)]));
        assert_eq!(f[6].ty, Type::String);
        assert_eq!(s.records[1].name, "shop.Customer");
    }

    #[test]
    fn debeziums_temporal_types_are_read_by_their_connect_names() {
        let s = Schema::parse(
            r#"{"type":"record","name":"Value","fields":[
                {"name":"d","type":{"type":"int","connect.version":1,"connect.name":"io.debezium.time.Date"}},
                {"name":"ms","type":{"type":"long","connect.version":1,"connect.name":"io.debezium.time.Timestamp"}},
                {"name":"us","type":["null",{"type":"long","connect.version":1,"connect.name":"io.debezium.time.MicroTimestamp"}]},
                {"name":"other","type":{"type":"long","connect.name":"io.debezium.time.MicroTime"}},
                {"name":"ns","type":{"type":"long","connect.name":"io.debezium.time.NanoTimestamp"}},
                {"name":"misplaced","type":{"type":"string","connect.name":"io.debezium.time.Date"}}
            ]}"#,
        )
        .expect("parses");
        let f = &s.records[0].fields;
        assert_eq!(f[0].ty, Type::Date);
        assert_eq!(f[1].ty, Type::TimestampMillis);
        assert_eq!(
            f[2].ty,
            Type::Union(vec![Type::Null, Type::TimestampMicros])
        );
        assert_eq!(f[3].ty, Type::TimeOfDay, "a time of day is no timestamp");
        assert_eq!(f[4].ty, Type::TimestampNanos);
        assert_eq!(f[5].ty, Type::String);
    }

    #[test]
    fn refuses_what_is_not_a_schema_with_a_reason() {
        for (text, says) in [
            ("{", "not JSON"),
            ("3", "not an Avro type"),
            (r#"{"type":"record","name":"R"}"#, "no \"fields\""),
            (
                r#"{"type":"record","name":"R","fields":[{"name":"a","type":"Nope"}]}"#,
                "unknown type \"Nope\"",
            ),
            (r#"["null",["int"]]"#, "another union"),
        ] {
            let e = Schema::parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
