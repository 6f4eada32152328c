//! The scheduled binary driven through the Lambda Runtime API with the scheduled event.

#[path = "../../../tests/support/runtime_api.rs"]
mod runtime_api;

use std::path::Path;

use runtime_api::{Outcome, RuntimeApi, run_lambda};

#[test]
fn a_scheduled_run_creates_the_tables_and_reports_metrics() {
    let home = tempfile::tempdir().expect("home");
    let schedule = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../events/schedule.json"),
    )
    .expect("sample event");
    let api = RuntimeApi::start(vec![schedule.clone(), schedule]);
    let home_str = home.path().to_str().expect("path");
    let (outcomes, stdout) = run_lambda(
        env!("CARGO_BIN_EXE_scheduled"),
        &api,
        &[("STREAMTABLE_HOME", home_str)],
        2,
    );
    for o in &outcomes {
        match o {
            Outcome::Response(body) => {
                let report: serde_json::Value = serde_json::from_str(body).expect("report JSON");
                assert_eq!(report["commit"]["batches"], 0);
            }
            other => panic!("expected a response, got {other:?}"),
        }
    }
    assert_eq!(outcomes.len(), 2);
    let catalog = home.path().join("catalog.db");
    assert!(
        catalog.exists(),
        "tables were created in the embedded catalog"
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.contains("\"CommitLatencyMs\""))
            .count(),
        2,
        "{stdout}"
    );
}
