//! `streamtable check`: validates the pipeline spec (every derived table's SQL planned as the
//! ingest function plans it) and prints what will run, per table — the way `terraform plan`
//! shows what will happen. Exit code 0 when the spec is valid, 1 otherwise.

use std::fmt::Write;

use crate::backend::{Backend, BackendConfig};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kafka;
use crate::process::Processor;
use crate::spec::{ColumnSpec, ColumnType, Format, PartitionField, PipelineSpec};
use crate::tables::{TableSet, check_partition_spec, plan_for};

/// Loads, plans and prints the spec of `config`, then what it changes in the catalog's tables
/// (like `terraform plan`). Fails when a change would be refused.
pub async fn run(config: &Config, allow_state_reset: bool) -> Result<()> {
    let no_catalog = match &config.backend {
        BackendConfig::Embedded { home } if !home.join("catalog.db").exists() => Some(home),
        _ => None,
    };
    let backend = match no_catalog {
        Some(_) => None,
        None => Some(Backend::connect(&config.backend).await?),
    };
    let (text, origin) = config.pipeline_text()?;
    let (spec, from_registry) =
        crate::registry::resolve::load_spec_detailed(&text, &origin, backend.as_ref()).await?;
    let processor = Processor::new(&spec)?;
    print!("{}", render(&spec, &processor));
    for r in &from_registry {
        print!("{}", render_resolution(r));
    }
    let Some(backend) = backend else {
        if let Some(home) = no_catalog {
            println!(
                "\ncatalog: none at {} yet; every table is created from the spec on first use",
                home.display()
            );
        }
        return Ok(());
    };
    let tables = TableSet::new(&spec, &backend.namespace)?;
    let (text, refused) = catalog_plan(&backend, &tables).await?;
    print!("{text}");
    let (text, mut resets) = state_plan(&backend, &spec, &processor, allow_state_reset).await?;
    print!("{text}");
    for (name, join) in &tables.joins {
        let Some((table, _)) = backend.catalog.load(&tables.ident(name)).await? else {
            continue;
        };
        if let Some(line) = crate::commit::join::state_change(&table, name, join)? {
            let refused = line.starts_with('!');
            if refused && !allow_state_reset {
                resets += 1;
            }
            println!(
                "\nstate of interval join {name}:\n  {line}{}",
                if refused && allow_state_reset {
                    " (accepted: --allow-state-reset)"
                } else {
                    ""
                }
            );
        }
    }
    if refused > 0 {
        return Err(Error::Spec(format!(
            "{refused} table(s) cannot take the spec's changes (lines starting with !); fix the spec before deploying"
        )));
    }
    if resets > 0 {
        return Err(Error::Spec(format!(
            "{resets} stateful table(s) would lose their open state (lines starting with !); deploy the new SQL under a new table name, or accept the loss with --allow-state-reset"
        )));
    }
    Ok(())
}

/// What the spec's stateful tables do with the state live in the partitions (read only), and
/// how many would drop state the new SQL cannot read (unless `allow_reset`).
pub async fn state_plan(
    backend: &Backend,
    spec: &PipelineSpec,
    processor: &Processor,
    allow_reset: bool,
) -> Result<(String, usize)> {
    let mut out = String::new();
    let mut resets = 0;
    for t in &spec.tables {
        if !processor.is_stateful(&t.name) {
            continue;
        }
        let mut changes = crate::process::partition_state::StateChanges::default();
        for (source, stored) in backend.state.topic_states(&t.topic).await? {
            let Some(stored) = stored else { continue };
            let state =
                crate::ingest::read_stored_state(&backend.warehouse, &source, &stored).await?;
            processor.state_changes(&t.name, &state, &mut changes);
        }
        if changes.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "\nstate of {}'s stateful tables ({} partitions with state):",
            t.name, changes.partitions
        );
        for line in changes.lines() {
            let refused = line.starts_with('!');
            if refused && !allow_reset {
                resets += 1;
            }
            let _ = writeln!(
                out,
                "  {}{}",
                line,
                if refused && allow_reset {
                    " (accepted: --allow-state-reset)"
                } else {
                    ""
                }
            );
        }
    }
    Ok((out, resets))
}

