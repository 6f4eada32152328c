//! Reading and validating the spec file: every error names file, line and fix.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::columns::parse_columns;
use super::registry::{RawColumns, ResolvedColumns, keyword_columns};
use super::*;
use crate::error::{Error, Result};

/// Lowercase SQL identifier as Athena and Glue accept it.
pub fn is_identifier(s: &str) -> bool {
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
    #[serde(default)]
    reference_tables: Vec<Spanned<super::derived::RawReference>>,
    #[serde(default)]
    derived_tables: Vec<Spanned<super::derived::RawDerived>>,
    registry: Option<Spanned<RawRegistry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegistry {
    url: Spanned<String>,
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
    columns: Spanned<RawColumns>,
    /// The registry subject of `columns = "from-registry"`.
    subject: Option<Spanned<String>>,
    /// The Protobuf message of `columns = "from-registry"`.
    message: Option<Spanned<String>>,
    #[serde(default)]
    partition_by: Vec<Spanned<String>>,
    target_file_size_mb: Option<Spanned<u64>>,
    #[serde(default = "yes")]
    land: bool,
    watermark: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    max_event_time_ahead: Option<Spanned<String>>,
    format: Option<Spanned<String>>,
    /// Any value, so that a wrong one is refused naming the key.
    kafka_headers: Option<Spanned<toml::Value>>,
    /// `"append"` (the default) or `"upsert"`.
    mode: Option<Spanned<String>>,
    /// The key of an upsert table.
    primary_key: Option<Spanned<Vec<String>>>,
    /// The key an upsert table was kept by before `primary_key` (acknowledges a re-key).
    rekey_from: Option<Spanned<Vec<String>>>,
    /// `"debezium"`: the records are Debezium change events.
    envelope: Option<Spanned<String>>,
}

fn yes() -> bool {
    true
}

impl PipelineSpec {
    /// Reads and validates a spec file; derived tables' SQL is planned by `planner`.
    pub fn load(path: &Path, planner: &dyn SqlPlanner) -> Result<PipelineSpec> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Spec(format!(
                "{}: cannot read the pipeline spec: {e}; pass --pipeline FILE or set STREAMTABLE_PIPELINE",
                path.display()
            ))
        })?;
        PipelineSpec::parse(&text, path, planner)
    }

    /// Validates a spec given as text; `origin` names it in messages. A spec with tables whose
    /// columns come from the registry needs [`PipelineSpec::parse_resolved`].
    pub fn parse(text: &str, origin: &Path, planner: &dyn SqlPlanner) -> Result<PipelineSpec> {
        parse_spec(text, origin, &ResolvedColumns::new(), planner)
    }
}

