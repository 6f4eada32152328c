//! Avro topics behind a schema registry, with records written by fastavro and framed as the
//! Confluent and Glue serializers frame them (`tests/py/avro_records.py`), schemas registered in
//! the registry stand-in (`tests/py/registry_server.py`) or moto's Glue Schema Registry; read
//! back through pyiceberg and DuckDB after each step.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use streamtable::generate::SourceRecord;
use streamtable::ingest::Ingestor;
use streamtable::scheduled;
use streamtable::spec::PipelineSpec;
use streamtable::tables::TableSet;

use super::table_scenarios::sched;
use super::{Harness, event};

/// The registry stand-in `scripts/test` starts.
pub fn registry_url() -> String {
    std::env::var("STREAMTABLE_TEST_REGISTRY").expect(
        "STREAMTABLE_TEST_REGISTRY is not set: the Avro tests need the schema registry stand-in; run ./scripts/test, which starts one",
    )
}

const COLUMNS_V1: &str = r#"
  { name = "order_id",    type = "string",        required = true },
  { name = "customer_id", type = "string",        path = "$.customer.id" },
  { name = "amount",      type = "decimal(18,2)", required = true },
  { name = "qty",         type = "long" },
  { name = "status",      type = "string" },
  { name = "created_at",  type = "timestamp",     required = true },
  { name = "customer",    type = "struct",        fields = [
      { name = "id", type = "string" }, { name = "tier", type = "string" } ] },
"#;

pub(super) fn spec(registry: &str, topic: &str, extra_columns: &str) -> PipelineSpec {
    spec_in(registry, topic, extra_columns, "avro")
}

/// The orders table on `topic` in `format`, with `extra_columns` after the first version's.
pub(super) fn spec_in(
    registry: &str,
    topic: &str,
    extra_columns: &str,
    format: &str,
) -> PipelineSpec {
    let text = format!(
        r#"
[registry]
url = "{registry}"

[[tables]]
name = "orders"
topic = "{topic}"
format = "{format}"
partition_by = ["day(created_at)"]
columns = [{COLUMNS_V1}{extra_columns}]
"#
    );
    PipelineSpec::parse(
        &text,
        Path::new("formats.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec")
}

/// The producers' first schema: a nested record, an enum, a decimal, a timestamp, and fields the
/// table does not take (an array, a nested field).
pub(super) fn schema_v1() -> Value {
    json!({"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "customer", "type": ["null", {"type": "record", "name": "Customer", "fields": [
            {"name": "id", "type": "string"}, {"name": "tier", "type": "string"}]}], "default": null},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "qty", "type": "int"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}}
    ]})
}

/// The next version: a new optional field (a backward-compatible change).
pub(super) fn schema_v2() -> Value {
    let mut s = schema_v1();
    s["fields"]
        .as_array_mut()
        .expect("fields")
        .push(json!({"name": "coupon", "type": ["null", "string"], "default": null}));
    s
}

pub(super) const T0: i64 = 1_795_946_400_000;

pub(super) fn order(n: i64, customer: Option<&str>, amount: &str, coupon: Option<&str>) -> Value {
    let mut v = json!({
        "order_id": format!("o{n}"),
        "customer": customer.map(|c| json!({"id": c, "tier": "gold"})),
        "amount": {"$decimal": amount},
        "qty": n,
        "status": "PAID",
        "created_at": {"$ts_ms": T0 + n},
        "tags": ["a", "b"],
    });
    if let Some(c) = coupon {
        v["coupon"] = json!(c);
    }
    v
}

/// How a batch of records is framed.
pub enum Framing<'a> {
    /// Registered under `subject` in the Confluent-compatible registry.
    Confluent { url: &'a str, subject: &'a str },
    /// Registered in the Glue Schema Registry (moto) as `registry:schema`.
    Glue { target: &'a str, zlib: bool },
}

/// Framed values of `records` written with `schema` by fastavro.
pub(super) fn produce(schema: &Value, records: &[Value], framing: &Framing<'_>) -> Vec<Vec<u8>> {
    run_producer(
        "avro_records.py",
        &["--schema", &schema.to_string()],
        records,
        framing,
    )
}

