//! `[[reference_tables]]` and `[[derived_tables]]`: their shape in the file and their checks.
//!
//! A derived table's columns are not written in the spec: they are inferred from its SQL by the
//! [`SqlPlanner`] the loader is given (the processing stage's planner), which also refuses every
//! construct the streaming runtime cannot run; its messages point at the line of the SQL where
//! the construct is. The model only defines what it needs from a planner ([`Inferred`]), so the
//! spec can be read by code that links no SQL engine ([`NoSql`] refuses derived tables).

use std::collections::HashSet;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::columns::{RawColumn, parse_columns};
use super::load::{check_target_size, is_identifier, line_col};
use super::*;
use crate::error::{Error, Result};

/// Why a derived table's SQL was refused, and where in the SQL (a byte offset) if known.
#[derive(Debug, Clone)]
pub struct SqlError {
    /// What is wrong and what to do instead.
    pub message: String,
    /// Byte offset into the SQL of the construct, when it can be located.
    pub at: Option<usize>,
}

/// What planning a derived table's SQL tells the spec.
#[derive(Debug, Clone)]
pub struct Inferred {
    /// The topic's table it reads.
    pub source: String,
    /// The reference tables it joins to.
    pub references: Vec<String>,
    /// Its columns and their types, in order (the Kafka columns come on top). For a windowed
    /// table, the columns of its partial rows.
    pub columns: Vec<(String, ColumnType)>,
    /// For a windowed table: the SQL of the view that merges its partial rows, over the table
    /// named [`PARTIALS_PLACEHOLDER`], for `streamtable query` and for Athena.
    pub view: Option<(String, String)>,
    /// The view's columns and their Athena (Trino) types.
    pub view_columns: Vec<(String, String)>,
    /// For an interval join between two topics' tables: how it runs.
    pub join: Option<IntervalJoin>,
}

/// Stands for the partial table's name in [`Inferred::view`].
pub const PARTIALS_PLACEHOLDER: &str = "{partials}";

/// The seam between the spec and the SQL planner: what the loader asks of a derived table's SQL.
pub trait SqlPlanner {
    /// Plans `sql` over the topics' `tables` and the `references`: its source, its columns, or
    /// why it cannot run on a stream.
    fn infer(
        &self,
        tables: &[TableSpec],
        references: &[ReferenceSpec],
        sql: &str,
    ) -> std::result::Result<Inferred, SqlError>;

    /// [`SqlPlanner::infer`] for a pipeline of `settings` (a planner may hold what the SQL
    /// computes to the spec's limits, such as `max_record_bytes`).
    fn infer_within(
        &self,
        tables: &[TableSpec],
        references: &[ReferenceSpec],
        sql: &str,
        settings: &Settings,
    ) -> std::result::Result<Inferred, SqlError> {
        let _ = settings;
        self.infer(tables, references, sql)
    }
}

/// A planner for builds without SQL processing: every derived table is refused, naming the fix.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSql;

