use std::path::Path;

use super::*;

fn parse(text: &str) -> Result<PipelineSpec> {
    PipelineSpec::parse(text, Path::new("p.toml"), &crate::spec::NoSql)
}

fn error(text: &str) -> String {
    parse(text).expect_err("spec should be refused").to_string()
}

const GOOD: &str = r#"
[[tables]]
name = "t"
topic = "t"
columns = [{ name = "id", type = "string", required = true }, { name = "at", type = "timestamp" }]
partition_by = ["day(at)", "bucket(8, id)"]
"#;

#[test]
fn defaults_apply_and_paths_default_to_the_column_name() {
    let spec = parse(GOOD).expect("valid");
    let t = &spec.tables[0];
    assert_eq!(t.columns[0].path, JsonPath(vec!["id".into()]));
    assert_eq!(t.target_file_size_mb, DEFAULT_TARGET_FILE_SIZE_MB);
    assert_eq!(
        t.partition_by[1].transform,
        iceberg::spec::Transform::Bucket(8)
    );
}

#[test]
fn errors_name_file_line_and_fix() {
    let bad = GOOD.replace("\"timestamp\"", "\"timestmp\"");
    let msg = error(&bad);
    assert!(msg.starts_with("p.toml:5:"), "{msg}");
    assert!(msg.contains("unknown column type \"timestmp\""), "{msg}");
    assert!(msg.contains("use one of"), "{msg}");
}

#[test]
fn toml_syntax_errors_have_a_line() {
    let msg = error("[[tables]]\nname = = 1\n");
    assert!(msg.starts_with("p.toml:2:"), "{msg}");
}

#[test]
fn unknown_keys_are_refused() {
    let msg = error(&GOOD.replace("topic = \"t\"", "topic = \"t\"\ncolour = 1"));
    assert!(msg.contains("colour"), "{msg}");
}

#[test]
fn kafka_headers_is_off_by_default_and_takes_true_or_false() {
    assert!(!parse(GOOD).expect("valid").tables[0].kafka_headers);
    let on = GOOD.replace("topic = \"t\"", "topic = \"t\"\nkafka_headers = true");
    assert!(parse(&on).expect("valid").tables[0].kafka_headers);
    let off = GOOD.replace("topic = \"t\"", "topic = \"t\"\nkafka_headers = false");
    assert!(!parse(&off).expect("valid").tables[0].kafka_headers);
    for wrong in ["\"yes\"", "1", "[true]"] {
        let msg = error(&GOOD.replace(
            "topic = \"t\"",
            &format!("topic = \"t\"\nkafka_headers = {wrong}"),
        ));
        assert!(msg.starts_with("p.toml:5:17:"), "{msg}");
        assert!(msg.contains("kafka_headers must be true"), "{msg}");
    }
    assert!(
        error(&on.replace("kafka_headers = true", "kafka_headers = \"yes\""))
            .contains("the string \"yes\"")
    );
    // The column's name is reserved like the other Kafka columns'.
    assert!(error(&GOOD.replace("name = \"id\"", "name = \"kafka_headers\"")).contains("reserved"));
}

#[test]
fn reserved_and_invalid_names_are_refused() {
    assert!(error(&GOOD.replace("name = \"id\"", "name = \"kafka_offset\"")).contains("reserved"));
    assert!(error(&GOOD.replace("name = \"t\"", "name = \"dead_letters\"")).contains("reserved"));
    assert!(error(&GOOD.replace("name = \"t\"", "name = \"Orders\"")).contains("lowercase"));
    assert!(error(&GOOD.replace("name = \"at\"", "name = \"id\"")).contains("defined twice"));
}

#[test]
fn partitions_must_fit_their_column() {
    assert!(error(&GOOD.replace("day(at)", "day(id)")).contains("cannot apply"));
    assert!(error(&GOOD.replace("day(at)", "day(nope)")).contains("not a column"));
    assert!(error(&GOOD.replace("day(at)", "fortnight(at)")).contains("cannot read partition"));
    assert!(
        error(&GOOD.replace("bucket(8, id)", "bucket(0, id)")).contains("cannot read partition")
    );
}

