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
//!
//! `kafka_headers = true` in a `[[tables]]` entry adds the records' headers to the table, as
//! the column `kafka_headers list<struct<key string, value binary>>` (see [`crate::kafka`]).

mod columns;
mod derived;
mod event_time;
mod load;
mod partitioning;
mod registry;
mod topics;

pub use derived::{
    Inferred, NoSql, PARTIALS_PLACEHOLDER, SqlError, SqlPlanner, derived_name, partials_table,
};
pub use event_time::{Dedup, EventTime, parse_duration_ms};

pub use columns::{ColumnSpec, ColumnType, JsonPath};
pub use load::is_identifier;
pub use registry::{FROM_REGISTRY, RegistryTable, ResolvedColumns, unresolved};
pub use topics::{TOPICS_ENV, parse_mapping};

use std::fmt;
use std::path::PathBuf;

#[cfg(test)]
use crate::error::Result;

/// Name of the table that receives every rejected record.
pub const DEAD_LETTER_TABLE: &str = "dead_letters";
/// Default limit on the decoded size of one record value.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1024 * 1024;
/// Default target size of compacted data files.
pub const DEFAULT_TARGET_FILE_SIZE_MB: u64 = 128;
/// Largest allowed target file size.
pub const MAX_TARGET_FILE_SIZE_MB: u64 = 512;

/// A validated pipeline spec.
#[derive(Debug, Clone)]
pub struct PipelineSpec {
    /// Where the spec was read from (for messages).
    pub origin: PathBuf,
    /// Settings shared by every table.
    pub settings: Settings,
    /// The schema registry Avro topics' schemas come from (`[registry]`).
    pub registry: RegistrySpec,
    /// The topics' tables, in file order (also those with `land = false`, which feed derived
    /// tables only).
    pub tables: Vec<TableSpec>,
    /// Reference tables that derived tables look values up in (`[[reference_tables]]`).
    pub references: Vec<ReferenceSpec>,
    /// Tables derived from a topic's rows by SQL (`[[derived_tables]]`), in file order.
    pub derived: Vec<DerivedSpec>,
}

/// Default: how often a reference table is re-read, in seconds.
pub const DEFAULT_REFRESH_SECONDS: u64 = 300;

/// A table that derived tables join to by key (`LEFT JOIN currency_rates r ON …`): an Iceberg
/// table in the same catalog that analysts maintain, read at cold start and re-read after
/// `refresh_seconds`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceSpec {
    /// Table name.
    pub name: String,
    /// The columns the pipeline reads (the table may have more).
    pub columns: Vec<ColumnSpec>,
    /// How long a loaded copy is used before it is read again.
    pub refresh_seconds: u64,
}

/// A table derived by SQL from the rows of one topic's table.
#[derive(Debug, Clone, PartialEq)]
pub struct DerivedSpec {
    /// The table as it lands: its columns inferred from the SQL, `topic` the source's topic.
    pub table: TableSpec,
    /// The table the SQL reads (a `[[tables]]` entry).
    pub source: String,
    /// The reference tables it joins to.
    pub references: Vec<String>,
    /// The SQL as written.
    pub sql: String,
    /// Line of the SQL in the spec file (for messages).
    pub line: usize,
    /// How long after a window closed a record still corrects it (`allowed_lateness`), ms.
    pub allowed_lateness_ms: i64,
    /// Duplicates dropped by key before the SQL runs (`dedup = { key = [...], within = ... }`).
    pub dedup: Option<Dedup>,
    /// For a windowed table: the name analysts query, and the SQL of the view that merges the
    /// per-partition partial rows of `table` (named `{name}_partials`) into one row per window
    /// and key.
    pub view: Option<ViewSpec>,
    /// For an interval join between two topics' tables: its plan, run by the scheduled stage
    /// (`source` is then the join's left side).
    pub join: Option<IntervalJoin>,
}

/// An interval join between two topics' tables, run by the scheduled stage over the rows each
/// commit round lands: `right.time - left.time` lies within `[lower_us, upper_us]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntervalJoin {
    /// The table in `FROM`.
    pub left: JoinSide,
    /// The table joined to it.
    pub right: JoinSide,
    /// Least `right.time - left.time`, µs.
    pub lower_us: i64,
    /// Greatest `right.time - left.time`, µs.
    pub upper_us: i64,
    /// The SQL run each round, over both sides' new and kept rows: the spec's SQL with
    /// `AND (l.__streamtable_new OR r.__streamtable_new)` added to the join condition, so that
    /// each pair is produced by the round in which its second row arrives.
    pub sql: String,
}

