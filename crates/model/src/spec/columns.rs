//! Columns: what a table's columns are (name, type, where the value is, struct fields) and
//! how the spec's `columns = [...]` become them, checked.

use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use toml::Spanned;

use super::load::is_identifier;
use crate::error::{Error, Result};
use crate::kafka;

/// One column: where its value comes from in the JSON record and what type it has.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSpec {
    /// Column name (lowercase identifier).
    pub name: String,
    /// Its type.
    pub column_type: ColumnType,
    /// Where its value is in the JSON record.
    pub path: JsonPath,
    /// Whether a record without a value for it is rejected.
    pub required: bool,
    /// Its earlier name, when it was renamed (the table keeps the field id).
    pub renamed_from: Option<String>,
    /// A struct column's fields (their paths relative to the struct's); empty otherwise.
    pub fields: Vec<ColumnSpec>,
}

impl ColumnSpec {
    /// An optional column of `column_type` read from the field of its name.
    pub fn optional(name: &str, column_type: ColumnType) -> ColumnSpec {
        ColumnSpec {
            name: name.to_string(),
            column_type,
            path: JsonPath(vec![name.to_string()]),
            required: false,
            renamed_from: None,
            fields: Vec::new(),
        }
    }

    /// The primitive columns this column is made of, depth first, with their full paths and
    /// dotted names (`customer.id`): itself when it is not a struct.
    pub fn leaves(&self) -> Vec<ColumnSpec> {
        if self.column_type != ColumnType::Struct {
            return vec![self.clone()];
        }
        let mut out = Vec::new();
        for f in &self.fields {
            for mut leaf in f.leaves() {
                leaf.name = format!("{}.{}", self.name, leaf.name);
                leaf.path = JsonPath([self.path.0.clone(), leaf.path.0].concat());
                out.push(leaf);
            }
        }
        out
    }
}

/// The column types a spec may use (all supported by Athena and Glue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// UTF-8 text.
    String,
    /// 32-bit signed integer.
    Int,
    /// 64-bit signed integer.
    Long,
    /// 32-bit float.
    Float,
    /// 64-bit float.
    Double,
    /// `true` or `false`.
    Boolean,
    /// Days since 1970-01-01; JSON `"YYYY-MM-DD"`.
    Date,
    /// Microseconds since the epoch, UTC, no zone; JSON RFC 3339 string or epoch milliseconds.
    Timestamp,
    /// A struct of named fields ([`ColumnSpec::fields`]); a JSON object, an Avro record, a
    /// Protobuf message.
    Struct,
    /// Exact decimal; JSON number or numeric string.
    Decimal {
        /// Total digits, 1 to 38.
        precision: u8,
        /// Digits after the point, at most the precision.
        scale: u8,
    },
}

const TYPE_HELP: &str = "use one of string, int, long, float, double, boolean, date, timestamp, decimal(P,S) with 1 <= P <= 38 and S <= P, or struct with fields = [...]";

impl ColumnType {
    /// Parses a type name as written in the spec.
    pub fn parse(text: &str) -> Option<ColumnType> {
        let t = text.trim();
        Some(match t {
            "string" => ColumnType::String,
            "int" => ColumnType::Int,
            "long" => ColumnType::Long,
            "float" => ColumnType::Float,
            "double" => ColumnType::Double,
            "boolean" => ColumnType::Boolean,
            "date" => ColumnType::Date,
            "timestamp" => ColumnType::Timestamp,
            "struct" => ColumnType::Struct,
            _ => {
                let inner = t.strip_prefix("decimal(")?.strip_suffix(')')?;
                let (p, s) = inner.split_once(',')?;
                let precision: u8 = p.trim().parse().ok()?;
                let scale: u8 = s.trim().parse().ok()?;
                if precision == 0 || precision > 38 || scale > precision {
                    return None;
                }
                ColumnType::Decimal { precision, scale }
            }
        })
    }
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColumnType::String => f.write_str("string"),
            ColumnType::Int => f.write_str("int"),
            ColumnType::Long => f.write_str("long"),
            ColumnType::Float => f.write_str("float"),
            ColumnType::Double => f.write_str("double"),
            ColumnType::Boolean => f.write_str("boolean"),
            ColumnType::Date => f.write_str("date"),
            ColumnType::Timestamp => f.write_str("timestamp"),
            ColumnType::Struct => f.write_str("struct"),
            ColumnType::Decimal { precision, scale } => write!(f, "decimal({precision},{scale})"),
        }
    }
}

/// A path into a JSON object: `$.a.b` or `$['a key'].b`. Only object members, no arrays.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonPath(pub Vec<String>);

