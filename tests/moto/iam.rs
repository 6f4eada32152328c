//! Each Lambda function with only its own policy from `template.yaml`, on a moto server that
//! enforces IAM (`tests/py/iam_setup.py`; scripts/test starts it beside the main one): the
//! real ingest and scheduled binaries, driven through the Lambda Runtime API, land batches,
//! create, commit and evolve tables, follow the schema registry and commit on a trigger, so a
//! permission the template forgot fails here; and what a function must not do (ingest reading
//! the dead letters' data, touching the interval joins' state) is refused.

#[path = "../support/runtime_api.rs"]
mod runtime_api;

use std::path::{Path, PathBuf};

use runtime_api::{Outcome, RuntimeApi, run_lambda};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A Lambda binary of the workspace (built with it by `cargo test --workspace`).
fn binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_streamtable")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build the functions (`cargo build -p ingest -p scheduled`; scripts/test builds them)",
        path.display()
    );
    path
}

struct Stack {
    endpoint: String,
    name: String,
    setup: serde_json::Value,
    dir: tempfile::TempDir,
}

impl Stack {
    fn new() -> Stack {
        let endpoint = std::env::var("STREAMTABLE_TEST_IAM_ENDPOINT").expect(
            "STREAMTABLE_TEST_IAM_ENDPOINT is not set: this test needs a moto server that enforces IAM; run ./scripts/test, which starts one",
        );
        let python = std::env::var("STREAMTABLE_TEST_PYTHON")
            .expect("STREAMTABLE_TEST_PYTHON is not set: run ./scripts/test");
        let name = format!(
            "st-iam-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        );
        let out = std::process::Command::new(python)
            .arg(root().join("tests/py/iam_setup.py"))
            .args([&endpoint, &name])
            .output()
            .expect("run iam_setup.py");
        assert!(
            out.status.success(),
            "iam_setup.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let setup = serde_json::from_slice(&out.stdout).expect("setup JSON");
        Stack {
            endpoint,
            name,
            setup,
            dir: tempfile::tempdir().expect("dir"),
        }
    }

    fn database(&self) -> String {
        self.name.replace('-', "_")
    }

    /// Runs `binary` on `events` with the credentials of `function`'s user and `spec`.
    fn run(&self, function: &str, program: &str, spec: &Path, events: Vec<String>) -> Vec<Outcome> {
        let creds = &self.setup["functions"][function];
        let n = events.len();
        let api = RuntimeApi::start(events);
        let database = self.database();
        let spec = spec.to_str().expect("path");
        let env = [
            ("STREAMTABLE_BACKEND", "aws"),
            ("STREAMTABLE_BUCKET", self.name.as_str()),
            ("STREAMTABLE_STATE_TABLE", self.name.as_str()),
            ("STREAMTABLE_GLUE_DATABASE", database.as_str()),
            ("STREAMTABLE_PIPELINE", spec),
            ("STREAMTABLE_COMMIT_INTERVAL_S", "1"),
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", creds["key"].as_str().expect("key")),
            (
                "AWS_SECRET_ACCESS_KEY",
                creds["secret"].as_str().expect("secret"),
            ),
            ("AWS_REGION", "us-east-1"),
        ];
        let (outcomes, stdout) = run_lambda(binary(program).to_str().expect("path"), &api, &env, n);
        assert_eq!(
            outcomes.len(),
            n,
            "{function}: {n} invocations expected, got {outcomes:?}\n{stdout}"
        );
        outcomes
    }

    fn spec(&self, file: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(file);
        std::fs::write(&path, text).expect("spec");
        path
    }

    /// An S3 client with `function`'s credentials (or the administrator's).
    async fn s3(&self, function: Option<&str>) -> aws_sdk_s3::Client {
        let creds = match function {
            Some(f) => &self.setup["functions"][f],
            None => &self.setup["admin"],
        };
        let config = aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .endpoint_url(&self.endpoint)
            .force_path_style(true)
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                creds["key"].as_str().expect("key"),
                creds["secret"].as_str().expect("secret"),
                None,
                None,
                "iam test",
            ))
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }
}

