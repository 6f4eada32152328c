//! The pipeline spec: which Kafka topics land in which tables, with which columns.
//!
//! The spec is one TOML file (default `infra/pipeline.toml`). It is validated completely when it
//! is loaded; an invalid spec is refused with a message naming the file, the line and the fix:
//!
//! ```text
//! infra/pipeline.toml:14:37: unknown column type "decmal(18,2)"; use one of string, int, long,
//! float, double, boolean, date, timestamp, decimal(P,S)
//! ```
//!
//! ```toml
//! [[tables]]
//! name = "orders"
//! topic = "orders"
//! partition_by = ["day(created_at)"]
//! columns = [
//!   { name = "order_id", type = "string", required = true },
//!   { name = "amount", type = "decimal(18,2)", required = true },
//!   { name = "customer_id", type = "string", path = "$.customer.id" },
//!   { name = "created_at", type = "timestamp", required = true },
//! ]
//! ```

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::error::{Error, Result};

/// Name of the table that receives every rejected record.
pub const DEAD_LETTER_TABLE: &str = "dead_letters";
/// Default limit on the decoded size of one record value.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1024 * 1024;
/// Default target size of compacted data files.
pub const DEFAULT_TARGET_FILE_SIZE_MB: u64 = 128;
/// Largest allowed target file size.
pub const MAX_TARGET_FILE_SIZE_MB: u64 = 512;
/// Column names that streamtable adds to every table.
pub const KAFKA_COLUMNS: [&str; 4] = [
    "kafka_partition",
    "kafka_offset",
    "kafka_timestamp",
    "kafka_key",
];

/// A validated pipeline spec.
#[derive(Debug, Clone)]
pub struct PipelineSpec {
    /// Where the spec was read from (for messages).
    pub origin: PathBuf,
    /// Settings shared by every table.
    pub settings: Settings,
    /// The tables, in file order.
    pub tables: Vec<TableSpec>,
}

/// Settings shared by every table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Records whose decoded value is larger than this go to the dead-letter table.
    pub max_record_bytes: usize,
    /// Default target size of compacted files, in MB.
    pub target_file_size_mb: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            target_file_size_mb: DEFAULT_TARGET_FILE_SIZE_MB,
        }
    }
}

/// One table fed by one topic.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// Table name (lowercase, as Athena requires).
    pub name: String,
    /// Kafka topic the table is fed from.
    pub topic: String,
    /// The business columns, in order. Kafka metadata columns are appended by [`crate::schema`].
    pub columns: Vec<ColumnSpec>,
    /// Partition transforms, in order.
    pub partition_by: Vec<PartitionField>,
    /// Target size of compacted files, in MB.
    pub target_file_size_mb: u64,
}

/// One column: where its value comes from in the JSON record and what type it has.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSpec {
    pub name: String,
    pub column_type: ColumnType,
    pub path: JsonPath,
    pub required: bool,
}

/// The column types a spec may use (all supported by Athena and Glue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    String,
    Int,
    Long,
    Float,
    Double,
    Boolean,
    /// Days since 1970-01-01; JSON `"YYYY-MM-DD"`.
    Date,
    /// Microseconds since the epoch, UTC, no zone; JSON RFC 3339 string or epoch milliseconds.
    Timestamp,
    /// Exact decimal; JSON number or numeric string.
    Decimal {
        precision: u8,
        scale: u8,
    },
}

const TYPE_HELP: &str = "use one of string, int, long, float, double, boolean, date, timestamp, decimal(P,S) with 1 <= P <= 38 and S <= P";

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

/// A partition field: a transform of a source column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionField {
    pub transform: iceberg::spec::Transform,
    pub source: String,
}

impl PartitionField {
    /// Name of the partition field, as Iceberg and Spark name it (`created_at_day`).
    pub fn field_name(&self) -> String {
        use iceberg::spec::Transform;
        match self.transform {
            Transform::Identity => self.source.clone(),
            Transform::Year => format!("{}_year", self.source),
            Transform::Month => format!("{}_month", self.source),
            Transform::Day => format!("{}_day", self.source),
            Transform::Hour => format!("{}_hour", self.source),
            Transform::Bucket(_) => format!("{}_bucket", self.source),
            Transform::Truncate(_) => format!("{}_trunc", self.source),
            Transform::Void | Transform::Unknown => format!("{}_void", self.source),
        }
    }
}

const PARTITION_HELP: &str = "write identity(col), year(col), month(col), day(col), hour(col), bucket(N, col) or truncate(W, col)";