/// Validates a spec, with the columns of its registry tables.
pub(super) fn parse_spec(
    text: &str,
    origin: &Path,
    resolved: &ResolvedColumns,
    planner: &dyn SqlPlanner,
) -> Result<PipelineSpec> {
    let at = |span: std::ops::Range<usize>, msg: String| {
        let (line, col) = line_col(text, span.start);
        Error::Spec(format!("{}:{line}:{col}: {msg}", origin.display()))
    };
    let at_line = |line: usize, col: usize, msg: String| {
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
                format!("topic {topic:?} already feeds another table; each topic feeds one table"),
            ));
        }
        let format = match &t.format {
            Some(f) => Format::parse(f.get_ref()).ok_or_else(|| {
                at(
                    f.span(),
                    format!(
                        "unknown format {:?}; use \"json\" (the default), \"avro\" or \"protobuf\" (behind a Confluent or Glue schema registry)",
                        f.get_ref()
                    ),
                )
            })?,
            None => Format::Json,
        };
        if let Some(m) = &t.message
            && (format != Format::Protobuf
                || !matches!(t.columns.get_ref(), RawColumns::Keyword(_)))
        {
            return Err(at(
                m.span(),
                format!(
                    "table {name:?}: message names the Protobuf message whose fields are the columns; it applies to format = \"protobuf\" with columns = \"from-registry\""
                ),
            ));
        }
        let registry_message = t.message.as_ref().map(|m| m.get_ref().clone());
        let (columns, registry_subject) = match t.columns.get_ref() {
            RawColumns::Listed(list) => {
                if let Some(s) = &t.subject {
                    return Err(at(
                        s.span(),
                        format!(
                            "table {name:?}: subject applies to columns = \"from-registry\"; remove it or take the columns from the registry"
                        ),
                    ));
                }
                (parse_columns(list, &t.name, &at)?, None)
            }
            RawColumns::Keyword(k) => (
                keyword_columns(k, name, format, resolved).map_err(|m| at(t.columns.span(), m))?,
                Some(
                    t.subject
                        .as_ref()
                        .map_or_else(|| format!("{topic}-value"), |s| s.get_ref().clone()),
                ),
            ),
        };
        let partition_by =
            super::partitioning::parse_partitioning(&t.partition_by, &columns, name, &at)?;
        let target_file_size_mb = match &t.target_file_size_mb {
            Some(v) => check_target_size(v).map_err(|m| at(v.span(), m))?,
            None => settings.target_file_size_mb,
        };
        let event_time = match &t.watermark {
            Some(w) => Some(
                super::event_time::parse_watermark(w.get_ref(), &columns)
                    .map_err(|m| at(w.span(), m))?,
            ),
            None => None,
        };
        // Settings beside `watermark`: a positive duration each, only with a watermark.
        let mut event_time = event_time;
        for (key, value) in [
            ("idle_timeout", &t.idle_timeout),
            ("max_event_time_ahead", &t.max_event_time_ahead),
        ] {
            let Some(v) = value else { continue };
            let Some(et) = event_time.as_mut() else {
                return Err(at(
                    v.span(),
                    format!(
                        "table {name:?}: {key} applies to a table with a watermark; add watermark = \"<timestamp column> - INTERVAL '30' SECOND\" or remove it"
                    ),
                ));
            };
            let ms = parse_duration_ms(v.get_ref())
                .and_then(|ms| {
                    if ms > 0 {
                        Ok(ms)
                    } else {
                        Err(format!("{key} must be more than 0"))
                    }
                })
                .map_err(|m| at(v.span(), m))?;
            match key {
                "idle_timeout" => et.idle_timeout_ms = ms,
                _ => et.max_ahead_ms = ms,
            }
        }
        let kafka_headers = match &t.kafka_headers {
            None => false,
            Some(v) => match v.get_ref() {
                toml::Value::Boolean(b) => *b,
                other => {
                    let shown = match other {
                        toml::Value::String(s) => format!("the string {s:?}"),
                        toml::Value::Integer(i) => format!("the integer {i}"),
                        toml::Value::Float(f) => format!("the float {f}"),
                        other => format!("a value of type {}", other.type_str()),
                    };
                    return Err(at(
                        v.span(),
                        format!(
                            "table {name:?}: kafka_headers must be true (the records' headers in a column kafka_headers) or false (the default), not {shown}"
                        ),
                    ));
                }
            },
        };
        let upsert = parse_upsert(t, name, &columns, &at)?;
        tables.push(TableSpec {
            name: name.clone(),
            topic: topic.clone(),
            columns,
            partition_by,
            target_file_size_mb,
            land: t.land,
            event_time,
            format,
            registry_subject,
            registry_message,
            kafka_headers,
            upsert,
        });
    }
    let references = super::derived::parse_references(&raw.reference_tables, &mut names, &at)?;
    let derived = super::derived::parse_derived(
        &raw.derived_tables,
        super::derived::Context {
            text,
            planner,
            tables: &tables,
            references: &references,
            settings: &settings,
        },
        &mut names,
        &at,
        &at_line,
    )?;
    let registry = match &raw.registry {
        Some(r) => RegistrySpec {
            url: Some(
                parse_registry_url(&r.get_ref().url, origin)
                    .map_err(|m| at(r.get_ref().url.span(), m))?,
            ),
        },
        None => RegistrySpec::default(),
    };
    Ok(PipelineSpec {
        origin: origin.to_path_buf(),
        settings,
        registry,
        tables,
        references,
        derived,
    })
}

/// A registry URL: `http(s)://…`, or `file:DIR` made relative to the spec's directory.
pub(super) fn parse_registry_url(
    url: &Spanned<String>,
    origin: &Path,
) -> std::result::Result<String, String> {
    let text = url.get_ref().trim();
    if let Some(dir) = text.strip_prefix("file:") {
        let dir = Path::new(dir);
        let dir = match origin.parent() {
            Some(base) if dir.is_relative() => base.join(dir),
            _ => dir.to_path_buf(),
        };
        return Ok(format!("file:{}", dir.display()));
    }
    if text.starts_with("http://") || text.starts_with("https://") {
        return Ok(text.trim_end_matches('/').to_string());
    }
    Err(format!(
        "registry url {text:?} must start with https:// (a Confluent-compatible registry) or file: (a directory of <schema id>.avsc files)"
    ))
}

