//! Planning: what is inferred, and every refused construct by its message.

use std::path::Path;

use super::infer;
use crate::spec::{ColumnType, PipelineSpec};

fn spec() -> PipelineSpec {
    PipelineSpec::load(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/infra/pipeline.toml"
    )))
    .expect("infra/pipeline.toml is valid")
}

fn refused(sql: &str) -> (String, Option<usize>) {
    let s = spec();
    let e = infer(&s.tables, &s.references, sql).expect_err(sql);
    (e.message, e.at)
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
fn every_construct_a_stream_cannot_run_is_refused_by_name() {
    let cases: [(&str, &str, Option<&str>); 12] = [
        (
            "SELECT country, count(*) AS n FROM orders GROUP BY country",
            "aggregate without a window",
            Some("count("),
        ),
        (
            "SELECT sum(amount) AS s FROM orders",
            "aggregate without a window",
            Some("sum("),
        ),
        (
            "SELECT o.order_id, p.payment_id FROM orders o JOIN payments p ON o.order_id = p.order_id",
            "a join between two topics' tables (orders, payments)",
            Some("JOIN"),
        ),
        (
            "SELECT order_id FROM orders WHERE amount > (SELECT max(amount) FROM payments)",
            "subquery",
            Some("SELECT max"),
        ),
        (
            "SELECT order_id FROM orders WHERE order_id IN (SELECT order_id FROM payments)",
            "subquery",
            Some("SELECT order_id FROM payments"),
        ),
        (
            "SELECT order_id, now() AS seen FROM orders",
            "now() cannot run on a stream",
            Some("now()"),
        ),
        (
            "SELECT order_id, random() AS r FROM orders",
            "random() cannot run on a stream",
            Some("random()"),
        ),
        (
            "SELECT order_id FROM orders ORDER BY created_at",
            "ORDER BY",
            Some("ORDER BY"),
        ),
        (
            "SELECT order_id FROM orders LIMIT 10",
            "LIMIT",
            Some("LIMIT"),
        ),
        (
            "SELECT DISTINCT country FROM orders",
            "DISTINCT",
            Some("DISTINCT"),
        ),
        (
            "SELECT order_id, row_number() OVER (ORDER BY created_at) AS n FROM orders",
            "window function",
            Some(" OVER"),
        ),
        (
            "SELECT order_id FROM orders UNION ALL SELECT order_id FROM payments",
            "UNION",
            Some("UNION"),
        ),
    ];
    for (sql, construct, at) in cases {
        let (message, offset) = refused(sql);
        assert!(message.contains(construct), "{sql}: {message}");
        if let Some(needle) = at {
            assert_eq!(offset, sql.find(needle), "{sql}: {message}");
        }
    }
}

#[test]
fn mistakes_are_refused_with_the_fix() {
    let cases = [
        (
            "SELECT order_id FROM nowhere",
            "one of the topics' tables or joins a reference table: orders, payments, readings, currency_rates",
        ),
        (
            "SELECT amount * 2 FROM orders",
            "needs a name: write `… AS some_name`",
        ),
        ("SELECT order_id, order_id FROM orders", "Consider aliasing"),
        (
            "SELECT o.currency, r.currency FROM orders o JOIN currency_rates r ON o.currency = r.currency",
            "appears twice",
        ),
        (
            "SELECT kafka_offset + 1 AS kafka_offset FROM orders",
            "is reserved",
        ),
        (
            "SELECT * FROM currency_rates",
            "currency_rates is a reference table",
        ),
        (
            "SELECT o.order_id FROM orders o FULL JOIN currency_rates r ON o.currency = r.currency",
            "keep the topic's rows with an INNER or LEFT JOIN",
        ),
        (
            "SELECT o.order_id FROM orders o LEFT JOIN currency_rates r ON o.amount > r.rate_to_eur",
            "not an equality of keys",
        ),
        (
            "SELECT o.order_id FROM orders o CROSS JOIN currency_rates r",
            "needs ON with equal keys",
        ),
        ("SELECT 1 AS one", "reads a topic's table"),
        ("SELECT order_id, NULL AS nothing FROM orders", "CAST it to"),
        ("INSERT INTO orders SELECT * FROM orders", "not a query"),
        (
            "SELECT order_id FROM (SELECT order_id FROM orders) t",
            "subquery",
        ),
    ];
    for (sql, expected) in cases {
        let (message, _) = refused(sql);
        assert!(message.contains(expected), "{sql}: {message}");
    }
}

#[test]
fn select_star_carries_the_kafka_columns_once() {
    let s = spec();
    let i = infer(&s.tables, &s.references, "SELECT * FROM readings").expect("select *");
    let names: Vec<&str> = i.columns.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "sensor_id",
            "site",
            "temperature",
            "humidity",
            "reported_at"
        ]
    );
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
    let e = PipelineSpec::parse(text, Path::new("p.toml")).expect_err("order by");
    let m = e.to_string();
    assert!(
        m.starts_with("invalid pipeline spec: p.toml:12:1: derived table \"big\": ORDER BY")
            || m.contains("p.toml:12:1: derived table \"big\": ORDER BY"),
        "{m}"
    );
    let bad_partition = text
        .replace("ORDER BY amount\n", "")
        .replace("sql =", "partition_by = [\"day(amount)\"]\nsql =");
    let e = PipelineSpec::parse(&bad_partition, Path::new("p.toml")).expect_err("partition");
    assert!(
        e.to_string()
            .contains("transform day cannot apply to column \"amount\""),
        "{e}"
    );
}

mod lookup_semantics {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::{Array, ArrayRef, Decimal128Array, RecordBatch, StringArray};
    use async_trait::async_trait;

    use crate::decode::{RecordDecoder, RecordMeta, RowBuilder};
    use crate::error::Result;
    use crate::process::Processor;
    use crate::process::reference::{Loaded, ReferenceSource};
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
        PipelineSpec::parse(&text, std::path::Path::new("p.toml")).expect("spec")
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
}