/// What the spec changes in each table the catalog has (read only: nothing is evolved here),
/// and how many tables would refuse it.
pub async fn catalog_plan(backend: &Backend, tables: &TableSet) -> Result<(String, usize)> {
    let mut out = format!(
        "\nchanges to the catalog (namespace {}):\n",
        tables.namespace
    );
    let mut refused = 0;
    for (name, def) in &tables.tables {
        let Some(spec) = &def.spec else { continue };
        let Some((table, _)) = backend.catalog.load(&tables.ident(name)).await? else {
            let _ = writeln!(out, "  table {name}: + created on first use");
            continue;
        };
        let mut lines = Vec::new();
        if let Err(e) = check_partition_spec(name, &table, &def.layout) {
            lines.push(format!("! partitioning — refused: {e}"));
        }
        let plan = plan_for(&table, spec);
        lines.extend(crate::schema::evolve::describe(&plan));
        lines.extend(key_lines(&table, name, spec).await?);
        if lines.iter().any(|l| l.starts_with('!')) {
            refused += 1;
        }
        if lines.is_empty() {
            let _ = writeln!(out, "  table {name}: no change");
        } else {
            let _ = writeln!(out, "  table {name}:");
            for l in lines {
                let _ = writeln!(out, "    {l}");
            }
        }
    }
    Ok((out, refused))
}

/// What the spec does to the key table `name`'s rows are kept by: a refused change (a
/// `primary_key` changed, an append table made an upsert table, without `rekey_from`), an
/// acknowledged re-key, an upsert table made an append table.
async fn key_lines(
    table: &iceberg::table::Table,
    name: &str,
    spec: &crate::spec::TableSpec,
) -> Result<Vec<String>> {
    use crate::spec::{KeyChange, RecordedKey};
    let recorded = crate::upsert::recorded_key(table).await?;
    let list = |k: &[String]| format!("[{}]", k.join(", "));
    Ok(match (&spec.upsert, &recorded) {
        (Some(u), recorded) => match u.key_change(name, recorded) {
            KeyChange::Same
                if u.rekey_from.is_some() && matches!(recorded, RecordedKey::Key(_)) =>
            {
                vec![format!(
                    "  primary_key {}: rekey_from is spent (the table is kept by this key); remove it",
                    list(&u.key)
                )]
            }
            KeyChange::Same => Vec::new(),
            KeyChange::Rekey { from } => vec![format!(
                "~ primary_key {} → {}: the table's current rows are re-keyed at the next commit (rekey_from): per new key the row of the latest Kafka position is kept, the others deleted",
                if from.is_empty() {
                    "(none: an append table)".to_string()
                } else {
                    list(&from)
                },
                list(&u.key)
            )],
            KeyChange::Refused(why) => vec![format!("! primary_key — refused: {why}")],
        },
        (None, RecordedKey::Key(k)) => vec![format!(
            "~ mode upsert → append (was primary_key {}): the rows stay as they are; later records are added, none replaces another",
            list(k)
        )],
        (None, _) => Vec::new(),
    })
}

/// Where a registry table's columns came from, and the fields that are not columns.
fn render_resolution(r: &crate::registry::resolve::Resolution) -> String {
    let mut out = format!(
        "\ntable {}: columns from the registry: subject {}, latest version {} ({} columns)\n",
        r.table.table,
        r.table.subject,
        r.id,
        r.schema.columns.len()
    );
    for s in &r.schema.skipped {
        let _ = writeln!(out, "    not a column: {s}");
    }
    for k in &r.kept {
        let _ = writeln!(
            out,
            "    kept: {k} (in the table, not in the latest version: NULL for records without it)"
        );
    }
    out
}