pub(super) fn check_target_size(v: &Spanned<u64>) -> std::result::Result<u64, String> {
    let mb = *v.get_ref();
    if mb == 0 || mb > MAX_TARGET_FILE_SIZE_MB {
        return Err(format!(
            "target_file_size_mb must be between 1 and {MAX_TARGET_FILE_SIZE_MB}"
        ));
    }
    Ok(mb)
}

/// 1-based line and column of a byte offset.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// `mode` and `primary_key` of a topic's table: an upsert table's key is one to
/// [`super::MAX_PRIMARY_KEY_COLUMNS`] distinct top-level columns of a type compared exactly
/// (not float, double or struct), which must be `required` (a record without its key cannot
/// replace a row: it is a dead letter).
fn parse_upsert(
    t: &RawTable,
    name: &str,
    columns: &[ColumnSpec],
    at: &dyn Fn(std::ops::Range<usize>, String) -> Error,
) -> Result<Option<super::Upsert>> {
    let what = format!("table {name:?}");
    let upsert = parse_mode(t.mode.as_ref(), &what, at)?;
    let envelope = match &t.envelope {
        None => None,
        Some(e) if e.get_ref() == "debezium" => {
            if !upsert {
                return Err(at(
                    e.span(),
                    format!(
                        "table {name:?}: envelope = \"debezium\" applies to mode = \"upsert\" with a primary_key (a change event replaces or deletes its key's row)"
                    ),
                ));
            }
            if t.format.as_ref().is_some_and(|f| f.get_ref() == "protobuf") {
                return Err(at(
                    e.span(),
                    format!(
                        "table {name:?}: envelope = \"debezium\" reads change events in JSON (Kafka Connect's JSON converter, with or without schemas) or Avro behind a registry (format = \"avro\"); Protobuf change events are not read"
                    ),
                ));
            }
            if matches!(t.columns.get_ref(), RawColumns::Keyword(_)) {
                return Err(at(
                    t.columns.span(),
                    format!(
                        "table {name:?}: envelope = \"debezium\" needs its columns listed (the registry's schema is the change event's envelope, not the row); list the source table's columns"
                    ),
                ));
            }
            Some(super::Envelope::Debezium)
        }
        Some(e) => {
            return Err(at(
                e.span(),
                format!(
                    "table {name:?}: unknown envelope {:?}; use \"debezium\" (Debezium change events), or leave it out (the value is the row)",
                    e.get_ref()
                ),
            ));
        }
    };
    let Some(key) = upsert_key(
        t.primary_key.as_ref(),
        upsert,
        t.mode.as_ref().map_or(t.name.span(), |m| m.span()),
        &what,
        at,
    )?
    else {
        if let Some(r) = &t.rekey_from {
            return Err(at(
                r.span(),
                format!("{what}: rekey_from applies to mode = \"upsert\" with a primary_key"),
            ));
        }
        return Ok(None);
    };
    let rekey_from = rekey_from(t.rekey_from.as_ref(), key.get_ref(), &what, at)?;
    let fail = |m: String| Err(at(key.span(), format!("table {name:?}: {m}")));
    if !t.land {
        return fail(
            "mode = \"upsert\" needs the table to land (land = false keeps no rows to replace)"
                .into(),
        );
    }
    let names = key.get_ref();
    check_primary_key(names, columns, true)
        .map_err(|m| at(key.span(), format!("table {name:?}: {m}")))?;
    if envelope.is_some() {
        check_envelope_paths(names, columns)
            .map_err(|m| at(t.columns.span(), format!("table {name:?}: {m}")))?;
    }
    Ok(Some(super::Upsert {
        key: names.clone(),
        envelope,
        rekey_from,
    }))
}

/// An upsert table's `rekey_from`: the key it was kept by before `key` (empty: it was an
/// append table), at most [`super::MAX_PRIMARY_KEY_COLUMNS`] distinct names, not `key` itself.
pub(super) fn rekey_from(
    raw: Option<&Spanned<Vec<String>>>,
    key: &[String],
    what: &str,
    at: &dyn Fn(std::ops::Range<usize>, String) -> Error,
) -> Result<Option<Vec<String>>> {
    let Some(raw) = raw else { return Ok(None) };
    let names = raw.get_ref();
    let fail = |m: &str| Err(at(raw.span(), format!("{what}: rekey_from {m}")));
    if names.len() > super::MAX_PRIMARY_KEY_COLUMNS {
        return fail("names more columns than a key may have");
    }
    if names
        .iter()
        .enumerate()
        .any(|(i, n)| names[..i].contains(n))
    {
        return fail("names a column twice");
    }
    if names.as_slice() == key {
        return fail(
            "is the primary_key itself; remove it (it names the key the table was kept by before a change)",
        );
    }
    Ok(Some(names.clone()))
}