impl JsonPath {
    /// Parses `$.a.b`, `$['a'].b`, or a bare member name `a`.
    pub fn parse(text: &str) -> Option<JsonPath> {
        let Some(mut rest) = text.strip_prefix('$') else {
            return (!text.is_empty() && !text.contains(['.', '[', ']', '$']))
                .then(|| JsonPath(vec![text.to_string()]));
        };
        let mut parts = Vec::new();
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("['") {
                let end = r.find("']")?;
                parts.push(r[..end].to_string());
                rest = &r[end + 2..];
            } else if let Some(r) = rest.strip_prefix('.') {
                let end = r.find(['.', '[']).unwrap_or(r.len());
                if end == 0 {
                    return None;
                }
                parts.push(r[..end].to_string());
                rest = &r[end..];
            } else {
                return None;
            }
        }
        (!parts.is_empty()).then_some(JsonPath(parts))
    }
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("$")?;
        for p in &self.0 {
            if p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                write!(f, ".{p}")?;
            } else {
                write!(f, "['{p}']")?;
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawColumn {
    pub(super) name: Spanned<String>,
    #[serde(rename = "type")]
    column_type: Spanned<String>,
    pub(super) path: Option<Spanned<String>>,
    #[serde(default)]
    required: bool,
    /// The column's earlier name: the table keeps its field id (and old files their values).
    renamed_from: Option<Spanned<String>>,
    /// A struct column's fields.
    fields: Option<Vec<Spanned<RawColumn>>>,
}

/// The columns of a table or reference table, checked.
pub(super) fn parse_columns(
    raw_columns: &[Spanned<RawColumn>],
    table_name: &Spanned<String>,
    at: &impl Fn(std::ops::Range<usize>, String) -> Error,
) -> Result<Vec<ColumnSpec>> {
    parse_level(raw_columns, table_name, None, 0, at)
}

/// How deep struct columns may nest.
const MAX_STRUCT_DEPTH: usize = 16;

/// The columns of one level: a table's, or (`inside` names it) a struct column's fields.
fn parse_level(
    raw_columns: &[Spanned<RawColumn>],
    table_name: &Spanned<String>,
    inside: Option<&str>,
    depth: usize,
    at: &impl Fn(std::ops::Range<usize>, String) -> Error,
) -> Result<Vec<ColumnSpec>> {
    if raw_columns.is_empty() {
        return Err(at(
            table_name.span(),
            "table has no columns; add columns = [{ name = \"...\", type = \"...\" }]".into(),
        ));
    }
    let mut seen = HashSet::new();
    let mut columns = Vec::new();
    for c in raw_columns {
        let c = c.get_ref();
        let name = c.name.get_ref();
        if !is_identifier(name) {
            return Err(at(
                c.name.span(),
                format!(
                    "column name {name:?} is not a lowercase identifier; use letters a-z, digits and _ (Athena lowercases names), and map the JSON field with path = \"$.{name}\""
                ),
            ));
        }
        if inside.is_none() && (kafka::is_kafka_column(name) || name.starts_with("kafka_")) {
            return Err(at(
                c.name.span(),
                format!(
                    "column name {name:?} is reserved: streamtable adds {} to every table; rename the column",
                    kafka::NAMES.join(", ")
                ),
            ));
        }
        if !seen.insert(name.clone()) {
            return Err(at(
                c.name.span(),
                format!("column {name:?} is defined twice"),
            ));
        }
        let column_type = ColumnType::parse(c.column_type.get_ref()).ok_or_else(|| {
            at(
                c.column_type.span(),
                format!(
                    "unknown column type {:?}; {TYPE_HELP}",
                    c.column_type.get_ref()
                ),
            )
        })?;
        let path = match &c.path {
            Some(p) => JsonPath::parse(p.get_ref()).ok_or_else(|| {
                at(
                    p.span(),
                    format!(
                        "cannot read JSON path {:?}; write $.field, $.outer.inner or $['odd key']",
                        p.get_ref()
                    ),
                )
            })?,
            None => JsonPath(vec![name.clone()]),
        };
        let renamed_from = match &c.renamed_from {
            Some(r) if r.get_ref() == name => {
                return Err(at(
                    r.span(),
                    format!("column {name:?} is renamed from itself; remove renamed_from"),
                ));
            }
            Some(r) => Some(r.get_ref().clone()),
            None => None,
        };
        let fields = match (&c.fields, column_type) {
            (Some(f), ColumnType::Struct) if !f.is_empty() => {
                if c.required {
                    return Err(at(
                        c.name.span(),
                        format!(
                            "struct column {name:?} cannot be required; its fields are NULL when the record has no {path}"
                        ),
                    ));
                }
                if depth >= MAX_STRUCT_DEPTH {
                    return Err(at(
                        c.name.span(),
                        format!(
                            "struct column {name:?} nests structs more than {MAX_STRUCT_DEPTH} deep; flatten the inner fields into columns with paths"
                        ),
                    ));
                }
                parse_level(f, table_name, Some(name), depth + 1, at)?
            }
            (_, ColumnType::Struct) => {
                return Err(at(
                    c.column_type.span(),
                    format!(
                        "struct column {name:?} has no fields; add fields = [{{ name = \"...\", type = \"...\" }}]"
                    ),
                ));
            }
            (Some(_), _) => {
                return Err(at(
                    c.name.span(),
                    format!(
                        "column {name:?} has fields but is of type {column_type}; write type = \"struct\""
                    ),
                ));
            }
            (None, _) => Vec::new(),
        };
        if let Some(parent) = inside
            && c.required
        {
            return Err(at(
                c.name.span(),
                format!(
                    "field {name:?} of struct column {parent:?} cannot be required (the struct may be absent); remove required = true"
                ),
            ));
        }
        columns.push(ColumnSpec {
            name: name.clone(),
            column_type,
            path,
            required: c.required,
            renamed_from,
            fields,
        });
    }
    // Two columns on one path is fine; a path that is a prefix of another is not (a value cannot
    // be both a leaf and an object). A struct's own path is an object: its fields' are checked.
    if inside.is_some() {
        return Ok(columns);
    }
    let leaves: Vec<(ColumnSpec, &str)> = columns
        .iter()
        .flat_map(|c| c.leaves().into_iter().map(move |l| (l, c.name.as_str())))
        .collect();
    for (a, _) in &leaves {
        for (b, owner) in &leaves {
            if a.path != b.path && b.path.0.starts_with(&a.path.0) {
                let span = raw_columns
                    .iter()
                    .find(|c| c.get_ref().name.get_ref() == owner)
                    .map(|c| c.span());
                return Err(at(
                    span.unwrap_or(table_name.span()),
                    format!(
                        "path {} of column {:?} lies inside path {} of column {:?}; a JSON value cannot be both",
                        b.path, b.name, a.path, a.name
                    ),
                ));
            }
        }
    }
    Ok(columns)
}