#[test]
fn one_topic_feeds_one_table() {
    let two = format!("{GOOD}\n{}", GOOD.replace("name = \"t\"", "name = \"u\""));
    let msg = error(&two);
    assert!(msg.contains("already feeds another table"), "{msg}");
}

#[test]
fn nested_path_conflicts_are_refused() {
    let text = GOOD.replace(
        "{ name = \"at\", type = \"timestamp\" }",
        "{ name = \"at\", type = \"timestamp\", path = \"$.id.at\" }",
    );
    assert!(error(&text).contains("lies inside"));
}

#[test]
fn json_paths_parse() {
    assert_eq!(
        JsonPath::parse("$.a.b"),
        Some(JsonPath(vec!["a".into(), "b".into()]))
    );
    assert_eq!(
        JsonPath::parse("$['a b'].c"),
        Some(JsonPath(vec!["a b".into(), "c".into()]))
    );
    assert_eq!(
        JsonPath::parse("plain"),
        Some(JsonPath(vec!["plain".into()]))
    );
    assert_eq!(JsonPath::parse("$."), None);
    assert_eq!(JsonPath::parse("$"), None);
    assert_eq!(
        JsonPath(vec!["a b".into(), "c".into()]).to_string(),
        "$['a b'].c"
    );
}

#[test]
fn struct_columns_have_fields_relative_to_their_path() {
    let text = r#"
[[tables]]
name = "t"
topic = "t"
columns = [
  { name = "c", type = "struct", path = "$.customer", fields = [
      { name = "id", type = "string" },
      { name = "tier", type = "int", path = "$.level.n" },
  ] },
]
"#;
    let spec = PipelineSpec::parse(text, Path::new("t.toml"), &crate::spec::NoSql).expect("spec");
    let leaves: Vec<String> = spec.tables[0]
        .leaves()
        .iter()
        .map(|c| format!("{} {} {}", c.name, c.column_type, c.path))
        .collect();
    assert_eq!(
        leaves,
        ["c.id string $.customer.id", "c.tier int $.customer.level.n"]
    );

    let refused = |from: &str, to: &str, says: &str| {
        let bad = text.replace(from, to);
        let e = PipelineSpec::parse(&bad, Path::new("t.toml"), &crate::spec::NoSql).expect_err(to);
        assert!(e.to_string().contains(says), "{e}");
    };
    refused(
        r#"type = "struct", path"#,
        r#"type = "struct", required = true, path"#,
        "cannot be required",
    );
    refused(
        r#"{ name = "id", type = "string" }"#,
        r#"{ name = "id", type = "string", required = true }"#,
        "field \"id\" of struct column \"c\" cannot be required",
    );
    refused(
        r#"type = "struct", path"#,
        r#"type = "string", path"#,
        "write type = \"struct\"",
    );
    let empty = r#"
[[tables]]
name = "t"
topic = "t"
columns = [{ name = "c", type = "struct" }]
"#;
    let e = PipelineSpec::parse(empty, Path::new("t.toml"), &crate::spec::NoSql)
        .expect_err("no fields");
    assert!(e.to_string().contains("has no fields"), "{e}");
    // Another column may read a field of the struct's object; not the object itself.
    let beside = text.replace(
        "] },\n]",
        "] },\n  { name = \"cid\", type = \"string\", path = \"$.customer.id\" },\n]",
    );
    assert!(PipelineSpec::parse(&beside, Path::new("t.toml"), &crate::spec::NoSql).is_ok());
    let object = beside.replace("$.customer.id\" }", "$.customer\" }");
    let e = PipelineSpec::parse(&object, Path::new("t.toml"), &crate::spec::NoSql)
        .expect_err("leaf and object");
    assert!(e.to_string().contains("lies inside path $.customer"), "{e}");
    let deep = (0..20).fold(
        r#"{ name = "leaf", type = "int" }"#.to_string(),
        |inner, i| format!(r#"{{ name = "s{i}", type = "struct", fields = [{inner}] }}"#),
    );
    let e = PipelineSpec::parse(
        &format!("[[tables]]\nname = \"t\"\ntopic = \"t\"\ncolumns = [{deep}]\n"),
        Path::new("t.toml"),
        &crate::spec::NoSql,
    )
    .expect_err("too deep");
    assert!(e.to_string().contains("more than 16 deep"), "{e}");
    let partitioned = format!("{text}partition_by = [\"c\"]\n");
    assert!(PipelineSpec::parse(&partitioned, Path::new("t.toml"), &crate::spec::NoSql).is_err());
}

const UPSERT: &str = r#"
[[tables]]
name = "orders_current"
topic = "orders"
mode = "upsert"
primary_key = ["order_id", "region"]
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "region", type = "int", required = true },
  { name = "status", type = "string" },
  { name = "score", type = "double", required = true },
  { name = "note", type = "string" },
]
"#;