/// Runs a producer script of `tests/py` with `args`, `records` and `framing`; its values.
pub(super) fn run_producer(
    script: &str,
    args: &[&str],
    records: &[Value],
    framing: &Framing<'_>,
) -> Vec<Vec<u8>> {
    let python = std::env::var("STREAMTABLE_TEST_PYTHON").expect(
        "STREAMTABLE_TEST_PYTHON is not set: the format tests write records with fastavro and protobuf; run ./scripts/test",
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(script);
    let mut cmd = std::process::Command::new(python);
    cmd.arg(&script)
        .args(args)
        .args(["--records", &Value::from(records.to_vec()).to_string()]);
    match framing {
        Framing::Confluent { url, subject } => {
            cmd.args(["--confluent", url, "--subject", subject]);
        }
        Framing::Glue { target, zlib } => {
            cmd.args(["--glue", target]);
            if *zlib {
                cmd.arg("--zlib");
            }
        }
    }
    let out = cmd.output().expect("run the producer");
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|b| {
            STANDARD
                .decode(b.as_str().expect("base64"))
                .expect("base64")
        })
        .collect()
}

pub(super) fn records(topic: &str, first_offset: i64, values: Vec<Vec<u8>>) -> Vec<SourceRecord> {
    values
        .into_iter()
        .zip(first_offset..)
        .map(|(value, offset)| SourceRecord {
            topic: topic.into(),
            partition: 0,
            offset,
            timestamp_ms: T0 + offset,
            key: Some(format!("k{offset}").into_bytes()),
            value: Some(value),
            raw_value_field: None,
        })
        .collect()
}

pub(super) async fn land(h: &Harness, spec: &PipelineSpec, records: &[SourceRecord]) {
    let ingestor = Ingestor::connect(spec, &h.backend).await.expect("ingestor");
    ingestor.handle(&event(records)).await.expect("ingest");
    let tables = TableSet::new(spec, &h.backend.namespace).expect("tables");
    let report = scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("scheduled run");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

pub(super) fn business(h: &Harness, snapshot: Option<i64>, columns: usize) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = h
        .pyiceberg_rows("orders", snapshot)
        .into_iter()
        .map(|r| r[..columns].to_vec())
        .collect();
    rows.sort();
    rows
}

/// The committed dead letters, as pyiceberg reads them: (offset, kind, message) by offset.
pub(super) fn dead_letters(h: &Harness) -> Vec<(i64, String, String)> {
    let columns: Vec<String> =
        serde_json::from_value(h.read_external("pyiceberg", "dead_letters")["columns"].clone())
            .expect("columns");
    let at = |name: &str| columns.iter().position(|c| c == name).expect(name);
    let (o, k, m) = (at("kafka_offset"), at("error_kind"), at("error_message"));
    let mut rows: Vec<(i64, String, String)> = h
        .pyiceberg_rows("dead_letters", None)
        .into_iter()
        .map(|r| (r[o].parse().expect("offset"), r[k].clone(), r[m].clone()))
        .collect();
    rows.sort();
    rows
}

pub(super) fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

pub(super) fn ts(n: i64) -> String {
    ((T0 + n) * 1000).to_string()
}

