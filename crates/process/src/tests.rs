//! Planning: what is inferred, and every refused construct by its message.

use std::path::Path;

use super::infer;
use arrow_schema::{DataType, TimeUnit};

use crate::schema::TableLayout;
use crate::spec::{ColumnType, PipelineSpec};

fn spec() -> PipelineSpec {
    PipelineSpec::load(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../infra/pipeline.toml"
        )),
        &crate::Planner,
    )
    .expect("infra/pipeline.toml is valid")
}

/// The shipped spec's topics' tables, planned with its derived tables.
#[test]
fn the_shipped_example_is_valid() {
    let spec = spec();
    let names: Vec<_> = spec.tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["orders", "payments", "readings", "orders_current"]);
    let current = spec
        .table_for_topic("order_status")
        .expect("order_status topic");
    let upsert = current
        .upsert
        .as_ref()
        .expect("orders_current is an upsert table");
    assert_eq!(upsert.key, ["order_id"]);
    assert!(upsert.envelope.is_none());
    let orders = spec.table_for_topic("orders").expect("orders topic");
    assert_eq!(
        orders.columns[2].column_type,
        ColumnType::Decimal {
            precision: 18,
            scale: 2
        }
    );
    assert!(orders.columns[2].required);
    assert_eq!(orders.partition_by[0].field_name(), "created_at_day");
    assert_eq!(spec.settings.max_record_bytes, 1024 * 1024);
}

#[test]
fn orders_layout_has_business_then_kafka_columns_with_sequential_ids() {
    let spec = spec();
    let layout = TableLayout::for_table(spec.table("orders").expect("orders")).expect("layout");
    let names: Vec<_> = layout
        .schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| (f.id, f.name.clone()))
        .collect();
    assert_eq!(names[0], (1, "order_id".to_string()));
    assert_eq!(names[6], (7, "created_at".to_string()));
    assert_eq!(names[7], (8, "kafka_partition".to_string()));
    assert_eq!(names[10], (11, "kafka_key".to_string()));
    assert_eq!(layout.partition_spec.fields().len(), 1);
    assert_eq!(layout.partition_spec.fields()[0].name, "created_at_day");
    let arrow = &layout.arrow_schema;
    assert_eq!(arrow.field(2).data_type(), &DataType::Decimal128(18, 2));
    assert_eq!(
        arrow.field(6).data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, None)
    );
    assert_eq!(
        arrow
            .field(0)
            .metadata()
            .get("PARQUET:field_id")
            .map(String::as_str),
        Some("1")
    );
}

