//! The ingest binary driven through the Lambda Runtime API, as the Lambda service runs it.

#[path = "../../../tests/support/runtime_api.rs"]
mod runtime_api;

use std::path::Path;

use runtime_api::{Outcome, RuntimeApi, run_lambda};

fn sample(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../events")
            .join(name),
    )
    .expect("sample event")
}

#[test]
fn lands_a_batch_skips_its_redelivery_and_reports_metrics() {
    let home = tempfile::tempdir().expect("home");
    let api = RuntimeApi::start(vec![
        sample("orders.json"),
        sample("orders.json"),
        sample("payments.json"),
    ]);
    let home_str = home.path().to_str().expect("path");
    let (outcomes, stdout) = run_lambda(
        env!("CARGO_BIN_EXE_ingest"),
        &api,
        &[("STREAMTABLE_HOME", home_str)],
        3,
    );
    let summaries: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Response(body) => serde_json::from_str(body).expect("summary JSON"),
            other => panic!("expected a response, got {other:?}"),
        })
        .collect();
    assert_eq!(summaries.len(), 3);
    assert_eq!(
        (
            summaries[0]["accepted"].as_u64(),
            summaries[0]["already_seen"].as_u64()
        ),
        (Some(6), Some(0))
    );
    assert_eq!(
        (
            summaries[1]["accepted"].as_u64(),
            summaries[1]["already_seen"].as_u64()
        ),
        (Some(0), Some(6))
    );
    assert_eq!(summaries[2]["accepted"].as_u64(), Some(6));
    let emf: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("_aws").is_some() && v.get("topic").is_none())
        .collect();
    assert_eq!(emf.len(), 3, "one metrics line per invocation:\n{stdout}");
    // And one per topic of each batch, with its records and lag.
    let per_topic: Vec<(String, f64)> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            Some((
                v.get("topic")?.as_str()?.to_string(),
                v["RecordsIn"].as_f64()?,
            ))
        })
        .collect();
    assert_eq!(
        per_topic,
        [
            ("orders".to_string(), 6.0),
            ("orders".to_string(), 6.0),
            ("payments".to_string(), 6.0)
        ]
    );
    assert_eq!(emf[0]["RecordsIn"], 6.0);
    assert_eq!(emf[1]["RecordsAlreadySeen"], 6.0);
    let cold: Vec<f64> = emf.iter().filter_map(|e| e["ColdStart"].as_f64()).collect();
    assert_eq!(cold, [1.0, 0.0, 0.0]);

    // Every line is one JSON object; each invocation's log line carries its request and trace
    // ids, the cold start only on the first.
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for (i, is_cold) in [(0, true), (1, false), (2, false)] {
        let request = format!("request-{i}");
        let line = lines
            .iter()
            .find(|l| {
                l["function_request_id"] == request.as_str() && l["message"] == "batch landed"
            })
            .unwrap_or_else(|| panic!("no log line of {request}:\n{stdout}"));
        assert_eq!(line["cold_start"], is_cold, "{line}");
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["service"], "test");
        assert_eq!(line["function_name"], "test");
        assert_eq!(line["function_memory_size"], 1024);
        assert!(
            line["xray_trace_id"]
                .as_str()
                .is_some_and(|t| t.starts_with("Root=1-")),
            "{line}"
        );
        assert!(
            line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{line}"
        );
    }
}

#[test]
fn a_batch_that_cannot_land_fails_the_invocation_so_the_esm_retries_it() {
    let api = RuntimeApi::start(vec![sample("orders.json")]);
    let env = [
        ("STREAMTABLE_BACKEND", "aws"),
        ("STREAMTABLE_BUCKET", "nowhere"),
        ("STREAMTABLE_STATE_TABLE", "nowhere"),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let (outcomes, stdout) = run_lambda(env!("CARGO_BIN_EXE_ingest"), &api, &env, 1);
    match outcomes.first() {
        Some(Outcome::Error(body)) => assert!(body.contains("state store"), "{body}"),
        other => panic!("expected an invocation error, got {other:?}"),
    }
    // The failure still shows in the metrics, with the load it could not land.
    let failed = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("InvocationsFailed").is_some())
        .unwrap_or_else(|| panic!("no failure metrics line:\n{stdout}"));
    assert_eq!(
        (
            &failed["InvocationsFailed"],
            &failed["RecordsIn"],
            &failed["ColdStart"]
        ),
        (
            &serde_json::json!(1.0),
            &serde_json::json!(6.0),
            &serde_json::json!(1.0)
        )
    );
}

#[test]
fn a_deployment_whose_topics_disagree_with_the_spec_fails_every_invocation_saying_so() {
    let home = tempfile::tempdir().expect("home");
    let api = RuntimeApi::start(vec![sample("orders.json")]);
    let env = [
        ("STREAMTABLE_HOME", home.path().to_str().expect("path")),
        (
            "STREAMTABLE_TOPICS",
            "orders=prod.orders,payments=payments,readings=readings",
        ),
    ];
    let (outcomes, _) = run_lambda(env!("CARGO_BIN_EXE_ingest"), &api, &env, 1);
    match outcomes.first() {
        Some(Outcome::Error(body)) => assert!(
            body.contains("the deployment and the pipeline spec disagree")
                && body.contains("prod.orders"),
            "{body}"
        ),
        other => panic!("expected an invocation error, got {other:?}"),
    }
}
