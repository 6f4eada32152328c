//! Planning windows: what a windowed table stores, the views that merge it, and refusals.

use std::path::Path;

use crate::infer;
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

const BUYERS: &str = "SELECT window_start, window_end, country, approx_distinct(customer_id) AS customers, \
                      COUNT(*) AS orders, AVG(amount) AS avg_amount \
                      FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE)) \
                      GROUP BY window_start, window_end, country";

#[test]
fn approx_distinct_stores_a_sketch_that_each_engine_merges() {
    let s = spec();
    let inferred = infer(&s.tables, &s.references, BUYERS).expect("planned");
    let columns: Vec<(&str, ColumnType)> = inferred
        .columns
        .iter()
        .map(|(n, t)| (n.as_str(), *t))
        .collect();
    assert_eq!(
        columns,
        [
            ("window_start", ColumnType::Timestamp),
            ("window_end", ColumnType::Timestamp),
            ("country", ColumnType::String),
            ("customers__hll", ColumnType::String),
            ("orders", ColumnType::Long),
            ("avg_amount__sum", ColumnType::Double),
            ("avg_amount__count", ColumnType::Long),
        ]
    );
    let (datafusion, athena) = inferred.view.expect("a view");
    assert_eq!(
        datafusion,
        "SELECT \"window_start\", \"window_end\", \"country\", \
         streamtable_merge_sketches(\"customers__hll\") AS \"customers\", \
         SUM(\"orders\") AS \"orders\", SUM(\"avg_amount__sum\") / SUM(\"avg_amount__count\") AS \"avg_amount\" \
         FROM {partials} GROUP BY \"window_start\", \"window_end\", \"country\""
    );
    assert_eq!(
        athena,
        datafusion.replace(
            "streamtable_merge_sketches(\"customers__hll\")",
            "cardinality(merge(CAST(from_base64(\"customers__hll\") AS HyperLogLog)))"
        )
    );
    assert!(
        inferred
            .view_columns
            .contains(&("customers".to_string(), "bigint".to_string())),
        "{:?}",
        inferred.view_columns
    );
}

#[test]
fn distinct_accumulators_merge_as_the_union_and_skip_nulls() {
    use crate::df::arrow::datatypes::DataType;

    use super::{AggPlan, aggregate};
    use crate::partition_state::Acc;
    use crate::sketch::Sketch;
    use crate::value::Value;

    let plan = AggPlan {
        func: aggregate::by_name("approx_distinct").expect("approx_distinct"),
        arg: None,
        arg_type: DataType::Utf8,
        result: DataType::Int64,
        text: "approx_distinct(c) of Utf8".into(),
    };
    let add = |acc: Acc, v: &str| acc.updated(&plan, Some(&Value::Str(v.into()))).unwrap();
    let a = add(Acc::new(&plan), "c-1").expect("a new value changes the sketch");
    assert!(
        add(a.clone(), "c-1").is_none(),
        "a value seen changes nothing"
    );
    assert!(
        a.updated(&plan, Some(&Value::Null)).unwrap().is_none(),
        "NULL is not counted"
    );
    let b = add(add(Acc::new(&plan), "c-2").unwrap(), "c-3").unwrap();
    // Two sessions that an event joins: the union of their values.
    let merged = a.merged(&b, &plan).unwrap();
    let all = ["c-1", "c-2", "c-3"].map(|v| Value::Str(v.into()));
    assert_eq!(merged, Acc::Distinct(Sketch::of(&all)));
    assert_eq!(
        merged.partial(&plan),
        vec![Value::Str(Sketch::of(&all).to_base64())]
    );
    assert!(a.merged(&Acc::Count(1), &plan).is_err());
}

/// A widened source column (a decimal's precision) keeps what the aggregates over it compute,
/// so their open windows are carried over; another scale does not.
#[test]
fn widening_a_column_keeps_the_aggregates_over_it() {
    let sig = |amount: &str| {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../infra/pipeline.toml"
        ))
        .expect("spec")
        .replace(
            r#"{ name = "amount",      type = "decimal(18,2)", required = true },"#,
            &format!(r#"{{ name = "amount",      type = "{amount}", required = true }},"#),
        );
        let spec =
            PipelineSpec::parse(&text, Path::new("pipeline.toml"), &crate::Planner).expect("spec");
        let processor = crate::Processor::new(&spec).expect("processor");
        processor
            .tables
            .iter()
            .find(|t| t.name == "orders_per_minute_partials")
            .expect("windowed table")
            .sig
            .clone()
    };
    let before = sig("decimal(18,2)");
    assert_eq!(before, sig("decimal(20,2)"));
    assert_ne!(before.aggs, sig("decimal(20,3)").aggs);
}