/// The fixtures in `tests/sql/` (its README says how to read and add one): each file's SQL
/// planned over the shipped spec, refused or planned as its header says.
#[test]
fn sql_fixtures_plan_or_refuse_as_their_headers_say() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/sql"));
    let s = spec();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("tests/sql")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 30,
        "fixtures in {}: {}",
        dir.display(),
        files.len()
    );
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let text = std::fs::read_to_string(path).expect("fixture");
        let (header, sql) = fixture(&text);
        let get = |key: &str| {
            header
                .iter()
                .find_map(|(k, v)| (*k == key).then(|| v.to_string()))
        };
        let inferred = infer(&s.tables, &s.references, sql);
        let failure = match (name.starts_with("error_"), inferred) {
            (true, Ok(i)) => Some(format!("planned, with columns {:?}", i.columns)),
            (true, Err(e)) => {
                let refused = get("refused").unwrap_or_default();
                let at = get("at").map(|needle| sql.find(&needle));
                if refused.is_empty() {
                    Some("has no `-- refused:` line".into())
                } else if !e.message.contains(&refused) {
                    Some(format!("refused with {:?}, not {refused:?}", e.message))
                } else if let Some(expected) = at.filter(|at| *at != e.at) {
                    Some(format!(
                        "refusal points at {:?}, not {expected:?} ({})",
                        e.at, e.message
                    ))
                } else {
                    None
                }
            }
            (false, Err(e)) => Some(format!("refused: {}", e.message)),
            (false, Ok(i)) => get("columns").and_then(|want| {
                let want: Vec<(String, Option<ColumnType>)> = split_top_level(&want)
                    .into_iter()
                    .map(|c| {
                        let mut parts = c.split_whitespace();
                        let n = parts.next().unwrap_or_default().to_string();
                        let t = parts.next().map(|t| ColumnType::parse(t).expect(t));
                        (n, t)
                    })
                    .collect();
                let fits = want.len() == i.columns.len()
                    && want
                        .iter()
                        .zip(&i.columns)
                        .all(|((n, t), (an, at))| n == an && t.is_none_or(|t| t == *at));
                (!fits).then(|| format!("columns {:?}", i.columns))
            }),
        };
        if let Some(f) = failure {
            failures.push(format!("tests/sql/{name}: {f}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A long `a + a + …` chain nests one level per term: past the depth limit it is refused naming
/// the limit, whatever thread asks (a test thread has 2 MiB, which 1,000 terms overflowed
/// before the planner had a stack of its own). The deepest allowed one evaluates on 2 MiB:
/// `lookup_semantics::the_deepest_expression_allowed_evaluates_on_a_2_mib_stack`.
#[test]
fn deep_expressions_are_refused_past_the_depth_limit_naming_it() {
    let s = spec();
    let chain = |n: usize| {
        format!(
            "SELECT order_id, {} AS total FROM orders",
            vec!["amount"; n].join(" + ")
        )
    };
    for n in [crate::MAX_EXPR_DEPTH + 1, 1_000, 5_000] {
        let e = infer(&s.tables, &s.references, &chain(n)).expect_err("too deep");
        assert!(
            e.message
                .contains("the SQL nests expressions more than 256 levels deep"),
            "{n} terms: {}",
            e.message
        );
    }
    let i = infer(&s.tables, &s.references, &chain(crate::MAX_EXPR_DEPTH)).expect("at the limit");
    assert_eq!(i.columns.len(), 2);
    // A function call nests a level too.
    let wrapped = |calls: usize, terms: usize| {
        format!(
            "SELECT order_id, {}{}{} AS total FROM orders",
            "abs(".repeat(calls),
            vec!["amount"; terms].join(" + "),
            ")".repeat(calls)
        )
    };
    infer(&s.tables, &s.references, &wrapped(10, 246)).expect("256 levels");
    let e = infer(&s.tables, &s.references, &wrapped(10, 247)).expect_err("257 levels");
    assert!(e.message.contains("256 levels deep"), "{}", e.message);
    // Past 50 nested calls, parentheses or subqueries the parser refuses first, and says so.
    let e = infer(&s.tables, &s.references, &wrapped(60, 1)).expect_err("60 calls");
    assert!(
        e.message
            .contains("RecursionLimitExceeded (current limit: 50)")
            && e.message.contains("flatten the expression"),
        "{}",
        e.message
    );
}

/// SQL that is short and shallow can still plan into something huge: `… BETWEEN … BETWEEN …`
/// repeats its operand at every level (2^k terms to evaluate per batch; 24 levels hung ingest),
/// `EXPLAIN` planned what it wraps before being refused, and `WITH` queries reading the one
/// before twice plan 2^k scans (16 took 10 s and 700 MB). Each is refused, naming its limit,
/// before the work.
#[test]
fn sql_that_plans_into_something_huge_is_refused_naming_the_limit() {
    let s = spec();
    let between = |k: usize| {
        format!(
            "SELECT order_id, (amount > 0){} AS b FROM orders",
            " BETWEEN false AND true".repeat(k)
        )
    };
    infer(&s.tables, &s.references, &between(3)).expect("a few levels plan");
    for k in [24, 200] {
        let e = infer(&s.tables, &s.references, &between(k)).expect_err("too large");
        assert!(e.message.contains("once planned"), "{k}: {}", e.message);
    }
    // In an interval join too, which the commit stage plans and runs with DataFusion's
    // engine (16 levels took it 52 s, 24 levels 12.6 GB).
    let join = format!(
        "SELECT o.order_id, p.payment_id FROM orders o JOIN payments p ON o.order_id = p.order_id \
         AND p.attempted_at BETWEEN o.created_at AND o.created_at + INTERVAL '1' HOUR \
         WHERE (o.amount > 0){} ",
        " BETWEEN false AND true".repeat(24)
    );
    let e = infer(&s.tables, &s.references, &join).expect_err("too large");
    assert!(e.message.contains("once planned"), "{}", e.message);
    let explain = format!(
        "EXPLAIN SELECT order_id, amount{} AS b FROM orders",
        " + amount".repeat(3_000)
    );
    let e = infer(&s.tables, &s.references, &explain).expect_err("not a query");
    assert!(
        e.message.starts_with("Explain is not a query"),
        "{}",
        e.message
    );
    // `name(i)` is how the SQL writes the i-th WITH query's name.
    let doubling_named = |k: usize, name: &dyn Fn(usize) -> String| {
        let mut ctes = vec![format!("{} AS (SELECT order_id FROM orders)", name(0))];
        for i in 1..=k {
            ctes.push(format!(
                "{} AS (SELECT * FROM {p} UNION ALL SELECT * FROM {p})",
                name(i),
                p = name(i - 1)
            ));
        }
        format!("WITH {} SELECT order_id FROM {}", ctes.join(", "), name(k))
    };
    let doubling = |k: usize| doubling_named(k, &|i| format!("a{i}"));
    let e = infer(&s.tables, &s.references, &doubling(16)).expect_err("2^16 scans");
    assert!(
        e.message.contains("more than the 64 a derived table may"),
        "{}",
        e.message
    );
    // Quoted names count the same, and a name defined again in a subquery keeps its count.
    let quoted = doubling_named(16, &|i| format!("\"A{i}\""));
    let e = infer(&s.tables, &s.references, &quoted).expect_err("2^16 scans, quoted");
    assert!(
        e.message.contains("more than the 64"),
        "{quoted}: {}",
        e.message
    );
    let redefined = format!(
        "{} WHERE order_id IN (WITH {} SELECT order_id FROM a0)",
        doubling(16),
        (0..=16)
            .map(|i| format!("a{i} AS (SELECT order_id FROM orders)"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let e = infer(&s.tables, &s.references, &redefined).expect_err("2^16 scans, redefined");
    assert!(e.message.contains("more than the 64"), "{}", e.message);
    // Within the limit it plans, and is refused for what it is.
    let e = infer(&s.tables, &s.references, &doubling(2)).expect_err("a union");
    assert!(e.message.contains("UNION"), "{}", e.message);
}

/// A flat list costs one level however long it is: an `IN (…)` of thousands of values plans
/// (the token limit once refused 2,100), and only past the token and byte limits is SQL
/// refused, naming the limit.
#[test]
fn long_flat_sql_plans_and_only_past_the_token_and_byte_limits_is_refused() {
    let s = spec();
    let list = |n: usize| {
        let values: Vec<String> = (0..n).map(|i| format!("'sku-{i}'")).collect();
        format!(
            "SELECT order_id, currency IN ({}) AS listed FROM orders",
            values.join(", ")
        )
    };
    let i = infer(&s.tables, &s.references, &list(2_100)).expect("2,100 values");
    assert_eq!(i.columns.len(), 2);
    let i = infer(&s.tables, &s.references, &list(30_000)).expect("30,000 values");
    assert_eq!(i.columns.len(), 2);
    let e = infer(&s.tables, &s.references, &list(40_000)).expect_err("too many tokens");
    assert!(
        e.message
            .contains("the SQL has 80010 tokens, more than the 65536 a derived table may have"),
        "{}",
        e.message
    );
    let huge = format!(
        "SELECT order_id FROM orders WHERE currency = '{}'",
        "x".repeat(1 << 20)
    );
    let e = infer(&s.tables, &s.references, &huge).expect_err("too long");
    assert!(
        e.message
            .contains("more than the 1048576 a derived table may have"),
        "{}",
        e.message
    );
}

/// `a string, b decimal(18,2)` → `["a string", " b decimal(18,2)"]`: commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// A fixture's header (`-- key: value` lines before the SQL) and its SQL.
fn fixture(text: &str) -> (Vec<(&str, &str)>, &str) {
    let mut header = Vec::new();
    let mut rest = text;
    while let Some(line) = rest.strip_prefix("--") {
        let (line, after) = line.split_once('\n').unwrap_or((line, ""));
        if let Some((k, v)) = line.trim().split_once(':') {
            // A value in backticks keeps its spaces (`` at: ` OVER` ``).
            let v = v.trim();
            let v = v
                .strip_prefix('`')
                .and_then(|v| v.strip_suffix('`'))
                .unwrap_or(v);
            header.push((k.trim(), v));
        }
        rest = after;
    }
    (header, rest)
}

#[test]
fn the_shipped_derived_tables_have_the_inferred_columns() {
    let s = spec();
    let clean = &s
        .derived
        .iter()
        .find(|d| d.table.name == "orders_clean")
        .expect("orders_clean");
    assert_eq!(clean.source, "orders");
    assert_eq!(clean.references, ["currency_rates"]);
    assert_eq!(clean.table.topic, "orders");
    let cols: Vec<(&str, ColumnType)> = clean
        .table
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.column_type))
        .collect();
    let dec = |precision, scale| ColumnType::Decimal { precision, scale };
    assert_eq!(
        cols,
        [
            ("order_id", ColumnType::String),
            ("customer_id", ColumnType::String),
            ("country", ColumnType::String),
            ("currency", ColumnType::String),
            ("amount", dec(18, 2)),
            ("amount_eur", dec(18, 2)),
            ("created_at", ColumnType::Timestamp),
        ]
    );
    let alerts = s
        .derived
        .iter()
        .find(|d| d.table.name == "readings_alerts")
        .expect("alerts");
    assert_eq!(alerts.table.columns[5].name, "severity");
    assert_eq!(alerts.table.columns[5].column_type, ColumnType::String);
    assert_eq!(alerts.table.partition_by[0].field_name(), "reported_at_day");
}

#[test]
fn spec_errors_point_at_the_line_of_the_construct() {
    let text = r#"
[[tables]]
name = "orders"
topic = "orders"
columns = [{ name = "id", type = "string" }, { name = "amount", type = "double" }]

[[derived_tables]]
name = "big"
sql = """
SELECT id, amount
FROM orders
ORDER BY amount
"""
"#;
    let e = PipelineSpec::parse(text, Path::new("p.toml"), &crate::Planner).expect_err("order by");
    let m = e.to_string();
    assert!(
        m.starts_with("invalid pipeline spec: p.toml:12:1: derived table \"big\": ORDER BY")
            || m.contains("p.toml:12:1: derived table \"big\": ORDER BY"),
        "{m}"
    );
    let bad_partition = text
        .replace("ORDER BY amount\n", "")
        .replace("sql =", "partition_by = [\"day(amount)\"]\nsql =");
    let e = PipelineSpec::parse(&bad_partition, Path::new("p.toml"), &crate::Planner)
        .expect_err("partition");
    assert!(
        e.to_string()
            .contains("transform day cannot apply to column \"amount\""),
        "{e}"
    );
}

#[test]
fn a_derived_table_can_be_an_upsert_table_of_its_select() {
    let text = r#"
[[tables]]
name = "orders"
topic = "orders"
watermark = "at - INTERVAL '1' SECOND"
columns = [{ name = "id", type = "string", required = true }, { name = "amount", type = "double" },
           { name = "at", type = "timestamp", required = true }]

[[derived_tables]]
name = "latest"
mode = "upsert"
primary_key = ["order_id"]
sql = "SELECT upper(id) AS order_id, amount FROM orders"
"#;
    let spec = PipelineSpec::parse(text, Path::new("p.toml"), &crate::Planner).expect("valid");
    let upsert = spec.derived[0].table.upsert.as_ref().expect("upsert");
    assert_eq!(upsert.key, ["order_id"]);
    let window = "SELECT window_start, window_end, count(*) AS n FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(at), INTERVAL '1' MINUTE)) GROUP BY window_start, window_end";
    for (from, to, want) in [
        (
            "sql = \"SELECT upper(id) AS order_id, amount FROM orders\"",
            format!("sql = \"{window}\""),
            "not to a window",
        ),
        (
            "primary_key = [\"order_id\"]",
            "primary_key = [\"amount\"]".to_string(),
            "not compared exactly",
        ),
        (
            "primary_key = [\"order_id\"]",
            "primary_key = [\"id\"]".to_string(),
            "\"id\" is not a column",
        ),
        (
            "mode = \"upsert\"",
            "mode = \"merge\"".to_string(),
            "unknown mode \"merge\"",
        ),
        (
            "mode = \"upsert\"\n",
            String::new(),
            "primary_key applies to mode = \"upsert\"",
        ),
        (
            "primary_key = [\"order_id\"]\n",
            String::new(),
            "needs primary_key",
        ),
    ] {
        let bad = text.replacen(from, &to, 1);
        let e = PipelineSpec::parse(&bad, Path::new("p.toml"), &crate::Planner)
            .expect_err(want)
            .to_string();
        assert!(e.contains(want), "{to}: {e}");
        assert!(e.contains("derived table \"latest\""), "{e}");
    }
}

mod lookup_semantics {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::{Array, ArrayRef, Decimal128Array, RecordBatch, StringArray};
    use async_trait::async_trait;

    use crate::Processor;
    use crate::decode::{RecordDecoder, RowBuilder};
    use crate::error::Result;
    use crate::kafka::RecordMeta;
    use crate::reference::{Loaded, ReferenceSource};
    use crate::schema::TableLayout;
    use crate::spec::{PipelineSpec, ReferenceSpec};

    /// Rows held in memory: the catalog-backed source is exercised by the integration tests.
    struct Fixed(RecordBatch);

    #[async_trait]
    impl ReferenceSource for Fixed {
        async fn load(
            &self,
            _: &ReferenceSpec,
            _: &TableLayout,
            _: Option<&str>,
        ) -> Result<Loaded> {
            Ok(Loaded::Rows {
                version: "1".into(),
                rows: self.0.clone(),
            })
        }
    }

    fn spec(sql: &str) -> PipelineSpec {
        let text = format!(
            r#"
[[tables]]
name = "orders"
topic = "orders"
columns = [{{ name = "id", type = "string" }}, {{ name = "currency", type = "string" }}]

[[reference_tables]]
name = "rates"
columns = [{{ name = "currency", type = "string" }}, {{ name = "rate", type = "decimal(9,2)" }}]

[[derived_tables]]
name = "out"
sql = """{sql}"""
"#
        );
        PipelineSpec::parse(&text, std::path::Path::new("p.toml"), &crate::Planner).expect("spec")
    }

    fn orders(spec: &PipelineSpec) -> RecordBatch {
        let t = &spec.tables[0];
        let layout = Arc::new(TableLayout::for_table(t).expect("layout"));
        let decoder = RecordDecoder::new(t);
        let mut rows = RowBuilder::new(t, layout, 4).expect("rows");
        for (i, json) in [
            r#"{"id":"a","currency":"EUR"}"#,
            r#"{"id":"b","currency":"USD"}"#,
            r#"{"id":"c"}"#,
            r#"{"id":"d","currency":"XXX"}"#,
        ]
        .iter()
        .enumerate()
        {
            let cells = decoder.decode(json).expect("decodes");
            rows.append(
                &cells,
                RecordMeta {
                    partition: 0,
                    offset: i as i64,
                    timestamp_us: 0,
                    key: None,
                    headers: &[],
                },
            );
        }
        rows.finish().expect("batch")
    }

    fn rates() -> RecordBatch {
        let c: ArrayRef = Arc::new(StringArray::from(vec![
            Some("EUR"),
            Some("USD"),
            Some("USD"),
            None,
        ]));
        let r: ArrayRef = Arc::new(
            Decimal128Array::from(vec![100, 90, 91, 50])
                .with_precision_and_scale(9, 2)
                .expect("decimal"),
        );
        RecordBatch::try_from_iter_with_nullable([("currency", c, true), ("rate", r, true)])
            .expect("rates")
    }

    async fn run(sql: &str) -> Vec<String> {
        let spec = spec(sql);
        let p = Processor::new(&spec)
            .expect("plans")
            .with_reference_source(Arc::new(Fixed(rates())));
        p.refresh(0).await.expect("loads");
        let out = p
            .derive("orders", &orders(&spec), &mut Default::default(), 0)
            .expect("derives");
        let rows = out[0].rows.as_ref().expect("rows");
        let id = rows.column(0).as_string::<i32>();
        let rate = rows
            .column(1)
            .as_primitive::<arrow_array::types::Decimal128Type>();
        let mut v: Vec<String> = (0..rows.num_rows())
            .map(|i| {
                let r = if rate.is_null(i) {
                    "NULL".to_string()
                } else {
                    rate.value(i).to_string()
                };
                format!("{}:{r}", id.value(i))
            })
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn a_left_join_keeps_every_row_and_a_key_with_two_matches_gives_two() {
        assert_eq!(
            run("SELECT o.id, r.rate FROM orders o LEFT JOIN rates r ON o.currency = r.currency")
                .await,
            ["a:100", "b:90", "b:91", "c:NULL", "d:NULL"]
        );
    }

    #[tokio::test]
    async fn an_inner_join_drops_rows_without_a_match_and_null_keys_match_nothing() {
        assert_eq!(
            run("SELECT o.id, r.rate FROM rates r JOIN orders o ON r.currency = o.currency").await,
            ["a:100", "b:90", "b:91"]
        );
        assert_eq!(
            run("SELECT id, rate FROM orders JOIN rates USING (currency)").await,
            ["a:100", "b:90", "b:91"]
        );
    }

    /// Ingest evaluates a derived table on a tokio worker (2 MiB of stack): the deepest
    /// expression the planner lets through is planned, evaluated on a batch and dropped there.
    #[test]
    fn the_deepest_expression_allowed_evaluates_on_a_2_mib_stack() {
        let terms = crate::MAX_EXPR_DEPTH;
        let worker = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let chain = vec!["kafka_offset"; terms].join(" + ");
                let spec = spec(&format!("SELECT id, {chain} AS x FROM orders"));
                let p = Processor::new(&spec).expect("plans");
                let out = p
                    .derive("orders", &orders(&spec), &mut Default::default(), 0)
                    .expect("derives");
                let rows = out[0].rows.as_ref().expect("rows");
                let x = rows
                    .column(1)
                    .as_primitive::<arrow_array::types::Int64Type>();
                (0..rows.num_rows()).map(|i| x.value(i)).collect::<Vec<_>>()
            })
            .expect("spawns");
        let n = terms as i64;
        assert_eq!(worker.join().expect("no overflow"), [0, n, 2 * n, 3 * n]);
    }
}

/// A derived table's SQL that a record's values make explode never takes down the batch: the
/// rows it fails on are failures of that table (dead letters), the others are rows.
mod hostile_evaluation {
    use std::sync::Arc;

    use arrow_array::RecordBatch;

    use crate::Processor;
    use crate::decode::{RecordDecoder, RowBuilder};
    use crate::kafka::RecordMeta;
    use crate::schema::TableLayout;
    use crate::spec::PipelineSpec;

    fn spec(sql: &str) -> PipelineSpec {
        let text = format!(
            r#"
[[tables]]
name = "orders"
topic = "orders"
columns = [{{ name = "id", type = "string" }}, {{ name = "n", type = "long" }}]

[[tables]]
name = "windowed"
topic = "windowed"
watermark = "at - INTERVAL '1' SECOND"
columns = [{{ name = "id", type = "string" }}, {{ name = "n", type = "long" }}, {{ name = "at", type = "timestamp" }}]

[[derived_tables]]
name = "out"
sql = """{sql}"""
"#
        );
        PipelineSpec::parse(&text, std::path::Path::new("p.toml"), &crate::Planner).expect("spec")
    }

    /// Rows of `table`: `(id, n)` per record, offsets 0, 1, …
    fn rows(spec: &PipelineSpec, table: &str, records: &[(&str, i64)]) -> RecordBatch {
        let t = spec.table(table).expect("table");
        let layout = Arc::new(TableLayout::for_table(t).expect("layout"));
        let decoder = RecordDecoder::new(t);
        let mut rows = RowBuilder::new(t, layout, records.len()).expect("rows");
        for (i, (id, n)) in records.iter().enumerate() {
            let json = format!(r#"{{"id":"{id}","n":{n},"at":"2026-12-07T10:00:0{i}Z"}}"#);
            let cells = decoder.decode(&json).expect("decodes");
            rows.append(
                &cells,
                RecordMeta {
                    partition: 0,
                    offset: i as i64,
                    timestamp_us: 1_796_637_600_000_000,
                    key: None,
                    headers: &[],
                },
            );
        }
        rows.finish().expect("batch")
    }

    /// The failures (row, reason) and the number of rows of derived table `out` for records
    /// `(id, n)` of `orders`.
    fn derive(sql: &str, records: &[(&str, i64)]) -> (Vec<(usize, String)>, usize) {
        let spec = spec(sql);
        let p = Processor::new(&spec).expect("plans");
        let out = p
            .derive(
                "orders",
                &rows(&spec, "orders", records),
                &mut Default::default(),
                0,
            )
            .expect("derives");
        let d = out.into_iter().find(|d| d.table == "out").expect("out");
        (d.failures, d.rows.map_or(0, |r| r.num_rows()))
    }

    #[test]
    fn a_value_that_asks_for_too_much_is_refused_before_it_is_made() {
        // Row 1 asks for 10^8 copies (about 100 MB): refused before the call allocates it;
        // rows 0 and 2 ask for little and land.
        let (failures, rows) = derive(
            "SELECT id, repeat(id, n) AS x FROM orders",
            &[("a", 3), ("b", 100_000_000), ("c", 2)],
        );
        assert_eq!(rows, 2);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].0, 1);
        assert!(
            failures[0]
                .1
                .contains("repeat(…) would make a value of about 100.0 MB"),
            "{}",
            failures[0].1
        );
        for sql in [
            "SELECT id, lpad(id, n, 'x') AS x FROM orders",
            "SELECT id, cardinality(range(0, n)) AS x FROM orders",
            "SELECT id, cardinality(array_repeat(id, n)) AS x FROM orders",
            "SELECT id, cardinality(array_resize(make_array(id), n, 'x')) AS x FROM orders",
            "SELECT id, cardinality(generate_series(n, 0, -1)) AS x FROM orders",
        ] {
            let (failures, rows) = derive(sql, &[("a", 3), ("b", 2_000_000_000)]);
            assert_eq!((rows, failures.len()), (1, 1), "{sql}: {failures:?}");
            assert!(
                failures[0].1.contains("would make a value of about"),
                "{sql}: {failures:?}"
            );
        }
    }

    #[test]
    fn calls_of_many_arguments_and_chains_of_operators_are_bounded_too() {
        let big = "x".repeat(4_000);
        // concat of 5,000 copies of a 4 kB value: 20 MB asked for, refused before it is made.
        let args = vec!["id"; 5_000].join(", ");
        let (failures, rows) = derive(
            &format!("SELECT length(concat({args})) AS l FROM orders"),
            &[(big.as_str(), 1), ("a", 2)],
        );
        assert_eq!((rows, failures.len()), (1, 1), "{failures:?}");
        assert!(
            failures[0]
                .1
                .contains("concat(…) would make a value of about"),
            "{failures:?}"
        );
        // `||` doubling a 100 kB value 12 times (400 MB): refused at the first value past
        // max_record_bytes (1.6 MB), not made whole.
        let mut e = "id".to_string();
        for _ in 0..12 {
            e = format!("({e} || {e})");
        }
        let big = "y".repeat(100_000);
        let (failures, rows) = derive(
            &format!("SELECT length({e}) AS l FROM orders"),
            &[(big.as_str(), 1), ("a", 2)],
        );
        assert_eq!((rows, failures.len()), (1, 1), "{failures:?}");
        assert!(
            failures[0].1.contains("more than the 1048576"),
            "{failures:?}"
        );
        // levenshtein's work grows with the product of its arguments: bounded per row.
        let big = "z".repeat(20_000);
        let (failures, rows) = derive(
            "SELECT levenshtein(id, reverse(id)) AS l FROM orders",
            &[(big.as_str(), 1), ("abc", 2)],
        );
        assert_eq!((rows, failures.len()), (1, 1), "{failures:?}");
        assert!(failures[0].1.contains("steps"), "{failures:?}");
        // range(n, n + 3) is 4 elements wherever n is.
        let (failures, rows) = derive(
            "SELECT id, cardinality(range(n, n + 3)) AS c FROM orders",
            &[("a", 1_500_000), ("b", -7)],
        );
        assert_eq!((rows, failures.len()), (2, 0), "{failures:?}");
    }

    #[test]
    fn a_function_that_panics_fails_its_row_not_the_batch() {
        let (failures, rows) = derive(
            "SELECT id, overlay(id placing 'x' from n for 2) AS x FROM orders",
            &[("abc", 1), ("def", i64::MAX), ("ghi", 2)],
        );
        assert_eq!(rows, 2);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].0, 1);
        assert!(
            failures[0].1.contains("overlay(…) failed on this value"),
            "{failures:?}"
        );
    }

    #[test]
    fn a_derived_row_larger_than_a_record_may_be_is_refused() {
        // 600,000 copies of a 2-byte id: 1.2 MB, over the default max_record_bytes (1 MiB).
        let (failures, rows) = derive(
            "SELECT id, repeat(id, n) AS x FROM orders",
            &[("ab", 600_000), ("cd", 1)],
        );
        assert_eq!(rows, 1);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].1.contains("more than the 1048576"),
            "{failures:?}"
        );
    }

    #[test]
    fn a_batch_past_its_budget_lands_what_fits_and_refuses_the_rest() {
        let spec = spec("SELECT id, repeat(id, n) AS x FROM orders");
        let mut p = Processor::new(&spec).expect("plans");
        p.limits.max_batch_bytes = 2_500;
        // Four rows of 1,001 bytes each: two fit the budget, two are refused.
        let records: Vec<(&str, i64)> = vec![("a", 1000); 4];
        let out = p
            .derive(
                "orders",
                &rows(&spec, "orders", &records),
                &mut Default::default(),
                0,
            )
            .expect("derives");
        let d = out.into_iter().find(|d| d.table == "out").expect("out");
        assert_eq!(d.rows.map_or(0, |r| r.num_rows()), 2);
        assert_eq!(d.failures.len(), 2, "{:?}", d.failures);
        assert!(
            d.failures[0].1.contains("the most a batch may make"),
            "{:?}",
            d.failures
        );
    }

    #[test]
    fn a_window_whose_aggregate_argument_panics_fails_only_that_row() {
        let spec = spec(
            "SELECT window_start, window_end, SUM(length(overlay(id placing 'x' from n for 2))) AS s \
             FROM TABLE(TUMBLE(TABLE windowed, DESCRIPTOR(at), INTERVAL '1' MINUTE)) \
             GROUP BY window_start, window_end",
        );
        let p = Processor::new(&spec).expect("plans");
        let out = p
            .derive(
                "windowed",
                &rows(
                    &spec,
                    "windowed",
                    &[("abc", 1), ("def", i64::MAX), ("ghi", 2)],
                ),
                &mut Default::default(),
                1_796_637_600_000,
            )
            .expect("derives");
        let d = out
            .into_iter()
            .find(|d| d.table.starts_with("out"))
            .expect("out");
        assert_eq!(d.failures.len(), 1, "{:?}", d.failures);
        assert_eq!(d.failures[0].0, 1);
        assert!(
            d.failures[0].1.contains("overlay(…) failed on this value"),
            "{:?}",
            d.failures
        );
    }
}
