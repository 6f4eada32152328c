//! Tables whose columns come from a schema registry (`columns = "from-registry"`).
//!
//! Such a spec is read in two passes: [`PipelineSpec::registry_tables`] lists the subjects to
//! look up; the registry's latest versions give their columns; [`PipelineSpec::parse_resolved`]
//! then validates the whole spec with those columns in place. A spec with such a table cannot
//! be parsed without them, so no table is ever built from a column list nobody resolved.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use toml::Spanned;

use super::columns::RawColumn;
use super::{ColumnSpec, Format, PipelineSpec, RegistrySpec, SqlPlanner};
use crate::error::{Error, Result};

/// The keyword of `columns = "from-registry"`.
pub const FROM_REGISTRY: &str = "from-registry";

/// A table's `columns`: listed, or a keyword.
pub(super) enum RawColumns {
    Listed(Vec<Spanned<RawColumn>>),
    Keyword(String),
}

impl<'de> Deserialize<'de> for RawColumns {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawColumns;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(
                    f,
                    "a list of columns, or \"{FROM_REGISTRY}\" (columns from the registry schema)"
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<RawColumns, E> {
                Ok(RawColumns::Keyword(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                seq: A,
            ) -> std::result::Result<RawColumns, A::Error> {
                Vec::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(RawColumns::Listed)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A table whose columns come from a registry subject's latest version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryTable {
    /// The table.
    pub table: String,
    /// Its topic.
    pub topic: String,
    /// Its format (Avro or Protobuf).
    pub format: Format,
    /// The subject: Confluent `<topic>-value` by default, or Glue `registry/schema`.
    pub subject: String,
    /// The Protobuf message whose fields are the columns (default: the file's first).
    pub message: Option<String>,
}

/// Columns of registry tables, by table name, as the registry (and the catalog) gave them.
pub type ResolvedColumns = BTreeMap<String, Vec<ColumnSpec>>;

#[derive(Deserialize)]
struct RawTables {
    #[serde(default)]
    tables: Vec<RawRegistryTable>,
    registry: Option<RawUrl>,
}

#[derive(Deserialize)]
struct RawUrl {
    url: Spanned<String>,
}

#[derive(Deserialize)]
struct RawRegistryTable {
    name: String,
    topic: String,
    columns: Option<RawColumns>,
    format: Option<String>,
    subject: Option<String>,
    message: Option<String>,
}

impl PipelineSpec {
    /// The registry and the tables of a spec's text whose columns come from it. Only what this
    /// needs is read: [`PipelineSpec::parse_resolved`] validates the rest, with messages.
    pub fn registry_tables(
        text: &str,
        origin: &Path,
    ) -> Result<(RegistrySpec, Vec<RegistryTable>)> {
        // A spec this pass cannot read is left to the full parse to explain.
        let Ok(raw) = toml::from_str::<RawTables>(text) else {
            return Ok((RegistrySpec::default(), Vec::new()));
        };
        let registry = match &raw.registry {
            Some(r) => RegistrySpec {
                url: super::load::parse_registry_url(&r.url, origin).ok(),
            },
            None => RegistrySpec::default(),
        };
        let tables = raw
            .tables
            .into_iter()
            .filter(|t| matches!(&t.columns, Some(RawColumns::Keyword(k)) if k == FROM_REGISTRY))
            .filter_map(|t| {
                let format = Format::parse(t.format.as_deref()?)?;
                let subject = t.subject.unwrap_or_else(|| format!("{}-value", t.topic));
                Some(RegistryTable {
                    table: t.name,
                    topic: t.topic,
                    format,
                    subject,
                    message: t.message,
                })
            })
            .filter(|t| t.format != Format::Json)
            .collect();
        Ok((registry, tables))
    }

    /// Validates a spec whose registry tables' columns are `resolved`.
    pub fn parse_resolved(
        text: &str,
        origin: &Path,
        resolved: &ResolvedColumns,
        planner: &dyn SqlPlanner,
    ) -> Result<PipelineSpec> {
        super::load::parse_spec(text, origin, resolved, planner)
    }
}

/// The columns of table `name` from `columns = "..."` (a keyword) with `format`: the resolved
/// ones, or why there are none.
pub(super) fn keyword_columns(
    keyword: &str,
    name: &str,
    format: Format,
    resolved: &ResolvedColumns,
) -> std::result::Result<Vec<ColumnSpec>, String> {
    if keyword != FROM_REGISTRY {
        return Err(format!(
            "columns = {keyword:?} is not a column list; list the columns, or write columns = \"{FROM_REGISTRY}\" for an Avro or Protobuf topic"
        ));
    }
    if format == Format::Json {
        return Err(format!(
            "table {name:?}: columns = \"{FROM_REGISTRY}\" needs format = \"avro\" or \"protobuf\" (a JSON topic has no registry schema); list the columns instead"
        ));
    }
    resolved.get(name).cloned().ok_or_else(|| {
        format!(
            "table {name:?} takes its columns from the schema registry, which was not read here; run a command that reads the registry (streamtable check, ingest, run) with the registry reachable"
        )
    })
}

/// A registry table's columns could not be resolved: the message names the spec and the table.
pub fn unresolved(origin: &Path, table: &RegistryTable, why: &str) -> Error {
    Error::Spec(format!(
        "{}: table {:?}: columns = \"{FROM_REGISTRY}\" (subject {:?}): {why}",
        origin.display(),
        table.table,
        table.subject
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ColumnType;

    const TEXT: &str = r#"
[registry]
url = "file:schemas"

[[tables]]
name = "orders"
topic = "orders"
format = "avro"
columns = "from-registry"
partition_by = ["day(created_at)"]

[[tables]]
name = "clicks"
topic = "clicks"
format = "protobuf"
columns = "from-registry"
subject = "reg/clicks"
message = "web.Click"

[[tables]]
name = "plain"
topic = "plain"
columns = [{ name = "id", type = "string" }]
"#;

    fn col(name: &str, ty: &str) -> ColumnSpec {
        ColumnSpec::optional(name, ColumnType::parse(ty).expect("type"))
    }

    #[test]
    fn registry_tables_are_listed_with_their_subjects() {
        let (registry, tables) =
            PipelineSpec::registry_tables(TEXT, Path::new("/p/pipeline.toml")).expect("tables");
        assert_eq!(registry.url.as_deref(), Some("file:/p/schemas"));
        let listed: Vec<(&str, &str, Format, Option<&str>)> = tables
            .iter()
            .map(|t| {
                (
                    t.table.as_str(),
                    t.subject.as_str(),
                    t.format,
                    t.message.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("orders", "orders-value", Format::Avro, None),
                ("clicks", "reg/clicks", Format::Protobuf, Some("web.Click"))
            ]
        );
    }

    #[test]
    fn a_registry_table_is_validated_with_its_resolved_columns() {
        let resolved = ResolvedColumns::from([
            (
                "orders".to_string(),
                vec![col("order_id", "string"), col("created_at", "timestamp")],
            ),
            ("clicks".to_string(), vec![col("url", "string")]),
        ]);
        let spec =
            PipelineSpec::parse_resolved(TEXT, Path::new("p.toml"), &resolved, &crate::spec::NoSql)
                .expect("resolved spec");
        assert_eq!(spec.tables[0].columns.len(), 2);
        assert_eq!(
            spec.tables[0].registry_subject.as_deref(),
            Some("orders-value")
        );
        assert_eq!(spec.tables[2].registry_subject, None);

        // Without them, the spec is refused (no table is ever built from no columns).
        let e = PipelineSpec::parse(TEXT, Path::new("p.toml"), &crate::spec::NoSql)
            .expect_err("unresolved");
        assert!(e.to_string().contains("p.toml:9:11"), "{e}");
        assert!(e.to_string().contains("registry"), "{e}");

        // Partitioning is checked against the registry's columns.
        let without_time =
            ResolvedColumns::from([("orders".to_string(), vec![col("order_id", "string")])]);
        let e = PipelineSpec::parse_resolved(
            TEXT,
            Path::new("p.toml"),
            &without_time,
            &crate::spec::NoSql,
        )
        .expect_err("no created_at");
        assert!(e.to_string().contains("created_at"), "{e}");
    }

    #[test]
    fn misuse_is_refused_with_the_fix() {
        let json = TEXT.replace("format = \"avro\"\n", "");
        let e =
            PipelineSpec::parse(&json, Path::new("p.toml"), &crate::spec::NoSql).expect_err("json");
        assert!(e.to_string().contains("needs format = \"avro\""), "{e}");
        let typo = TEXT.replace(
            "\"from-registry\"\npartition",
            "\"from-registy\"\npartition",
        );
        let e =
            PipelineSpec::parse(&typo, Path::new("p.toml"), &crate::spec::NoSql).expect_err("typo");
        assert!(e.to_string().contains("is not a column list"), "{e}");
        let subject = TEXT.replace(
            "columns = [{ name = \"id\", type = \"string\" }]",
            "columns = [{ name = \"id\", type = \"string\" }]\nsubject = \"x\"",
        );
        let e = PipelineSpec::parse_resolved(
            &subject,
            Path::new("p.toml"),
            &ResolvedColumns::from([
                ("orders".to_string(), vec![col("created_at", "timestamp")]),
                ("clicks".to_string(), vec![col("url", "string")]),
            ]),
            &crate::spec::NoSql,
        )
        .expect_err("subject on a listed table");
        assert!(e.to_string().contains("subject applies to"), "{e}");
        let on_avro = TEXT.replace(
            "columns = \"from-registry\"\npartition_by",
            "columns = \"from-registry\"\nmessage = \"x.Y\"\npartition_by",
        );
        let e = PipelineSpec::parse(&on_avro, Path::new("p.toml"), &crate::spec::NoSql)
            .expect_err("avro message");
        assert!(
            e.to_string().contains("applies to format = \"protobuf\""),
            "{e}"
        );
    }
}