impl SqlPlanner for NoSql {
    fn infer(
        &self,
        _tables: &[TableSpec],
        _references: &[ReferenceSpec],
        _sql: &str,
    ) -> std::result::Result<Inferred, SqlError> {
        Err(SqlError {
            message: "this build of streamtable has no SQL processing (feature `sql`); use a build with it, or remove [[derived_tables]]".into(),
            at: None,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReference {
    name: Spanned<String>,
    columns: Vec<Spanned<RawColumn>>,
    refresh_seconds: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDerived {
    name: Spanned<String>,
    sql: Spanned<String>,
    #[serde(default)]
    partition_by: Vec<Spanned<String>>,
    target_file_size_mb: Option<Spanned<u64>>,
    allowed_lateness: Option<Spanned<String>>,
    dedup: Option<Spanned<RawDedup>>,
    /// `"append"` (the default) or `"upsert"`.
    mode: Option<Spanned<String>>,
    /// The key of an upsert table.
    primary_key: Option<Spanned<Vec<String>>>,
    /// The key an upsert table was kept by before `primary_key` (acknowledges a re-key).
    rekey_from: Option<Spanned<Vec<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDedup {
    key: Vec<String>,
    within: String,
}

/// What checking a derived table needs from the rest of the spec.
pub(super) struct Context<'a> {
    pub text: &'a str,
    pub planner: &'a dyn SqlPlanner,
    pub tables: &'a [TableSpec],
    pub references: &'a [ReferenceSpec],
    pub settings: &'a Settings,
}

fn check_name(
    name: &Spanned<String>,
    names: &mut HashSet<String>,
    at: &impl Fn(Range<usize>, String) -> Error,
) -> Result<()> {
    let n = name.get_ref();
    if !is_identifier(n) {
        return Err(at(
            name.span(),
            format!(
                "table name {n:?} is not a lowercase identifier; use letters a-z, digits and _ (Athena lowercases names)"
            ),
        ));
    }
    if n == DEAD_LETTER_TABLE {
        return Err(at(
            name.span(),
            format!(
                "table name {DEAD_LETTER_TABLE:?} is reserved for rejected records; choose another name"
            ),
        ));
    }
    if !names.insert(n.clone()) {
        return Err(at(
            name.span(),
            format!("table {n:?} is defined twice; table names must be unique"),
        ));
    }
    Ok(())
}

pub(super) fn parse_references(
    raw: &[Spanned<RawReference>],
    names: &mut HashSet<String>,
    at: &impl Fn(Range<usize>, String) -> Error,
) -> Result<Vec<ReferenceSpec>> {
    let mut out = Vec::new();
    for r in raw {
        let r = r.get_ref();
        check_name(&r.name, names, at)?;
        if let Some(c) = r.columns.iter().find(|c| c.get_ref().path.is_some()) {
            return Err(at(
                c.span(),
                "reference table columns are read from the table by name; remove `path`".into(),
            ));
        }
        let columns = parse_columns(&r.columns, &r.name, at)?;
        let refresh_seconds = match &r.refresh_seconds {
            Some(v) if *v.get_ref() == 0 || *v.get_ref() > 86_400 => {
                return Err(at(
                    v.span(),
                    "refresh_seconds must be between 1 and 86400 (a day)".into(),
                ));
            }
            Some(v) => *v.get_ref(),
            None => DEFAULT_REFRESH_SECONDS,
        };
        out.push(ReferenceSpec {
            name: r.name.get_ref().clone(),
            columns,
            refresh_seconds,
        });
    }
    Ok(out)
}

pub(super) fn parse_derived(
    raw: &[Spanned<RawDerived>],
    cx: Context<'_>,
    names: &mut HashSet<String>,
    at: &impl Fn(Range<usize>, String) -> Error,
    at_line: &impl Fn(usize, usize, String) -> Error,
) -> Result<Vec<DerivedSpec>> {
    let mut out = Vec::new();
    for d in raw {
        let d = d.get_ref();
        check_name(&d.name, names, at)?;
        let name = d.name.get_ref();
        let sql = d.sql.get_ref();
        let (line, content_line) = sql_position(cx.text, d.sql.span());
        let inferred = cx
            .planner
            .infer_within(cx.tables, cx.references, sql, cx.settings)
            .map_err(|e| {
                let (l, c) = match e.at {
                    Some(offset) => {
                        let (l, c) = line_col(sql, offset);
                        (content_line + l - 1, c)
                    }
                    None => (line, 1),
                };
                at_line(
                    l,
                    c,
                    format!(
                        "derived table {name:?}: {}",
                        without_sql_position(&e.message)
                    ),
                )
            })?;
        if let (Some(_), Some(raw)) = (&inferred.join, &d.dedup) {
            return Err(at(
                raw.span(),
                format!(
                    "derived table {name:?}: dedup applies to one topic's rows, not to an interval join; deduplicate in a derived table of each side"
                ),
            ));
        }
        let source_spec = cx.tables.iter().find(|t| t.name == inferred.source);
        let dedup = match &d.dedup {
            Some(raw) => {
                Some(parse_dedup(raw.get_ref(), source_spec, name).map_err(|m| at(raw.span(), m))?)
            }
            None => None,
        };
        let allowed_lateness_ms = match &d.allowed_lateness {
            Some(_) if inferred.view.is_none() => {
                return Err(at(
                    d.name.span(),
                    format!(
                        "derived table {name:?}: allowed_lateness applies to windowed tables (FROM TABLE(TUMBLE(…)), HOP or SESSION); remove it"
                    ),
                ));
            }
            Some(v) => parse_duration_ms(v.get_ref()).map_err(|m| at(v.span(), m))?,
            None => 0,
        };
        let table_name = match &inferred.view {
            Some(_) => {
                let partials = partials_table(name);
                if !names.insert(partials.clone()) {
                    return Err(at(
                        d.name.span(),
                        format!(
                            "windowed table {name:?} keeps its partial rows in table {partials:?}, which is defined elsewhere; rename one"
                        ),
                    ));
                }
                partials
            }
            None => name.clone(),
        };
        let columns: Vec<ColumnSpec> = inferred
            .columns
            .iter()
            .map(|(n, ty)| ColumnSpec::optional(n, *ty))
            .collect();
        let partition_by =
            super::partitioning::parse_partitioning(&d.partition_by, &columns, name, at)?;
        let target_file_size_mb = match &d.target_file_size_mb {
            Some(v) => check_target_size(v).map_err(|m| at(v.span(), m))?,
            None => cx.settings.target_file_size_mb,
        };
        let upsert = parse_upsert(
            d,
            &columns,
            inferred.view.is_some() || inferred.join.is_some(),
            at,
        )?;
        let topic = source_spec.map(|t| t.topic.clone()).unwrap_or_default();
        out.push(DerivedSpec {
            table: TableSpec {
                name: table_name.clone(),
                topic,
                columns,
                partition_by,
                target_file_size_mb,
                land: true,
                event_time: None,
                format: super::Format::Json,
                registry_subject: None,
                registry_message: None,
                kafka_headers: false,
                upsert,
            },
            source: inferred.source,
            references: inferred.references,
            sql: sql.clone(),
            line,
            allowed_lateness_ms,
            dedup,
            view: inferred.view.map(|(sql, athena_sql)| ViewSpec {
                name: name.clone(),
                sql: sql.replace(PARTIALS_PLACEHOLDER, &table_name),
                athena_sql: athena_sql.replace(PARTIALS_PLACEHOLDER, &table_name),
                columns: inferred.view_columns.clone(),
            }),
            join: inferred.join,
        });
    }
    Ok(out)
}

/// `mode = "upsert"` with `primary_key` on a derived table: its rows replace the row of their
/// key by the source record's Kafka position, as a topic's upsert table's records do. Not for a
/// windowed table or an interval join (`stateful`), whose rows are not one record's.
fn parse_upsert(
    d: &RawDerived,
    columns: &[ColumnSpec],
    stateful: bool,
    at: &impl Fn(Range<usize>, String) -> Error,
) -> Result<Option<super::Upsert>> {
    let name = d.name.get_ref();
    let what = format!("derived table {name:?}");
    let upsert = super::load::parse_mode(d.mode.as_ref(), &what, at)?;
    if upsert
        && stateful
        && let Some(m) = &d.mode
    {
        return Err(at(
            m.span(),
            format!(
                "{what}: mode = \"upsert\" applies to a derived table whose rows are each one record's (SELECT … FROM a topic's table [JOIN a reference table] [WHERE …]), not to a window or an interval join"
            ),
        ));
    }
    let mode_span = d.mode.as_ref().map_or(d.name.span(), |m| m.span());
    let Some(key) = super::load::upsert_key(d.primary_key.as_ref(), upsert, mode_span, &what, at)?
    else {
        if let Some(r) = &d.rekey_from {
            return Err(at(
                r.span(),
                format!("{what}: rekey_from applies to mode = \"upsert\" with a primary_key"),
            ));
        }
        return Ok(None);
    };
    super::load::check_primary_key(key.get_ref(), columns, false)
        .map_err(|m| at(key.span(), format!("{what}: {m}")))?;
    let rekey_from = super::load::rekey_from(d.rekey_from.as_ref(), key.get_ref(), &what, at)?;
    Ok(Some(super::Upsert {
        key: key.get_ref().clone(),
        envelope: None,
        rekey_from,
    }))
}

/// The suffix of the table that holds a windowed table's partial rows.
const PARTIALS_SUFFIX: &str = "_partials";

/// The table that holds the partial rows of windowed table `name` (`orders_per_minute` →
/// `orders_per_minute_partials`); the merging view keeps `name`.
pub fn partials_table(name: &str) -> String {
    format!("{name}{PARTIALS_SUFFIX}")
}

/// The derived table's name as the spec writes it, from the table its rows land in: a windowed
/// table's partial table answers with the window's name (what messages and dead letters say),
/// any other table with its own.
pub fn derived_name(table: &str) -> &str {
    table.strip_suffix(PARTIALS_SUFFIX).unwrap_or(table)
}

fn parse_dedup(
    raw: &RawDedup,
    source: Option<&TableSpec>,
    name: &str,
) -> std::result::Result<Dedup, String> {
    let Some(source) = source else {
        return Err(format!(
            "derived table {name:?}: dedup needs a topic's table as source"
        ));
    };
    if source.event_time.is_none() {
        return Err(format!(
            "derived table {name:?}: dedup bounds keys in event time; add watermark = \"<timestamp column> - INTERVAL '30' SECOND\" to table {:?}",
            source.name
        ));
    }
    if raw.key.is_empty() {
        return Err(format!(
            "derived table {name:?}: dedup needs at least one key column"
        ));
    }
    for k in &raw.key {
        if !source.columns.iter().any(|c| &c.name == k) {
            return Err(format!(
                "derived table {name:?}: dedup key {k:?} is not a column of {:?}",
                source.name
            ));
        }
    }
    let within_ms = parse_duration_ms(&raw.within)?;
    if within_ms == 0 {
        return Err(format!(
            "derived table {name:?}: dedup within must be more than 0"
        ));
    }
    Ok(Dedup {
        key: raw.key.clone(),
        within_ms,
    })
}

/// A SQL error's message without the parser's `at Line: L, Column: C` (counted in the SQL
/// string): the error names the spec's line and column instead.
fn without_sql_position(message: &str) -> String {
    let Some(at) = message.find(" at Line: ") else {
        return message.to_string();
    };
    let rest = &message[at + " at Line: ".len()..];
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let line_len = digits(rest);
    let Some(after) = rest[line_len..].strip_prefix(", Column: ") else {
        return message.to_string();
    };
    let col_len = digits(after);
    if line_len == 0 || col_len == 0 {
        return message.to_string();
    }
    format!("{}{}", &message[..at], &after[col_len..])
}

/// Line of the `sql = …` value, and the line its first character of SQL is on (a multi-line
/// string's first newline is not part of the value).
fn sql_position(text: &str, span: Range<usize>) -> (usize, usize) {
    let (line, _) = line_col(text, span.start);
    let raw = text.get(span).unwrap_or("");
    let skips_newline =
        (raw.starts_with("\"\"\"") || raw.starts_with("'''")) && raw[3..].starts_with(['\n', '\r']);
    (line, line + usize::from(skips_newline))
}

#[cfg(test)]
mod position_tests {
    #[test]
    fn the_parsers_position_in_the_sql_gives_way_to_the_specs() {
        assert_eq!(
            super::without_sql_position(
                "ParserError(\"Expected: end of statement, found: . at Line: 1, Column: 20\")"
            ),
            "ParserError(\"Expected: end of statement, found: .\")"
        );
        assert_eq!(super::without_sql_position("no position"), "no position");
        assert_eq!(
            super::without_sql_position("odd at Line: x, Column: 2"),
            "odd at Line: x, Column: 2"
        );
    }
}