/// Parses `day(created_at)`, `bucket(16, id)`, `truncate(4, name)` or a bare column name.
fn parse_partition(text: &str) -> Option<PartitionField> {
    use iceberg::spec::Transform;
    let t = text.trim();
    let Some((func, args)) = t.split_once('(') else {
        return is_identifier(t).then(|| PartitionField {
            transform: Transform::Identity,
            source: t.to_string(),
        });
    };
    let args: Vec<&str> = args.strip_suffix(')')?.split(',').map(str::trim).collect();
    let (transform, source) = match (func.trim(), args.as_slice()) {
        ("identity", [c]) => (Transform::Identity, *c),
        ("year", [c]) => (Transform::Year, *c),
        ("month", [c]) => (Transform::Month, *c),
        ("day", [c]) => (Transform::Day, *c),
        ("hour", [c]) => (Transform::Hour, *c),
        ("bucket", [n, c]) => (Transform::Bucket(n.parse().ok().filter(|n| *n > 0)?), *c),
        ("truncate", [w, c]) => (Transform::Truncate(w.parse().ok().filter(|w| *w > 0)?), *c),
        _ => return None,
    };
    is_identifier(source).then(|| PartitionField {
        transform,
        source: source.to_string(),
    })
}

/// Lowercase SQL identifier as Athena and Glue accept it.
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && s.len() <= 128
}

// ----- raw file shape -----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[serde(default)]
    settings: Option<Spanned<RawSettings>>,
    #[serde(default)]
    tables: Vec<Spanned<RawTable>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    max_record_bytes: Option<Spanned<u64>>,
    target_file_size_mb: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    name: Spanned<String>,
    topic: Spanned<String>,
    columns: Vec<Spanned<RawColumn>>,
    #[serde(default)]
    partition_by: Vec<Spanned<String>>,
    target_file_size_mb: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    name: Spanned<String>,
    #[serde(rename = "type")]
    column_type: Spanned<String>,
    path: Option<Spanned<String>>,
    #[serde(default)]
    required: bool,
}

impl PipelineSpec {
    /// Reads and validates a spec file.
    pub fn load(path: &Path) -> Result<PipelineSpec> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Spec(format!(
                "{}: cannot read the pipeline spec: {e}; pass --pipeline FILE or set STREAMTABLE_PIPELINE",
                path.display()
            ))
        })?;
        PipelineSpec::parse(&text, path)
    }

    /// Validates a spec given as text; `origin` names it in messages.
    pub fn parse(text: &str, origin: &Path) -> Result<PipelineSpec> {
        let at = |span: std::ops::Range<usize>, msg: String| {
            let (line, col) = line_col(text, span.start);
            Error::Spec(format!("{}:{line}:{col}: {msg}", origin.display()))
        };
        let raw: RawSpec = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim_end().to_string();
            match e.span() {
                Some(span) => at(
                    span,
                    format!("{msg}; see infra/pipeline.toml for a valid example"),
                ),
                None => Error::Spec(format!("{}: {msg}", origin.display())),
            }
        })?;

        let mut settings = Settings::default();
        if let Some(s) = &raw.settings {
            if let Some(v) = &s.get_ref().max_record_bytes {
                if *v.get_ref() == 0 || *v.get_ref() > 6 * 1024 * 1024 {
                    return Err(at(
                        v.span(),
                        "max_record_bytes must be between 1 and 6291456 (the Lambda payload limit)"
                            .into(),
                    ));
                }
                settings.max_record_bytes = *v.get_ref() as usize;
            }
            if let Some(v) = &s.get_ref().target_file_size_mb {
                settings.target_file_size_mb = check_target_size(v).map_err(|m| at(v.span(), m))?;
            }
        }

        if raw.tables.is_empty() {
            return Err(Error::Spec(format!(
                "{}: no tables; add at least one [[tables]] section with name, topic and columns",
                origin.display()
            )));
        }
        let mut names = HashSet::new();
        let mut topics = HashSet::new();
        let mut tables = Vec::new();
        for t in &raw.tables {
            let t = t.get_ref();
            let name = t.name.get_ref();
            if !is_identifier(name) {
                return Err(at(
                    t.name.span(),
                    format!(
                        "table name {name:?} is not a lowercase identifier; use letters a-z, digits and _ (Athena lowercases names)"
                    ),
                ));
            }
            if name == DEAD_LETTER_TABLE {
                return Err(at(
                    t.name.span(),
                    format!(
                        "table name {DEAD_LETTER_TABLE:?} is reserved for rejected records; choose another name"
                    ),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(at(
                    t.name.span(),
                    format!("table {name:?} is defined twice; table names must be unique"),
                ));
            }
            let topic = t.topic.get_ref();
            if topic.is_empty() || topic.len() > 249 {
                return Err(at(
                    t.topic.span(),
                    "topic must be a Kafka topic name of 1 to 249 characters".into(),
                ));
            }
            if !topics.insert(topic.clone()) {
                return Err(at(
                    t.topic.span(),
                    format!(
                        "topic {topic:?} already feeds another table; each topic feeds one table"
                    ),
                ));
            }
            let columns = parse_columns(t, &at)?;
            let mut partition_by = Vec::new();
            for p in &t.partition_by {
                let field = parse_partition(p.get_ref()).ok_or_else(|| {
                    at(
                        p.span(),
                        format!(
                            "cannot read partition transform {:?}; {PARTITION_HELP}",
                            p.get_ref()
                        ),
                    )
                })?;
                let col = columns.iter().find(|c| c.name == field.source).ok_or_else(|| {
                    at(p.span(), format!(
                        "partition source column {:?} is not a column of table {name:?}; partition by one of its columns",
                        field.source
                    ))
                })?;
                check_transform(&field, col.column_type).map_err(|m| at(p.span(), m))?;
                if partition_by
                    .iter()
                    .any(|f: &PartitionField| f.field_name() == field.field_name())
                {
                    return Err(at(
                        p.span(),
                        format!("partition {:?} is listed twice", p.get_ref()),
                    ));
                }
                partition_by.push(field);
            }
            let target_file_size_mb = match &t.target_file_size_mb {
                Some(v) => check_target_size(v).map_err(|m| at(v.span(), m))?,
                None => settings.target_file_size_mb,
            };
            tables.push(TableSpec {
                name: name.clone(),
                topic: topic.clone(),
                columns,
                partition_by,
                target_file_size_mb,
            });
        }
        Ok(PipelineSpec {
            origin: origin.to_path_buf(),
            settings,
            tables,
        })
    }

    /// The table fed by `topic`, if any.
    pub fn table_for_topic(&self, topic: &str) -> Option<&TableSpec> {
        self.tables.iter().find(|t| t.topic == topic)
    }

    /// The table called `name`, if any.
    pub fn table(&self, name: &str) -> Option<&TableSpec> {
        self.tables.iter().find(|t| t.name == name)
    }
}