fn response(function: &str, o: &Outcome) -> serde_json::Value {
    match o {
        Outcome::Response(body) => serde_json::from_str(body).expect("JSON response"),
        other => panic!("{function} failed with only its own policy: {other:?}"),
    }
}

/// `events/<name>`, its offsets moved up by `by` (a later batch of the same partitions).
fn sample(name: &str, by: i64) -> String {
    let text = std::fs::read_to_string(root().join("events").join(name)).expect("sample");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    for records in v["records"].as_object_mut().expect("records").values_mut() {
        for r in records.as_array_mut().expect("array") {
            let o = r["offset"].as_i64().expect("offset");
            r["offset"] = serde_json::json!(o + by);
        }
    }
    v.to_string()
}

/// One orders record whose value is not JSON (a dead letter).
fn bad_record() -> String {
    let text = std::fs::read_to_string(root().join("events/orders.json")).expect("sample");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let records = v["records"].as_object_mut().expect("records");
    let (key, list) = records.iter_mut().next().expect("a partition");
    let key = key.clone();
    let mut record = list[0].clone();
    record["offset"] = serde_json::json!(50);
    record["value"] = serde_json::json!("bm90IGpzb24="); // "not json"
    records.clear();
    records.insert(key, serde_json::json!([record]));
    v.to_string()
}