fn columns(out: &mut String, columns: &[ColumnSpec], with_paths: bool) {
    // A struct column: its line, then its fields' (`customer.id`) with their full paths.
    let lines: Vec<ColumnSpec> = columns
        .iter()
        .flat_map(|c| match c.column_type {
            ColumnType::Struct => [vec![c.clone()], c.leaves()].concat(),
            _ => vec![c.clone()],
        })
        .collect();
    for c in &lines {
        let _ = write!(out, "    {:<16} {}", c.name, c.column_type);
        if c.required {
            out.push_str(" required");
        }
        if with_paths && !c.path.0.iter().map(String::as_str).eq(c.name.split('.')) {
            let _ = write!(out, "  from {}", c.path);
        }
        out.push('\n');
    }
}

/// `partitioned by day(created_at)`, or `unpartitioned`.
fn partitioning(fields: &[PartitionField]) -> String {
    if fields.is_empty() {
        return "unpartitioned".into();
    }
    let by: Vec<String> = fields
        .iter()
        .map(|f| format!("{}({})", f.transform, f.source))
        .collect();
    format!("partitioned by {}", by.join(", "))
}

/// How a topic's values are decoded, and where a registry format's schemas come from.
fn format(format: Format, spec: &PipelineSpec) -> String {
    let name = match format {
        Format::Json => return "JSON".into(),
        Format::Avro => "Avro",
        Format::Protobuf => "Protobuf",
    };
    let confluent = match &spec.registry.url {
        Some(url) => format!("Confluent-framed records' schemas from {url}"),
        None => "no [registry] url: Confluent-framed records are unknown_schema dead letters unless STREAMTABLE_REGISTRY_URL is set".into(),
    };
    format!(
        "{name} behind a schema registry ({confluent}; Glue-framed ones' from the Glue Schema Registry on the aws backend)"
    )
}