/// Whether `mode` (of the table `what` names, e.g. `table "orders"`) asks for an upsert table:
/// `"append"` (the default) or `"upsert"`.
pub(super) fn parse_mode(
    mode: Option<&Spanned<String>>,
    what: &str,
    at: &dyn Fn(std::ops::Range<usize>, String) -> Error,
) -> Result<bool> {
    match mode.map(|m| (m.get_ref().as_str(), m.span())) {
        None | Some(("append", _)) => Ok(false),
        Some(("upsert", _)) => Ok(true),
        Some((other, span)) => Err(at(
            span,
            format!(
                "{what}: unknown mode {other:?}; use \"append\" (the default: every row is kept) or \"upsert\" (the current row per primary_key)"
            ),
        )),
    }
}

/// The `primary_key` of an upsert table (`None` for an append table), refusing one without
/// the other; `mode_span` is where a missing key is pointed at.
pub(super) fn upsert_key<'a>(
    primary_key: Option<&'a Spanned<Vec<String>>>,
    upsert: bool,
    mode_span: std::ops::Range<usize>,
    what: &str,
    at: &dyn Fn(std::ops::Range<usize>, String) -> Error,
) -> Result<Option<&'a Spanned<Vec<String>>>> {
    match (primary_key, upsert) {
        (None, false) => Ok(None),
        (Some(k), false) => Err(at(
            k.span(),
            format!(
                "{what}: primary_key applies to mode = \"upsert\" (the current row per key); add it or remove primary_key"
            ),
        )),
        (None, true) => Err(at(
            mode_span,
            format!(
                "{what}: mode = \"upsert\" needs primary_key = [\"<column>\", ...], the columns that name a row"
            ),
        )),
        (Some(k), true) => Ok(Some(k)),
    }
}

/// Checks a Debezium table's column paths: `$.__op` and `$.__ts_ms` are the envelope's own
/// values (nothing inside them), `$.__source…` its `source`, and the key's columns come from
/// the row (`after`, `before`), not from the envelope.
fn check_envelope_paths(key: &[String], columns: &[ColumnSpec]) -> std::result::Result<(), String> {
    for c in columns.iter().flat_map(ColumnSpec::leaves) {
        let path = &c.path.0;
        match path.first().map(String::as_str) {
            Some(member @ ("__op" | "__ts_ms")) if path.len() > 1 => {
                return Err(format!(
                    "column {} reads {}, but $.{member} is the change event's {} (a value, nothing inside it)",
                    c.name,
                    c.path,
                    &member[2..]
                ));
            }
            Some("__op") if c.column_type != ColumnType::String => {
                return Err(format!(
                    "column {} reads $.__op, the change event's operation (c, u, r), which is a string",
                    c.name
                ));
            }
            Some(member) if member.starts_with("__") && key.contains(&c.name) => {
                return Err(format!(
                    "primary_key column {} reads {}, part of the envelope; a key column comes from the row (after, before)",
                    c.name, c.path
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks an upsert table's `primary_key` against its `columns`: 1 to 8 distinct top-level
/// columns compared exactly, each `required` when `needs_required` (a topic's table; a derived
/// table's columns come from its SQL). The message says what is wrong.
pub(super) fn check_primary_key(
    names: &[String],
    columns: &[ColumnSpec],
    needs_required: bool,
) -> std::result::Result<(), String> {
    if names.is_empty() {
        return Err("primary_key is empty; name the columns that identify a row".into());
    }
    if names.len() > super::MAX_PRIMARY_KEY_COLUMNS {
        return Err(format!(
            "primary_key has {} columns, more than the limit of {}",
            names.len(),
            super::MAX_PRIMARY_KEY_COLUMNS
        ));
    }
    for (i, k) in names.iter().enumerate() {
        if names[..i].contains(k) {
            return Err(format!("primary_key names {k:?} twice"));
        }
        let Some(c) = columns.iter().find(|c| &c.name == k) else {
            return Err(format!(
                "primary_key column {k:?} is not a column of the table (a key column is a top-level column)"
            ));
        };
        match c.column_type {
            ColumnType::Float | ColumnType::Double | ColumnType::Struct => {
                return Err(format!(
                    "primary_key column {k:?} is a {}, which is not compared exactly; use a string, integer, date, timestamp, decimal or boolean column",
                    c.column_type
                ));
            }
            _ => {}
        }
        if needs_required && !c.required {
            return Err(format!(
                "primary_key column {k:?} must be required (add required = true: a record without its key is a dead letter)"
            ));
        }
    }
    Ok(())
}