/// The HTTP status of a refused S3 call.
fn status<E>(
    e: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

#[test]
fn every_function_works_with_only_its_own_policy_and_no_more() {
    let stack = Stack::new();
    let schedule =
        std::fs::read_to_string(root().join("events/schedule.json")).expect("schedule event");
    let shipped = root().join("infra/pipeline.toml");

    // The scheduled function creates the tables (and the windowed tables' views).
    let r = stack.run(
        "ScheduledFunction",
        "scheduled",
        &shipped,
        vec![schedule.clone()],
    );
    let report = response("scheduled", &r[0]);
    assert_eq!(report["failures"], serde_json::json!([]), "{report}");

    // Ingest lands the three topics' batches (data files, pending batches, partition states),
    // evolving nothing yet.
    let r = stack.run(
        "IngestFunction",
        "ingest",
        &shipped,
        vec![
            sample("orders.json", 0),
            sample("payments.json", 0),
            sample("readings.json", 0),
            bad_record(),
        ],
    );
    for o in &r {
        let summary = response("ingest", o);
        assert!(summary["records"].as_u64() > Some(0), "{summary}");
    }

    // The scheduled function commits them, runs the interval join and maintenance.
    let r = stack.run(
        "ScheduledFunction",
        "scheduled",
        &shipped,
        vec![schedule.clone()],
    );
    let report = response("scheduled", &r[0]);
    assert_eq!(report["failures"], serde_json::json!([]), "{report}");
    assert!(report["commit"]["batches"].as_u64() >= Some(3), "{report}");

    // A deploy adds a column to orders: ingest's first invocation evolves the table (a
    // metadata file and a Glue swap) before it lands the batch with the column.
    let text = std::fs::read_to_string(&shipped).expect("spec").replace(
        r#"  { name = "status",      type = "string" },"#,
        r#"  { name = "status",      type = "string" },
  { name = "coupon",      type = "string" },"#,
    );
    assert!(text.contains("coupon"));
    let evolved = stack.spec("evolved.toml", &text);
    let r = stack.run(
        "IngestFunction",
        "ingest",
        &evolved,
        vec![sample("orders.json", 100)],
    );
    let summary = response("ingest", &r[0]);
    assert!(summary["accepted"].as_u64() > Some(0), "{summary}");

    // The commit trigger (the state table's stream) commits that batch.
    let stream_event = serde_json::json!({"Records": [{
        "eventSource": "aws:dynamodb",
        "eventName": "INSERT",
        "dynamodb": {"Keys": {"pk": {"S": "pending#0"}, "sk": {"S": "x"}}}
    }]})
    .to_string();
    let r = stack.run(
        "CommitTriggerFunction",
        "scheduled",
        &evolved,
        vec![stream_event],
    );
    let triggered = response("commit trigger", &r[0]);
    assert!(
        triggered["triggered_commit"]["files"].as_u64() > Some(0),
        "the trigger committed the batch: {triggered}"
    );

    // A table whose columns come from the Glue Schema Registry: the scheduled function reads
    // the subject's latest version at every run.
    let registry = stack.spec(
        "registry.toml",
        &format!(
            r#"
[[tables]]
name = "orders_registry"
topic = "orders-avro"
format = "avro"
columns = "from-registry"
subject = "{}/orders-value"
"#,
            stack.name
        ),
    );
    let r = stack.run(
        "ScheduledFunction",
        "scheduled",
        &registry,
        vec![schedule.clone()],
    );
    let report = response("scheduled (registry)", &r[0]);
    assert_eq!(report["failures"], serde_json::json!([]), "{report}");
    let r = stack.run(
        "CommitTriggerFunction",
        "scheduled",
        &registry,
        vec![serde_json::json!({"Records": [{"eventSource": "aws:dynamodb"}]}).to_string()],
    );
    response("commit trigger (registry)", &r[0]);

    // What ingest must not do, although wider grants cover the places.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let admin = stack.s3(None).await;
        let ingest = stack.s3(Some("IngestFunction")).await;
        let prefix = format!("warehouse/{}.db/dead_letters/data/", stack.database());
        let listed = admin
            .list_objects_v2()
            .bucket(&stack.name)
            .prefix(&prefix)
            .send()
            .await
            .expect("list");
        let dead_letter = listed
            .contents()
            .first()
            .and_then(|o| o.key())
            .expect("the samples carry bad records: a dead-letter file")
            .to_string();
        let refused = |status: Option<u16>, what: &str| {
            assert_eq!(status, Some(403), "ingest was not refused to {what}");
        };
        let e = ingest
            .get_object()
            .bucket(&stack.name)
            .key(&dead_letter)
            .send()
            .await
            .expect_err("ingest read a dead letter's data");
        refused(status(&e), "read a dead letter's data");
        // The joins' state: written by the administrator here (the scheduled stage's), and
        // neither readable, writable nor deletable by ingest.
        let join_state = "warehouse/_state/join/order_payments/x.parquet";
        admin
            .put_object()
            .bucket(&stack.name)
            .key(join_state)
            .body(bytes::Bytes::from_static(b"x").into())
            .send()
            .await
            .expect("admin writes");
        let e = ingest
            .get_object()
            .bucket(&stack.name)
            .key(join_state)
            .send()
            .await
            .expect_err("ingest read the join's state");
        refused(status(&e), "read the join's state");
        let e = ingest
            .put_object()
            .bucket(&stack.name)
            .key(join_state)
            .body(bytes::Bytes::from_static(b"x").into())
            .send()
            .await
            .expect_err("ingest wrote the join's state");
        refused(status(&e), "write the join's state");
        let e = ingest
            .delete_object()
            .bucket(&stack.name)
            .key(join_state)
            .send()
            .await
            .expect_err("ingest deleted the join's state");
        refused(status(&e), "delete the join's state");
        let e = ingest
            .put_object()
            .bucket(&stack.name)
            .key(format!(
                "warehouse/{}.db/orders/x.parquet",
                stack.database()
            ))
            .body(bytes::Bytes::from_static(b"x").into())
            .send()
            .await
            .expect_err("ingest wrote outside data/ and metadata/");
        refused(status(&e), "write outside data/ and metadata/");
    });
}