/// The plan of `spec` as text.
pub fn render(spec: &PipelineSpec, processor: &Processor) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "pipeline spec {}: valid\n", spec.origin.display());
    for t in &spec.tables {
        let derived: Vec<&str> = spec
            .derived_from(&t.name)
            .map(|d| d.table.name.as_str())
            .collect();
        let feeds = if derived.is_empty() {
            String::new()
        } else {
            format!("; feeds {}", derived.join(", "))
        };
        if t.land {
            let _ = writeln!(out, "table {} <- topic {}{feeds}", t.name, t.topic);
            let lands = match &t.upsert {
                None => "lands as is (append)".to_string(),
                Some(u) => format!(
                    "upsert: keeps the current row per key ({}){}, a tombstone deletes its key; superseded rows are deleted by the commit",
                    u.key.join(", "),
                    match u.envelope {
                        Some(e) => format!(", records in the {e:?} envelope").to_lowercase(),
                        None => String::new(),
                    }
                ),
            };
            let _ = writeln!(
                out,
                "  runs: decoded from {} in the ingest function, {lands}; {}",
                format(t.format, spec),
                partitioning(&t.partition_by)
            );
        } else {
            let _ = writeln!(
                out,
                "source {} <- topic {}{feeds} (land = false: no table of its own)",
                t.name, t.topic
            );
        }
        out.push_str("  columns:\n");
        columns(&mut out, &t.columns, true);
        let _ = writeln!(out, "    + {}\n", kafka::NAMES.join(", "));
    }
    for d in &spec.derived {
        let over = match &d.join {
            Some(j) => format!("{} and {} (interval join)", j.left.table, j.right.table),
            None => d.source.clone(),
        };
        let _ = writeln!(
            out,
            "table {} <- SQL over {over} (line {})",
            d.table.name, d.line
        );
        if let Some(how) = processor.describe(&d.table.name) {
            let _ = writeln!(out, "  runs: {how}");
        }
        let _ = writeln!(out, "  {}", partitioning(&d.table.partition_by));
        out.push_str("  sql:\n");
        for line in d.sql.trim().lines() {
            let _ = writeln!(out, "    {line}");
        }
        if d.view.is_some() {
            out.push_str("  columns of the partial rows (inferred, all optional):\n");
        } else {
            out.push_str("  columns (inferred, all optional):\n");
        }
        columns(&mut out, &d.table.columns, false);
        let _ = writeln!(
            out,
            "    + {} ({})",
            kafka::NAMES.join(", "),
            if d.join.is_some() {
                "of the joined row's left side"
            } else {
                "of the source row"
            }
        );
        if let Some(v) = &d.view {
            let _ = writeln!(out, "  view {} (what analysts query): {}", v.name, v.sql);
        }
        out.push('\n');
    }
    for r in &spec.references {
        let users: Vec<&str> = spec
            .derived
            .iter()
            .filter(|d| d.references.contains(&r.name))
            .map(|d| d.table.name.as_str())
            .collect();
        let _ = writeln!(
            out,
            "reference table {} (read by {}; re-read every {} s when it changed; created empty if missing)",
            r.name,
            if users.is_empty() {
                "no derived table".into()
            } else {
                users.join(", ")
            },
            r.refresh_seconds
        );
        out.push_str("  columns:\n");
        columns(&mut out, &r.columns, false);
        out.push('\n');
    }
    out.push_str("table dead_letters <- every record a table could not take, with the reason\n");
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_plan_shows_sources_sql_schemas_and_how_each_table_runs() {
        let spec = PipelineSpec::load(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/infra/pipeline.toml")),
            &crate::process::Planner,
        )
        .expect("spec");
        let text = render(&spec, &Processor::new(&spec).expect("plans"));
        for expected in [
            "table orders <- topic orders; feeds orders_clean",
            "table orders_clean <- SQL over orders (line ",
            "runs: stateful (dedup keys checkpointed), per batch in the ingest function: dedup by order_id within 1 h, left lookup join to reference table currency_rates on 1 key, filter, 7 columns",
            "runs: stateful, per partition in the ingest function: tumbling 1 min windows on event time, 1 key, 2 aggregates, allowed lateness 5 min",
            "    revenue          decimal(28,2)",
            "  view orders_per_minute (what analysts query): SELECT \"window_start\", \"window_end\", \"country\", SUM(\"orders\") AS \"orders\", SUM(\"revenue\") AS \"revenue\" FROM orders_per_minute_partials GROUP BY \"window_start\", \"window_end\", \"country\"",
            "    amount_eur       decimal(18,2)",
            "    severity         string",
            "reference table currency_rates (read by orders_clean; re-read every 300 s",
            "    LEFT JOIN currency_rates r ON o.currency = r.currency",
            "runs: decoded from JSON in the ingest function",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn a_registry_format_says_where_its_schemas_come_from() {
        let table = r#"
[[tables]]
name = "t"
topic = "t"
format = "protobuf"
columns = [{ name = "a", type = "string" }]
"#;
        let spec = PipelineSpec::parse(table, Path::new("t.toml"), &crate::process::Planner)
            .expect("spec");
        let text = render(&spec, &Processor::new(&spec).expect("plans"));
        assert!(
            text.contains("decoded from Protobuf behind a schema registry (no [registry] url: Confluent-framed records are unknown_schema dead letters unless STREAMTABLE_REGISTRY_URL is set;"),
            "{text}"
        );
        let spec = PipelineSpec::parse(
            &format!("[registry]\nurl = \"https://sr.example.com\"\n{table}"),
            Path::new("t.toml"),
            &crate::process::Planner,
        )
        .expect("spec");
        let text = render(&spec, &Processor::new(&spec).expect("plans"));
        assert!(
            text.contains("Confluent-framed records' schemas from https://sr.example.com;"),
            "{text}"
        );
    }
}