/// One side of an [`IntervalJoin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinSide {
    /// The topic's table.
    pub table: String,
    /// Its topic (dead letters name it).
    pub topic: String,
    /// Its event-time column (the one its watermark is on).
    pub time_column: String,
    /// Its watermark's out-of-orderness, µs.
    pub out_of_orderness_us: i64,
    /// Its table's `idle_timeout`, ms: a partition of this side that landed no row for this
    /// long stops holding the side's watermark back.
    pub idle_timeout_ms: i64,
}

/// Prefix of the columns carrying a joined row's Kafka columns (the left row's) in a round's
/// SQL.
pub const JOIN_KAFKA_PREFIX: &str = "__streamtable_";

/// The column marking a join side's rows that arrived in the current round.
pub const JOIN_NEW_COLUMN: &str = "__streamtable_new";

/// A view over a table: a name and its SQL, for `streamtable query` and for Athena (they differ
/// only where sketches merge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewSpec {
    /// The view's name (the derived table's name in the spec).
    pub name: String,
    /// `SELECT …` over the partial table, as `streamtable query` runs it.
    pub sql: String,
    /// The same for Athena.
    pub athena_sql: String,
    /// Its columns with their Athena (Trino) types, as a Glue view declares them.
    pub columns: Vec<(String, String)>,
}

/// Where Avro writer schemas come from (`[registry]`). Records framed for the AWS Glue Schema
/// Registry are looked up in Glue on the AWS backend whatever this says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrySpec {
    /// A Confluent-compatible registry (`https://…`), or `file:DIR` (a directory of
    /// `<schema id>.avsc` files, relative to the spec file). `STREAMTABLE_REGISTRY_URL`
    /// overrides it.
    pub url: Option<String>,
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
    /// Whether the topic lands in a table of its own (`land = false`: decoded only to feed
    /// derived tables).
    pub land: bool,
    /// The event-time column and how far out of order records arrive (`watermark = "created_at -
    /// INTERVAL '30' SECOND"`); needed by windows and dedup.
    pub event_time: Option<EventTime>,
    /// How the topic's record values are encoded (`format = "json" | "avro" | "protobuf"`).
    pub format: Format,
    /// The registry subject whose latest version gives the columns (`columns =
    /// "from-registry"`); such a table gains a column when a version adds a field, and never
    /// loses one.
    pub registry_subject: Option<String>,
    /// For a Protobuf registry table: the message whose fields are the columns (`message =
    /// "shop.Order"`; default the file's first message).
    pub registry_message: Option<String>,
    /// Whether the table has the records' headers in a `kafka_headers` column (`kafka_headers =
    /// true`; default false). Turning it off later keeps the column, with NULL in new rows.
    pub kafka_headers: bool,
    /// `mode = "upsert"` with `primary_key = [...]`: the table holds the current row of each
    /// key, the last record of a key replacing the row before it (`None`: every record is a row).
    pub upsert: Option<Upsert>,
}

/// What makes a table hold the current row per key (`mode = "upsert"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upsert {
    /// The key's columns (top-level, primitive, required), in the spec's order.
    pub key: Vec<String>,
    /// How the records wrap the row (`envelope = "debezium"`); `None`: the value is the row.
    pub envelope: Option<Envelope>,
    /// `rekey_from = [...]`: the key the table was kept by before `key` (empty: it was an
    /// append table), acknowledging that its current rows are re-keyed ([`Upsert::key_change`]).
    pub rekey_from: Option<Vec<String>>,
}

/// What an upsert table's spec does to the table's recorded key ([`Upsert::key_change`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyChange {
    /// The table has no rows or is kept by the spec's key already: nothing changes.
    Same,
    /// The spec re-keys the table's current rows, as its `rekey_from` acknowledges: the next
    /// commit keeps, per new key, the row of the latest Kafka position and deletes the others.
    Rekey {
        /// The key the table was kept by (empty: it was an append table).
        from: Vec<String>,
    },
    /// The spec changes the key without saying so: refused, with what to do.
    Refused(String),
}

/// The key a table is kept by, as the table records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedKey {
    /// No row yet, or no key recorded and no row: any key may start it.
    None,
    /// Rows kept by no key: an append table.
    Append,
    /// Rows kept by these columns.
    Key(Vec<String>),
}

