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
        .filter(|v| v.get("_aws").is_some())
        .collect();
    assert_eq!(emf.len(), 3, "one metrics line per invocation:\n{stdout}");
    assert_eq!(emf[0]["RecordsIn"], 6.0);
    assert_eq!(emf[1]["RecordsAlreadySeen"], 6.0);
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
    let (outcomes, _) = run_lambda(env!("CARGO_BIN_EXE_ingest"), &api, &env, 1);
    match outcomes.first() {
        Some(Outcome::Error(body)) => assert!(body.contains("state store"), "{body}"),
        other => panic!("expected an invocation error, got {other:?}"),
    }
}
