//! Tests of the evolution plan.

use std::path::Path;

use super::*;
use crate::schema::TableLayout;
use crate::spec::PipelineSpec;

fn table(columns: &str) -> TableSpec {
    let at = if columns.contains("\"at\"") {
        "at"
    } else {
        "when"
    };
    let text = format!(
        "[[tables]]\nname = \"t\"\ntopic = \"t\"\npartition_by = [\"day({at})\"]\ncolumns = [\n{columns}\n]\n"
    );
    PipelineSpec::parse(&text, Path::new("p.toml"), &crate::spec::NoSql)
        .expect("spec")
        .tables
        .remove(0)
}

const V1: &str = r#"{ name = "id", type = "string", required = true },
{ name = "n", type = "int" },
{ name = "amount", type = "decimal(12,2)", required = true },
{ name = "at", type = "timestamp", required = true },"#;

fn current() -> Schema {
    TableLayout::for_table(&table(V1))
        .expect("layout")
        .schema
        .as_ref()
        .clone()
}

fn lines(p: &SchemaPlan) -> Vec<String> {
    describe(p)
}

#[test]
fn the_same_spec_plans_nothing() {
    let s = current();
    let p = plan(&s, s.highest_field_id(), &[4], &table(V1));
    assert!(p.is_empty(), "{:?}", lines(&p));
    assert!(p.evolved.is_none());
}

#[test]
fn add_widen_rename_relax_and_drop() {
    let s = current();
    let last = s.highest_field_id();
    let v2 = table(
        r#"{ name = "id", type = "string" },
{ name = "count", type = "long", renamed_from = "n" },
{ name = "coupon", type = "string" },
{ name = "at", type = "timestamp", required = true },"#,
    );
    let p = plan(&s, last, &[4], &v2);
    assert_eq!(
        lines(&p),
        [
            "~ id: required → optional",
            "~ n renamed to count (same field id)",
            "~ count int → long",
            "+ column coupon string (optional)",
            "- column amount (dropped from the schema; older files keep its values)",
        ]
    );
    let evolved = p.evolved.expect("evolved");
    assert_eq!(evolved.schema_id(), s.schema_id() + 1);
    let f = |name: &str| evolved.field_by_name(name).expect(name).clone();
    assert_eq!(f("count").id, s.field_by_name("n").expect("n").id);
    assert_eq!(*f("count").field_type, Type::Primitive(PrimitiveType::Long));
    // A new column takes the id after the table's last, never a dropped one's.
    assert_eq!(f("coupon").id, last + 1);
    assert!(evolved.field_by_name("amount").is_none());
    assert!(!f("id").required);
    // The Kafka columns keep their ids, after the spec's columns.
    for k in crate::kafka::NAMES {
        assert_eq!(f(k).id, s.field_by_name(k).expect(k).id);
    }
    let names: Vec<&str> = evolved
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(&names[..4], ["id", "count", "coupon", "at"]);
}

#[test]
fn a_dropped_id_is_never_reused() {
    let s = current();
    // The table once had more columns than it has now.
    let p = plan(
        &s,
        s.highest_field_id() + 3,
        &[4],
        &table(&format!("{V1}\n{{ name = \"extra\", type = \"double\" }},")),
    );
    let evolved = p.evolved.expect("evolved");
    assert_eq!(
        evolved.field_by_name("extra").expect("extra").id,
        s.highest_field_id() + 4
    );
}