/// Framed values of records written with schema version 1 or 2.
pub(super) type Produce<'a> = &'a dyn Fn(u8, &[Value], &Framing<'_>) -> Vec<Vec<u8>>;

/// A registry format under test: how its producers write orders of each schema version.
pub(super) struct FormatCase<'a> {
    /// The spec's `format`.
    pub format: &'a str,
    /// Framed values of `records` (from [`FormatCase::order`]) written with schema version 1 or
    /// 2 (2 adds an optional `coupon`).
    pub produce: Produce<'a>,
    /// Order `n` as the producer's input.
    pub order: fn(i64, Option<&str>, &str, Option<&str>) -> Value,
    /// Values of the topic that are not of the format, with their dead-letter kind.
    pub foreign: Vec<(Vec<u8>, &'static str)>,
}

/// Records of two schema versions (and, with `glue`, Glue-framed records plain and zlib) land
/// with their values; bad values are dead letters with reasons; the table evolves when the spec
/// takes the new field; time travel reads the table before the change.
pub(super) async fn land_and_evolve(h: &Harness, glue: Option<&str>, case: &FormatCase<'_>) {
    let (produce, order) = (case.produce, case.order);
    let url = registry_url();
    let topic = format!("orders-{}", uuid::Uuid::new_v4().simple());
    let subject = format!("{topic}-value");
    let confluent = Framing::Confluent {
        url: &url,
        subject: &subject,
    };
    let v1 = spec_in(&url, &topic, "", case.format);
    let mut values = produce(
        1,
        &[
            order(1, Some("c1"), "19.99", None),
            order(2, None, "-5.00", None),
        ],
        &confluent,
    );
    if let Some(registry) = glue {
        let target = format!("{registry}:{topic}");
        for (n, customer, amount, zlib) in
            [(3, "c3", "0.01", false), (4, "c4", "123456789.10", true)]
        {
            let framing = Framing::Glue {
                target: &target,
                zlib,
            };
            values.extend(produce(
                1,
                &[order(n, Some(customer), amount, None)],
                &framing,
            ));
        }
    }
    let good = values.len() as i64;
    // Bad values: foreign ones, an id the registry never issued, a cut-off body.
    let cut = values[0][..values[0].len() - 4].to_vec();
    let mut unknown = vec![0u8, 0x7f, 0xff, 0xff, 0xf0];
    unknown.extend_from_slice(&values[0][5..]);
    let mut kinds_expected: Vec<&str> = case.foreign.iter().map(|(_, k)| *k).collect();
    values.extend(case.foreign.iter().map(|(v, _)| v.clone()));
    values.extend([unknown, cut]);
    kinds_expected.extend(["unknown_schema", "schema_mismatch"]);
    let offsets = values.len() as i64;
    land(h, &v1, &records(&topic, 0, values)).await;

    let mut expected = vec![
        row(&["o1", "c1", "19.99", "1", "PAID", &ts(1)]),
        row(&["o2", "NULL", "-5.00", "2", "PAID", &ts(2)]),
    ];
    if glue.is_some() {
        expected.push(row(&["o3", "c3", "0.01", "3", "PAID", &ts(3)]));
        expected.push(row(&["o4", "c4", "123456789.10", "4", "PAID", &ts(4)]));
    }
    assert_eq!(business(h, None, 6), expected);
    let dead = dead_letters(h);
    let kinds: Vec<(i64, &str)> = dead.iter().map(|d| (d.0, d.1.as_str())).collect();
    let want: Vec<(i64, &str)> = (good..).zip(kinds_expected).collect();
    assert_eq!(kinds, want, "{dead:?}");
    let unknown = &dead[case.foreign.len()].2;
    assert!(
        unknown.contains("schema id 2147483632") && unknown.contains("404"),
        "{unknown}"
    );
    let s1 = h.read_external("pyiceberg", "orders")["current_snapshot_id"]
        .as_i64()
        .expect("snapshot");

    // The producers move to v2 (a new optional field); the spec takes it as a column. Records
    // of v1 still arriving read it as NULL.
    let v2 = spec_in(
        &url,
        &topic,
        r#"{ name = "coupon", type = "string" },"#,
        case.format,
    );
    let mut values = produce(
        2,
        &[order(10, Some("c10"), "1.50", Some("XMAS"))],
        &confluent,
    );
    values.extend(produce(
        1,
        &[order(11, Some("c11"), "2.50", None)],
        &confluent,
    ));
    land(h, &v2, &records(&topic, offsets, values)).await;
    // The struct column reads the nested record (message) as a whole: NULL when it is absent.
    let customer = |id: &str| match id {
        "NULL" => "NULL".to_string(),
        id => format!("{{'id': '{id}', 'tier': 'gold'}}"),
    };
    let mut all: Vec<Vec<String>> = expected
        .iter()
        .map(|r| [r.clone(), vec![customer(&r[1]), "NULL".to_string()]].concat())
        .collect();
    all.push(row(&[
        "o10",
        "c10",
        "1.50",
        "10",
        "PAID",
        &ts(10),
        &customer("c10"),
        "XMAS",
    ]));
    all.push(row(&[
        "o11",
        "c11",
        "2.50",
        "11",
        "PAID",
        &ts(11),
        &customer("c11"),
        "NULL",
    ]));
    all.sort();
    assert_eq!(business(h, None, 8), all);
    assert_eq!(
        h.read_external("duckdb", "orders")["count"],
        all.len() as i64
    );
    assert_eq!(
        h.read_external_at("pyiceberg", "orders", Some(s1))["count"],
        expected.len() as i64
    );
}

/// Avro records written by fastavro: [`land_and_evolve`]; JSON on the topic is `no_schema_id`.
pub async fn avro_records_land_and_evolve(h: &Harness, glue: Option<&str>) {
    let produce = |version: u8, records: &[Value], framing: &Framing<'_>| {
        let schema = if version == 1 {
            schema_v1()
        } else {
            schema_v2()
        };
        produce(&schema, records, framing)
    };
    let case = FormatCase {
        format: "avro",
        produce: &produce,
        order,
        foreign: vec![(br#"{"order_id":"x"}"#.to_vec(), "no_schema_id")],
    };
    land_and_evolve(h, glue, &case).await;
}

/// Makes the registry stand-in answer the next `count` lookups of schema `id` with `status`.
fn inject_registry_fault(url: &str, id: u32, status: u16, count: u32) {
    let python = std::env::var("STREAMTABLE_TEST_PYTHON").expect("STREAMTABLE_TEST_PYTHON");
    let body = json!({"id": id, "status": status, "count": count}).to_string();
    let code = format!(
        "import urllib.request; urllib.request.urlopen(urllib.request.Request('{url}/admin/fail', data={body:?}.encode(), method='POST'), timeout=10)"
    );
    let out = std::process::Command::new(python)
        .args(["-c", &code])
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One order of a fresh topic, registered in the stand-in at `url`: its topic, its schema id
/// and the batch carrying it.
fn one_order(url: &str) -> (String, u32, Vec<SourceRecord>) {
    let topic = format!("orders-{}", uuid::Uuid::new_v4().simple());
    let subject = format!("{topic}-value");
    let values = produce(
        &schema_v1(),
        &[order(1, Some("c1"), "1.00", None)],
        &Framing::Confluent {
            url,
            subject: &subject,
        },
    );
    let id = u32::from_be_bytes([values[0][1], values[0][2], values[0][3], values[0][4]]);
    let batch = records(&topic, 0, values);
    (topic, id, batch)
}

/// Ingesting `batch` with `spec` fails retryably with an error that `says` something, and
/// leaves nothing behind: no checkpoint move, no pending file.
async fn fails_and_retries(h: &Harness, spec: &PipelineSpec, batch: &[SourceRecord], says: &str) {
    let ingestor = Ingestor::connect(spec, &h.backend).await.expect("ingestor");
    let e = ingestor
        .handle(&event(batch))
        .await
        .expect_err("the registry did not answer");
    assert!(e.is_retryable() && e.to_string().contains(says), "{e}");
    assert_eq!(h.next_offset(&batch[0].topic, 0).await, 0);
    assert!(h.pending_files().await.is_empty());
}

/// Once the registry answers, the retried batch lands whole, with no dead letter.
async fn lands_after_the_retry(h: &Harness, spec: &PipelineSpec, batch: &[SourceRecord]) {
    land(h, spec, batch).await;
    assert_eq!(h.next_offset(&batch[0].topic, 0).await, 1);
    assert_eq!(business(h, None, 2), [["o1", "c1"]]);
    assert_eq!(h.read_external("pyiceberg", "dead_letters")["count"], 0);
}

/// A registry that cannot be reached fails the batch (retryable): nothing lands, nothing is
/// dead-lettered, the checkpoint stays; once it answers, the same batch lands.
pub async fn an_unreachable_registry_retries_the_batch(h: &Harness) {
    let url = registry_url();
    let (topic, _, batch) = one_order(&url);
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    fails_and_retries(h, &spec(&closed, &topic, ""), &batch, "schema registry").await;
    lands_after_the_retry(h, &spec(&url, &topic, ""), &batch).await;
}

/// A registry that answers 503, then refuses the credentials (401): each fails the batch
/// (nothing lands, nothing is dead-lettered, the checkpoint stays); then the batch lands.
pub async fn a_failing_registry_retries_the_batch(h: &Harness) {
    let url = registry_url();
    let (topic, id, batch) = one_order(&url);
    let spec = spec(&url, &topic, "");
    for (status, says) in [(503, "503"), (401, "refused the credentials")] {
        inject_registry_fault(&url, id, status, 1);
        fails_and_retries(h, &spec, &batch, says).await;
    }
    lands_after_the_retry(h, &spec, &batch).await;
}