#[test]
fn an_upsert_table_names_its_key() {
    let spec = parse(UPSERT).expect("valid");
    assert_eq!(
        spec.tables[0].upsert.as_ref().map(|u| u.key.clone()),
        Some(vec!["order_id".to_string(), "region".to_string()])
    );
    assert_eq!(parse(GOOD).expect("valid").tables[0].upsert, None);
    let append = UPSERT.replace(
        "mode = \"upsert\"\nprimary_key = [\"order_id\", \"region\"]\n",
        "mode = \"append\"\n",
    );
    assert_eq!(parse(&append).expect("valid").tables[0].upsert, None);
}

#[test]
fn a_debezium_upsert_table_is_read_from_its_envelope() {
    let text = UPSERT.replacen(
        "mode = \"upsert\"",
        "mode = \"upsert\"\nenvelope = \"debezium\"",
        1,
    );
    let spec = parse(&text).expect("valid");
    assert_eq!(
        spec.tables[0].upsert.as_ref().and_then(|u| u.envelope),
        Some(super::Envelope::Debezium)
    );
    let avro = text.replacen(
        "envelope = \"debezium\"",
        "envelope = \"debezium\"\nformat = \"avro\"",
        1,
    );
    let avro = parse(&avro).expect("Debezium events in Avro behind a registry");
    assert_eq!(avro.tables[0].format, super::Format::Avro);
    let protobuf = text.replacen(
        "envelope = \"debezium\"",
        "envelope = \"debezium\"\nformat = \"protobuf\"",
        1,
    );
    assert!(
        error(&protobuf).contains("Protobuf change events are not read"),
        "{}",
        error(&protobuf)
    );
    // The envelope's own members hold values, and keys come from the row.
    let with_column =
        |column: &str| text.replacen("columns = [", &format!("columns = [\n  {column},"), 1);
    for (column, why) in [
        (
            r#"{ name = "op_x", type = "string", path = "$.__op.x" }"#,
            "nothing inside it",
        ),
        (
            r#"{ name = "op_n", type = "long", path = "$.__op" }"#,
            "which is a string",
        ),
    ] {
        let e = error(&with_column(column));
        assert!(e.contains(why), "{column}: {e}");
    }
    assert!(
        parse(&with_column(
            r#"{ name = "lsn", type = "long", path = "$.__source.lsn" }"#
        ))
        .is_ok()
    );
}

