//! Where `run` starts (checkpoints, LATEST, positions outside the log) and when it stops.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

/// Runs `streamtable run --until-idle` and returns its exit status and standard error.
fn run_status(home: &Path, spec: &Path, bootstrap: &str, extra: &[&str]) -> (bool, String) {
    let out = streamtable(home, spec, bootstrap, extra)
        .args(["--until-idle", "3"])
        .output()
        .expect("run streamtable run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Records deleted (retention, a delete) before they landed, and a topic deleted and created
/// again, put the pipeline's position outside the log: `run` stops naming the partition and
/// the offsets instead of jumping silently (it used to reset to the log's start and drop the
/// new topic's records below the old checkpoint as already seen); `--skip-deleted-records`
/// goes on from the log's start.
#[test]
fn a_position_outside_the_log_stops_run_instead_of_skipping() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let topic = unique("gone");
    let spec = write_spec(dir.path(), &[&topic], false);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "2"],
    );
    let plan = |first: u64, records: u64, partitions: u64| {
        serde_json::json!({"topic": topic, "records": records, "first": first,
            "partitions": partitions})
    };
    let mut manifest = produce(&bootstrap, plan(0, 40, 2));
    run_until_idle(&home, &spec, &bootstrap, &[], Duration::from_secs(60));
    // 20 more per partition, of which the first 10 of each are deleted before they land (two
    // partitions: librdkafka reports each one's reset, queued one after the other).
    manifest.extend(produce(&bootstrap, plan(40, 40, 2)));
    client(
        &bootstrap,
        &["delete-records", "--topic", &topic, "--offset", "30"],
    );
    let (ok, stderr) = run_status(&home, &spec, &bootstrap, &[]);
    assert!(!ok, "run went on past deleted records: {stderr}");
    for p in 0..2 {
        assert!(
            stderr.contains(&format!(
                "{topic}/{p}: the pipeline resumes at offset 20 but the log starts at 30"
            )),
            "{stderr}"
        );
    }
    let (ok, stderr) = run_status(&home, &spec, &bootstrap, &["--skip-deleted-records"]);
    assert!(ok, "{stderr}");
    let landed: Vec<(i64, i64)> = keys(&home, &topic)
        .iter()
        .map(|k| (k[0].as_i64().unwrap_or(-1), k[1].as_i64().unwrap_or(-1)))
        .collect();
    let want: Vec<(i64, i64)> = (0..2)
        .flat_map(|p| (0..20).chain(30..40).map(move |o| (p, o)))
        .collect();
    assert_eq!(landed, want);

    // The topic deleted and created again with fewer records than the checkpoint.
    client(&bootstrap, &["delete-topic", "--topic", &topic]);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "1"],
    );
    produce(&bootstrap, plan(100, 5, 1));
    let (ok, stderr) = run_status(&home, &spec, &bootstrap, &[]);
    assert!(!ok, "run went on with a recreated topic: {stderr}");
    assert!(stderr.contains("created again"), "{stderr}");
    drop(manifest);
}

/// A topic deleted and created again whose new log is longer than the checkpoint: `run` used to
/// resume at the old checkpoint and take the new log's records below it as already seen (lost,
/// with exit 0). The records just below the checkpoint are stamped after the latest one the
/// partition took, so `run` stops, naming the recreation and the recovery; after
/// `streamtable reset-partition … --recreated` every record of the new log lands.
#[test]
fn a_recreated_topic_longer_than_the_checkpoint_stops_run_until_reset() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let topic = unique("recreated");
    let spec = write_spec(dir.path(), &[&topic], false);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "1"],
    );
    let plan = |first: u64, records: u64| serde_json::json!({"topic": topic, "records": records, "first": first, "partitions": 1});
    produce(&bootstrap, plan(0, 60));
    run_until_idle(&home, &spec, &bootstrap, &[], Duration::from_secs(60));
    assert_eq!(keys(&home, &topic).len(), 60);
    std::thread::sleep(Duration::from_millis(50));
    client(&bootstrap, &["delete-topic", "--topic", &topic]);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "1"],
    );
    produce(&bootstrap, plan(1000, 150));
    let (ok, stderr) = run_status(&home, &spec, &bootstrap, &[]);
    assert!(!ok, "run went on with a recreated topic: {stderr}");
    assert!(
        stderr.contains("the topic was deleted and created again")
            && stderr.contains(&format!(
                "streamtable reset-partition {topic} 0 --recreated"
            )),
        "{stderr}"
    );
    assert_eq!(
        keys(&home, &topic).len(),
        60,
        "nothing of the new log landed"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_streamtable"))
        .env("STREAMTABLE_HOME", &home)
        .env("STREAMTABLE_PIPELINE", &spec)
        .env_remove("STREAMTABLE_BACKEND")
        .args([
            "reset-partition",
            &topic,
            "0",
            "--recreated",
            "--from",
            "60",
        ])
        .output()
        .expect("run reset-partition");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("{topic}/0: checkpoint 60 → 0")),
        "{said}"
    );
    run_until_idle(&home, &spec, &bootstrap, &[], Duration::from_secs(60));
    let landed = keys(&home, &topic);
    assert_eq!(landed.len(), 210, "the old log's 60 and the new log's 150");
}