#[test]
fn incompatible_changes_are_refused_with_what_to_do() {
    let s = current();
    let last = s.highest_field_id();
    let cases = [
        (
            r#"{ name = "id", type = "string", required = true },
{ name = "n", type = "int", required = true },
{ name = "amount", type = "decimal(12,2)", required = true },
{ name = "at", type = "timestamp", required = true },"#,
            "! n: optional → required — refused: rows already in the table may have no value for it",
        ),
        (
            r#"{ name = "id", type = "string", required = true },
{ name = "n", type = "int" },
{ name = "amount", type = "decimal(10,2)", required = true },
{ name = "at", type = "timestamp", required = true },"#,
            "! amount: decimal(12,2) → decimal(10,2) — refused: Iceberg only widens",
        ),
        (
            r#"{ name = "id", type = "long", required = true },
{ name = "n", type = "int" },
{ name = "amount", type = "decimal(12,2)", required = true },
{ name = "at", type = "timestamp", required = true },"#,
            "! id: string → long — refused:",
        ),
        (
            &format!("{V1}\n{{ name = \"new\", type = \"int\", required = true }},"),
            "! new: new column int required — refused: rows already in the table have no value",
        ),
        (
            r#"{ name = "id", type = "string", required = true },
{ name = "n", type = "int" },
{ name = "amount", type = "decimal(12,2)", required = true },
{ name = "when", type = "timestamp", required = true },"#,
            "! at: dropped — refused: the table is partitioned by it",
        ),
    ];
    for (columns, want) in cases {
        let p = plan(&s, last, &[4], &table(columns));
        let got = lines(&p);
        assert!(
            got.iter().any(|l| l.starts_with(want)),
            "{want:?} not in {got:?}"
        );
        assert!(p.evolved.is_none(), "{got:?}");
        // A refused new column is not also listed as added.
        assert!(
            !got.iter().any(|l| l.starts_with("+ column new")),
            "{got:?}"
        );
        let e = p.refusal_error("t").expect("refused").to_string();
        assert!(e.starts_with("table t: schema change refused: !"), "{e}");
    }
}

#[test]
fn widening_follows_the_iceberg_spec() {
    use PrimitiveType as P;
    let d = |precision, scale| P::Decimal { precision, scale };
    assert!(widens(&P::Int, &P::Long));
    assert!(widens(&P::Float, &P::Double));
    assert!(widens(&d(12, 2), &d(18, 2)));
    assert!(!widens(&d(12, 2), &d(18, 3)));
    assert!(!widens(&P::Long, &P::Int));
    assert!(!widens(&P::Int, &P::Double));
    assert!(!widens(&P::Int, &P::String));
}

#[test]
fn a_registry_tables_spec_older_than_the_table_changes_nothing() {
    // The table has `note`, which a spec read before another writer added it lacks: a registry
    // table's columns only grow, so nothing is dropped (nor anything else changed).
    let with_note = format!("{V1}\n{{ name = \"note\", type = \"string\" }},");
    let current = TableLayout::for_table(&table(&with_note))
        .expect("layout")
        .schema
        .as_ref()
        .clone();
    let mut stale = table(V1);
    stale.registry_subject = Some("t-value".into());
    let p = plan(&current, current.highest_field_id(), &[], &stale);
    assert!(p.is_empty() && p.evolved.is_none(), "{:?}", p.changes);
    // The same spec written by hand drops the column.
    stale.registry_subject = None;
    let p = plan(&current, current.highest_field_id(), &[], &stale);
    assert!(
        p.changes
            .iter()
            .any(|c| matches!(c, Change::Drop { name } if name == "note")),
        "{:?}",
        p.changes
    );
}

fn with_struct(fields: &str) -> TableSpec {
    let text = format!(
        "[[tables]]\nname = \"t\"\ntopic = \"t\"\ncolumns = [\n{{ name = \"id\", type = \"string\" }},\n{{ name = \"c\", type = \"struct\", fields = [{fields}] }},\n]\n"
    );
    PipelineSpec::parse(&text, Path::new("p.toml"), &crate::spec::NoSql)
        .expect("spec")
        .tables
        .remove(0)
}

