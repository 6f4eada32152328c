//! Avro and Protobuf topics behind a schema registry on the embedded backend (SQLite catalog, local files),
//! with the Confluent-compatible registry stand-in.

use crate::common;
use crate::common::format_scenarios as s;

#[tokio::test]
async fn avro_records_land_with_their_values_and_evolve() {
    let h = common::embedded().await;
    s::avro_records_land_and_evolve(&h, None).await;
}

#[tokio::test]
async fn an_unreachable_registry_retries_the_batch() {
    let h = common::embedded().await;
    s::an_unreachable_registry_retries_the_batch(&h).await;
}

#[tokio::test]
async fn protobuf_records_land_with_their_values_and_evolve() {
    let h = common::embedded().await;
    common::protobuf_scenarios::protobuf_records_land_and_evolve(&h, None).await;
}

#[tokio::test]
async fn a_failing_registry_retries_the_batch() {
    let h = common::embedded().await;
    s::a_failing_registry_retries_the_batch(&h).await;
}

#[tokio::test]
async fn columns_from_the_registry_follow_its_versions() {
    let h = common::embedded().await;
    common::registry_columns_scenarios::columns_follow_the_registry(&h, None).await;
}

/// `streamtable check` on a spec whose columns come from a `file:` registry: the columns of the
/// subject's latest version, and the fields that are not columns; a missing subject is an error
/// naming the table, the subject and the file it looked for.
#[test]
fn check_shows_the_columns_a_registry_gives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schemas = dir.path().join("schemas");
    std::fs::create_dir_all(schemas.join("subjects")).expect("mkdir");
    std::fs::write(
        schemas.join("7.avsc"),
        r#"{"type": "record", "name": "Reading", "fields": [
            {"name": "sensor_id", "type": "string"},
            {"name": "temperature", "type": ["null", "double"]},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "tags", "type": {"type": "array", "items": "string"}}]}"#,
    )
    .expect("schema");
    let spec = dir.path().join("pipeline.toml");
    std::fs::write(
        &spec,
        "[registry]\nurl = \"file:schemas\"\n\n[[tables]]\nname = \"readings\"\ntopic = \"readings\"\nformat = \"avro\"\ncolumns = \"from-registry\"\npartition_by = [\"day(at)\"]\n",
    )
    .expect("spec");
    let check = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_streamtable"))
            .arg("--home")
            .arg(dir.path().join("home"))
            .arg("--pipeline")
            .arg(&spec)
            .arg("check")
            .env_remove("STREAMTABLE_BACKEND")
            .env_remove("STREAMTABLE_REGISTRY_URL")
            .output()
            .expect("run streamtable check")
    };
    let out = check();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("table \"readings\"")
            && err.contains("readings-value")
            && err.contains("subjects/readings-value"),
        "{err}"
    );

    std::fs::write(schemas.join("subjects/readings-value"), "7\n").expect("subject");
    let out = check();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("sensor_id        string")
            && text.contains("temperature      double")
            && text.contains("at               timestamp")
            && text.contains(
                "subject readings-value, latest version Confluent schema id 7 (3 columns)"
            )
            && text.contains("not a column: tags: array has no column type"),
        "{text}"
    );
}