impl Upsert {
    /// What this spec does to table `table`, whose rows are kept by `recorded`: the same key,
    /// a re-key its `rekey_from` acknowledges, or a refusal naming both keys and the ways on.
    pub fn key_change(&self, table: &str, recorded: &RecordedKey) -> KeyChange {
        let from = match recorded {
            RecordedKey::None => return KeyChange::Same,
            RecordedKey::Key(k) if *k == self.key => return KeyChange::Same,
            RecordedKey::Key(k) => k.clone(),
            RecordedKey::Append => Vec::new(),
        };
        if self.rekey_from.as_ref() == Some(&from) {
            return KeyChange::Rekey { from };
        }
        let list = |k: &[String]| {
            format!(
                "[{}]",
                k.iter()
                    .map(|c| format!("{c:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let what = if from.is_empty() {
            format!(
                "table {table} holds rows kept by no key (an append table), and the spec makes it mode = \"upsert\" with primary_key = {}",
                list(&self.key)
            )
        } else {
            format!(
                "table {table}'s primary_key changed from {} to {}",
                list(&from),
                list(&self.key)
            )
        };
        KeyChange::Refused(format!(
            "{what}: the next commit would keep one row per new key and delete the others. To re-key the table's current rows that way, add rekey_from = {} to its spec; to keep the table as it is, set primary_key back; for the new key in a table of its own, give it a new name (README, \"Changing a primary key\")",
            list(&from)
        ))
    }
}

/// How an upsert table's records wrap their row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope {
    /// Debezium change events (JSON with or without the converter's schemas, or Avro behind a
    /// registry): `after` is the row, `op` `d` a delete (see [`crate::decode::debezium`]).
    Debezium,
}

/// The most columns a primary key may have.
pub const MAX_PRIMARY_KEY_COLUMNS: usize = 8;

/// How a topic's record values are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// A JSON object per record (the default).
    #[default]
    Json,
    /// Avro binary behind a schema registry header (Confluent or AWS Glue); the writer's schema
    /// comes from the registry.
    Avro,
    /// Protobuf behind a schema registry header (Confluent with message indexes, or AWS Glue
    /// with a message index); the `.proto` schema comes from the registry.
    Protobuf,
}

impl Format {
    /// Parses `json`, `avro` or `protobuf`.
    pub fn parse(text: &str) -> Option<Format> {
        match text {
            "json" => Some(Format::Json),
            "avro" => Some(Format::Avro),
            "protobuf" => Some(Format::Protobuf),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Json => "json",
            Format::Avro => "avro",
            Format::Protobuf => "protobuf",
        })
    }
}

/// A partition field: a transform of a source column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionField {
    /// The Iceberg transform.
    pub transform: iceberg::spec::Transform,
    /// The column it applies to.
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

impl TableSpec {
    /// The primitive columns the decoders fill, in order: each column, or a struct column's
    /// fields depth first (see [`ColumnSpec::leaves`]).
    pub fn leaves(&self) -> Vec<ColumnSpec> {
        self.columns.iter().flat_map(ColumnSpec::leaves).collect()
    }
}

impl PipelineSpec {
    /// The table fed by `topic`, if any.
    pub fn table_for_topic(&self, topic: &str) -> Option<&TableSpec> {
        self.tables.iter().find(|t| t.topic == topic)
    }

    /// The table called `name`, if any.
    pub fn table(&self, name: &str) -> Option<&TableSpec> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Every table the pipeline writes: the topics' tables that land, then the derived tables
    /// (not `dead_letters`, not reference tables).
    pub fn landed_tables(&self) -> impl Iterator<Item = &TableSpec> {
        self.tables
            .iter()
            .filter(|t| t.land)
            .chain(self.derived.iter().map(|d| &d.table))
    }

    /// Keeps the topics' tables for which `keep` holds, and the derived tables fed by them.
    pub fn retain_tables(&mut self, keep: impl Fn(&TableSpec) -> bool) {
        self.tables.retain(|t| keep(t));
        let sources: Vec<String> = self.tables.iter().map(|t| t.name.clone()).collect();
        self.derived.retain(|d| {
            sources.contains(&d.source)
                && d.join
                    .as_ref()
                    .is_none_or(|j| sources.contains(&j.right.table))
        });
    }

    /// The derived tables fed by the table called `source` in the ingest function (interval
    /// joins run in the scheduled stage instead).
    pub fn derived_from<'a>(&'a self, source: &'a str) -> impl Iterator<Item = &'a DerivedSpec> {
        self.derived
            .iter()
            .filter(move |d| d.source == source && d.join.is_none())
    }
}

#[cfg(test)]
mod tests;