/// Records below where the pipeline started (a LATEST start) stamped after everything it
/// took — producers' event times, a clock ahead — are no sign of a recreated topic: `run`
/// used to stop on them, and the reset it advised then landed records twice.
#[test]
fn records_before_a_latest_start_stamped_ahead_are_no_recreated_topic() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let topic = unique("ahead");
    let spec = write_spec(dir.path(), &[&topic], false);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "1"],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 5, "first": 0, "partitions": 1,
            "timestamp_ms": now + 3_600_000}),
    );
    let latest = ["--starting-position", "latest"];
    let (ok, stderr) = run_status(&home, &spec, &bootstrap, &latest);
    assert!(ok, "{stderr}");
    produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 3, "first": 5, "partitions": 1}),
    );
    for _ in 0..2 {
        let (ok, stderr) = run_status(&home, &spec, &bootstrap, &latest);
        assert!(ok, "{stderr}");
    }
    assert_eq!(
        keys(&home, &topic).len(),
        3,
        "the 3 records after the start, once"
    );
}

/// `--starting-position latest`: the partitions there are at the first start begin at their
/// end, kept in the consumer group at once (a restart before anything landed does not skip
/// what arrived in between); a partition added while running begins at its start; and
/// `--until-idle` finishes (it used to wait forever on partitions that never landed).
#[test]
fn latest_starts_at_the_end_once_and_partitions_added_later_from_their_start() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let topic = unique("latest");
    let group = unique("latest_group");
    let spec = write_spec(dir.path(), &[&topic], false);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "2"],
    );
    let plan = |first: u64, records: u64, partitions: u64| {
        serde_json::json!({"topic": topic, "records": records, "first": first,
            "partitions": partitions})
    };
    produce(&bootstrap, plan(0, 100, 2));
    let latest = [
        "--starting-position",
        "latest",
        "--group-id",
        group.as_str(),
    ];
    let (ok, stderr) = run_status(&home, &spec, &bootstrap, &latest);
    assert!(ok, "{stderr}");
    // Produced while stopped, before anything landed: not skipped by the restart.
    let mut manifest = produce(&bootstrap, plan(100, 10, 2));
    let (ok, stderr) = run_status(&home, &spec, &bootstrap, &latest);
    assert!(ok, "{stderr}");
    // Partitions added while running begin at their start.
    let mut run = streamtable(&home, &spec, &bootstrap, &latest)
        .args(["--until-idle", "8"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn run");
    std::thread::sleep(Duration::from_secs(2));
    client(
        &bootstrap,
        &["add-partitions", "--topic", &topic, "--partitions", "4"],
    );
    std::thread::sleep(Duration::from_secs(1));
    manifest.extend(produce(&bootstrap, plan(200, 40, 4)));
    let deadline = Instant::now() + Duration::from_secs(90);
    while run.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "run did not finish");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = run.wait_with_output().expect("output");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dead = keys(&home, "dead_letters");
    assert_exactly_once(&home, &topic, &manifest, &dead);
}

/// A topic whose batches keep failing (its table refuses the spec's schema change) holds back
/// only itself: the other topic's records land meanwhile (one batch and one invocation in
/// flight per topic, as the template maps each topic on its own).
#[test]
fn a_failing_topic_holds_back_only_itself() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let bad = unique("fail_a");
    let good = unique("fail_b");
    let spec = write_spec(dir.path(), &[&bad, &good], false);
    for t in [&bad, &good] {
        client(&bootstrap, &["create", "--topic", t, "--partitions", "1"]);
        produce(
            &bootstrap,
            serde_json::json!({"topic": t, "records": 10, "partitions": 1}),
        );
    }
    run_until_idle(&home, &spec, &bootstrap, &[], Duration::from_secs(60));
    // `n` long → boolean: a change the catalog refuses, so every batch of `bad` fails.
    let text = std::fs::read_to_string(&spec).expect("spec");
    let changed = text.replacen(
        "{ name = \"n\", type = \"long\", required = true }",
        "{ name = \"n\", type = \"boolean\", required = true }",
        1,
    );
    assert_ne!(text, changed);
    std::fs::write(&spec, changed).expect("write spec");
    let mut manifest = Vec::new();
    for t in [&bad, &good] {
        manifest.extend(produce(
            &bootstrap,
            serde_json::json!({"topic": t, "records": 30, "first": 10, "partitions": 1}),
        ));
    }
    let (ok, stderr) = run_status(&home, &spec, &bootstrap, &["--maximum-retry-attempts", "2"]);
    assert!(!ok, "the refused topic landed: {stderr}");
    assert!(
        stderr.contains("did not land after 3 invocations"),
        "{stderr}"
    );
    let status = Command::new(env!("CARGO_BIN_EXE_streamtable"))
        .env("STREAMTABLE_HOME", &home)
        .env("STREAMTABLE_PIPELINE", &spec)
        .args(["status", "--json"])
        .output()
        .expect("status");
    let v: Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    let next = |t: &str| {
        v["partitions"]
            .as_array()
            .expect("partitions")
            .iter()
            .find(|p| p["topic"] == t)
            .and_then(|p| p["next_offset"].as_i64())
    };
    assert_eq!(next(&good), Some(40), "the healthy topic landed everything");
    assert_eq!(
        next(&bad),
        Some(10),
        "the refused topic landed nothing more"
    );
    drop(manifest);
}

/// `run --until-idle` against a cluster it cannot reach reads nothing and says so with the
/// transient fault's exit code (75), instead of finding "every partition caught up" among none
/// and exiting 0.
#[test]
fn until_idle_against_an_unreachable_cluster_exits_75() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let spec = write_spec(dir.path(), &["nowhere"], false);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let out = streamtable(
        &home,
        &spec,
        &format!("127.0.0.1:{port}"),
        &["--until-idle", "1"],
    )
    .output()
    .expect("run streamtable run");
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