#[test]
fn a_structs_fields_are_added_widened_and_dropped_by_field_id() {
    let v1 = with_struct(r#"{ name = "a", type = "int" }, { name = "b", type = "string" }"#);
    let current = TableLayout::for_table(&v1)
        .expect("layout")
        .schema
        .as_ref()
        .clone();
    let v2 = with_struct(
        r#"{ name = "a", type = "long" }, { name = "n", type = "struct", fields = [{ name = "x", type = "date" }] }"#,
    );
    let p = plan(&current, current.highest_field_id(), &[], &v2);
    let shown: Vec<String> = p.changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "~ c.a int → long",
            "+ column c.n struct<x date> (optional)",
            "- column c.b (dropped from the schema; older files keep its values)",
        ]
    );
    let evolved = p.evolved.expect("evolved");
    let a = evolved.field_by_name("c.a").expect("c.a");
    assert_eq!(a.id, current.field_by_name("c.a").expect("old c.a").id);
    // New ids come after every id the table has used (7 business + Kafka ids).
    let last = current.highest_field_id();
    assert_eq!(evolved.field_by_name("c.n").map(|f| f.id), Some(last + 1));
    assert_eq!(evolved.field_by_name("c.n.x").map(|f| f.id), Some(last + 2));
    assert!(evolved.field_by_name("c.b").is_none());

    // A primitive where the table has a struct (and the reverse) is refused.
    let text = "[[tables]]\nname = \"t\"\ntopic = \"t\"\ncolumns = [{ name = \"id\", type = \"string\" }, { name = \"c\", type = \"string\" }]\n";
    let flat = PipelineSpec::parse(text, Path::new("p.toml"), &crate::spec::NoSql)
        .expect("spec")
        .tables
        .remove(0);
    let p = plan(&current, current.highest_field_id(), &[], &flat);
    assert!(
        p.evolved.is_none() && p.refused.len() == 1,
        "{:?}",
        p.refused
    );
    let back = TableLayout::for_table(&flat)
        .expect("layout")
        .schema
        .as_ref()
        .clone();
    let p = plan(&back, back.highest_field_id(), &[], &v1);
    assert!(
        p.evolved.is_none() && p.refused.len() == 1,
        "{:?}",
        p.refused
    );
}

fn with_headers(columns: &str, headers: bool) -> TableSpec {
    let mut t = table(columns);
    t.kafka_headers = headers;
    t
}

#[test]
fn turning_the_headers_on_adds_the_column_after_the_kafka_columns() {
    let s = current();
    let last = s.highest_field_id();
    let p = plan(&s, last, &[4], &with_headers(V1, true));
    assert!(p.refused.is_empty(), "{:?}", p.refused);
    assert_eq!(
        lines(&p),
        ["+ column kafka_headers list<struct<key string, value binary>> (optional)"]
    );
    let evolved = p.evolved.expect("evolved");
    let names: Vec<&str> = evolved
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names[4..9], crate::kafka::NAMES);
    assert_eq!(names[9..], [crate::kafka::HEADERS]);
    // The column, then its element, key and value, after every id the table has used.
    let id = |name: &str| evolved.field_by_name(name).map(|f| f.id);
    assert_eq!(id("kafka_headers"), Some(last + 1));
    assert_eq!(id("kafka_headers.element"), Some(last + 2));
    assert_eq!(id("kafka_headers.element.key"), Some(last + 3));
    assert_eq!(id("kafka_headers.element.value"), Some(last + 4));
    assert_eq!(evolved.highest_field_id(), last + 4);
    assert!(
        !evolved
            .field_by_name("kafka_headers")
            .expect("headers")
            .required
    );
    // The Kafka columns keep their ids.
    for k in crate::kafka::NAMES {
        assert_eq!(id(k), s.field_by_name(k).map(|f| f.id));
    }
    // Planned again against the evolved table: nothing left to do.
    let again = plan(&evolved, last + 4, &[4], &with_headers(V1, true));
    assert!(again.is_empty(), "{:?}", lines(&again));
}

#[test]
fn turning_the_headers_off_keeps_the_column() {
    let s = TableLayout::for_table(&with_headers(V1, true))
        .expect("layout")
        .schema
        .as_ref()
        .clone();
    let headers = s.field_by_name("kafka_headers").expect("headers").clone();
    let p = plan(&s, s.highest_field_id(), &[4], &with_headers(V1, false));
    assert!(p.is_empty(), "{:?}", lines(&p));
    assert!(p.evolved.is_none());
    // Another change keeps it too, with its ids, still last.
    let v2 = format!("{V1}\n{{ name = \"extra\", type = \"double\" }},");
    let p = plan(&s, s.highest_field_id(), &[4], &with_headers(&v2, false));
    assert_eq!(lines(&p), ["+ column extra double (optional)"]);
    let evolved = p.evolved.expect("evolved");
    assert_eq!(evolved.field_by_name("kafka_headers"), Some(&headers));
    assert_eq!(
        evolved.as_struct().fields().last().map(|f| f.name.as_str()),
        Some(crate::kafka::HEADERS)
    );
}