#[test]
fn an_upsert_key_is_refused_naming_the_fix() {
    let cases = [
        (
            "mode = \"upsert\"",
            "mode = \"merge\"",
            "unknown mode \"merge\"",
        ),
        (
            "primary_key = [\"order_id\", \"region\"]\n",
            "",
            "needs primary_key",
        ),
        (
            "mode = \"upsert\"\n",
            "",
            "primary_key applies to mode = \"upsert\"",
        ),
        ("[\"order_id\", \"region\"]", "[]", "primary_key is empty"),
        (
            "[\"order_id\", \"region\"]",
            "[\"order_id\", \"order_id\"]",
            "names \"order_id\" twice",
        ),
        (
            "[\"order_id\", \"region\"]",
            "[\"customer\"]",
            "\"customer\" is not a column",
        ),
        (
            "[\"order_id\", \"region\"]",
            "[\"score\"]",
            "not compared exactly",
        ),
        (
            "[\"order_id\", \"region\"]",
            "[\"note\"]",
            "must be required",
        ),
        (
            "[\"order_id\", \"region\"]",
            "[\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]",
            "more than the limit of 8",
        ),
        (
            "mode = \"upsert\"",
            "mode = \"upsert\"\nland = false",
            "needs the table to land",
        ),
        (
            "mode = \"upsert\"",
            "mode = \"upsert\"\nenvelope = \"maxwell\"",
            "unknown envelope \"maxwell\"",
        ),
        (
            "mode = \"upsert\"",
            "envelope = \"debezium\"",
            "applies to mode = \"upsert\"",
        ),
    ];
    for (from, to, want) in cases {
        let text = UPSERT.replacen(from, to, 1);
        let e = error(&text);
        assert!(e.contains(want), "{to:?}: {e}");
        assert!(e.contains("p.toml:"), "names the file and line: {e}");
    }
}

#[test]
fn a_changed_primary_key_is_refused_unless_the_spec_names_the_key_before() {
    use super::{KeyChange, RecordedKey};
    let spec = parse(UPSERT).expect("valid");
    let u = spec.tables[0].upsert.clone().expect("upsert");
    let was = |k: &[&str]| RecordedKey::Key(k.iter().map(|s| s.to_string()).collect());
    assert_eq!(u.key_change("t", &RecordedKey::None), KeyChange::Same);
    assert_eq!(
        u.key_change("t", &was(&["order_id", "region"])),
        KeyChange::Same
    );
    // The key changed without a word: refused, naming both keys and the three ways on.
    let KeyChange::Refused(why) = u.key_change("t", &was(&["order_id"])) else {
        panic!("refused");
    };
    assert!(
        why.contains(r#"changed from ["order_id"] to ["order_id", "region"]"#)
            && why.contains(r#"add rekey_from = ["order_id"]"#)
            && why.contains("set primary_key back")
            && why.contains("new name"),
        "{why}"
    );
    // An append table's rows made an upsert table's.
    let KeyChange::Refused(why) = u.key_change("t", &RecordedKey::Append) else {
        panic!("refused");
    };
    assert!(why.contains("rekey_from = []"), "{why}");
    // rekey_from names the key before: the re-key is acknowledged; a stale one changes nothing.
    let rekeyed = UPSERT.replace(
        "primary_key = [\"order_id\", \"region\"]\n",
        "primary_key = [\"order_id\", \"region\"]\nrekey_from = [\"order_id\"]\n",
    );
    let u = parse(&rekeyed).expect("valid").tables[0]
        .upsert
        .clone()
        .expect("upsert");
    assert_eq!(
        u.key_change("t", &was(&["order_id"])),
        KeyChange::Rekey {
            from: vec!["order_id".into()]
        }
    );
    assert_eq!(
        u.key_change("t", &was(&["order_id", "region"])),
        KeyChange::Same
    );
    assert!(matches!(
        u.key_change("t", &was(&["region"])),
        KeyChange::Refused(_)
    ));
    // rekey_from is refused where it cannot apply.
    let itself = UPSERT.replace(
        "primary_key = [\"order_id\", \"region\"]\n",
        "primary_key = [\"order_id\", \"region\"]\nrekey_from = [\"order_id\", \"region\"]\n",
    );
    assert!(
        error(&itself).contains("is the primary_key itself"),
        "{}",
        error(&itself)
    );
    let append = GOOD.replacen(
        "topic = \"t\"\n",
        "topic = \"t\"\nrekey_from = [\"id\"]\n",
        1,
    );
    assert!(
        error(&append).contains("rekey_from applies to mode = \"upsert\""),
        "{}",
        error(&append)
    );
}