fn parse_columns(
    t: &RawTable,
    at: &impl Fn(std::ops::Range<usize>, String) -> Error,
) -> Result<Vec<ColumnSpec>> {
    if t.columns.is_empty() {
        return Err(at(
            t.name.span(),
            "table has no columns; add columns = [{ name = \"...\", type = \"...\" }]".into(),
        ));
    }
    let mut seen = HashSet::new();
    let mut columns = Vec::new();
    for c in &t.columns {
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
        if KAFKA_COLUMNS.contains(&name.as_str()) || name.starts_with("kafka_") {
            return Err(at(
                c.name.span(),
                format!(
                    "column name {name:?} is reserved: streamtable adds {} to every table; rename the column",
                    KAFKA_COLUMNS.join(", ")
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
        columns.push(ColumnSpec {
            name: name.clone(),
            column_type,
            path,
            required: c.required,
        });
    }
    // Two columns on one path is fine; a path that is a prefix of another is not (a value cannot
    // be both a leaf and an object).
    for a in &columns {
        for b in &columns {
            if a.path != b.path && b.path.0.starts_with(&a.path.0) {
                let span = t
                    .columns
                    .iter()
                    .find(|c| c.get_ref().name.get_ref() == &b.name)
                    .map(|c| c.span());
                return Err(at(
                    span.unwrap_or(t.name.span()),
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

fn check_target_size(v: &Spanned<u64>) -> std::result::Result<u64, String> {
    let mb = *v.get_ref();
    if mb == 0 || mb > MAX_TARGET_FILE_SIZE_MB {
        return Err(format!(
            "target_file_size_mb must be between 1 and {MAX_TARGET_FILE_SIZE_MB}"
        ));
    }
    Ok(mb)
}

fn check_transform(field: &PartitionField, ty: ColumnType) -> std::result::Result<(), String> {
    use iceberg::spec::Transform;
    let ok = match field.transform {
        Transform::Identity => !matches!(ty, ColumnType::Float | ColumnType::Double),
        Transform::Year | Transform::Month | Transform::Day => {
            matches!(ty, ColumnType::Date | ColumnType::Timestamp)
        }
        Transform::Hour => ty == ColumnType::Timestamp,
        Transform::Bucket(_) => matches!(
            ty,
            ColumnType::Int
                | ColumnType::Long
                | ColumnType::Decimal { .. }
                | ColumnType::String
                | ColumnType::Date
                | ColumnType::Timestamp
        ),
        Transform::Truncate(_) => matches!(
            ty,
            ColumnType::Int | ColumnType::Long | ColumnType::Decimal { .. } | ColumnType::String
        ),
        Transform::Void | Transform::Unknown => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "transform {} cannot apply to column {:?} of type {ty}; day/month/year need a date or timestamp, hour a timestamp, truncate an int, long, decimal or string",
            field.transform, field.source
        ))
    }
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

#[cfg(test)]
mod tests;
