//! The README's own sequence, as a new user follows it, in one home: the embedded demo (twice),
//! the sample events, then the Kafka section through a real broker — `demo
//! --bootstrap-servers`, `produce` of orders and of payments, `run` — and what the user sees
//! at each step: exit codes, counts that add up, produced orders landing as orders (not as
//! late dead letters), the join gaining rows, an audit that passes, and the tables' history.
//!
//! The topics carry a unique prefix (a copy of the shipped spec with its topics renamed), so
//! that the test's logs are its own on the shared broker.

use super::*;

/// One command of the sequence, in `home` with `spec`; its exit status, stdout and stderr.
fn step(home: &Path, spec: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_streamtable"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("STREAMTABLE_HOME", home)
        .env("STREAMTABLE_PIPELINE", spec)
        .env_remove("STREAMTABLE_BACKEND")
        .env("RUST_LOG", "error")
        .args(args)
        .output()
        .expect("run streamtable");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a step that must succeed; its stdout and stderr, joined.
fn ok(home: &Path, spec: &Path, args: &[&str]) -> String {
    let (success, out, err) = step(home, spec, args);
    assert!(success, "streamtable {args:?} failed:\n{out}\n{err}");
    format!("{out}\n{err}")
}

/// The value of `key=N` in a summary line (the first one, or the one after `after`).
fn count(line: &str, after: &str, key: &str) -> i64 {
    let tail = line.split_once(after).map_or("", |(_, t)| t);
    tail.split([' ', ';', '('])
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= after {after:?} in {line}"))
}

/// The value of `key=N` in a summary line, 0 when the line leaves it out.
fn count_or_0(line: &str, key: &str) -> i64 {
    line.split([' ', ';', '('])
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// One number a query answers (`SELECT … AS n`).
fn number(home: &Path, spec: &Path, sql: &str) -> i64 {
    let (success, out, err) = step(home, spec, &["query", sql, "--format", "json"]);
    assert!(success, "{sql}: {err}");
    let rows: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    rows[0]["n"]
        .as_i64()
        .unwrap_or_else(|| panic!("{sql}: {out}"))
}

#[test]
fn the_readme_sequence_works_in_one_home_through_a_real_broker() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let prefix = unique("readme");
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml"))
            .expect("the shipped spec");
    let mut renamed = shipped.clone();
    for t in ["orders", "payments", "readings", "order_status"] {
        renamed = renamed.replace(
            &format!("topic = \"{t}\""),
            &format!("topic = \"{prefix}-{t}\""),
        );
    }
    assert_ne!(renamed, shipped);
    let spec = dir.path().join("pipeline.toml");
    std::fs::write(&spec, renamed).expect("write spec");
    let topic = |t: &str| format!("{prefix}-{t}");

    // `demo`, twice: the second continues the first's event time instead of jumping ahead,
    // so its derived tables drop almost nothing as late.
    for _ in 0..2 {
        let out = ok(&home, &spec, &["demo", "--events", "2000"]);
        let line = out
            .lines()
            .find(|l| l.contains("records="))
            .unwrap_or_else(|| panic!("{out}"));
        let late = count(line, "derived tables:", "dead_lettered");
        assert!(late <= 2000 * 4 / 100, "{late} late in: {line}");
    }

    // The README's `ingest` of the sample events, after the demo: already seen, and said why.
    let mut samples = Vec::new();
    for name in ["orders", "payments"] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("events/{name}.json")),
        )
        .expect("sample event");
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(
            &path,
            text.replace(&format!("\"{name}"), &format!("\"{}", topic(name))),
        )
        .expect("write sample");
        samples.push(path);
    }
    let out = ok(
        &home,
        &spec,
        &[
            "ingest",
            "--event",
            samples[0].to_str().expect("path"),
            "--event",
            samples[1].to_str().expect("path"),
        ],
    );
    assert!(
        out.contains("already_seen=6") && out.contains("below their partitions' checkpoints"),
        "{out}"
    );

    // The Kafka section: the demo through the broker, in the same home. The demo's own
    // checkpoints are not the cluster's: its partitions move to the cluster's logs.
    let joined_before = number(&home, &spec, "SELECT count(*) AS n FROM order_payments");
    let out = ok(
        &home,
        &spec,
        &[
            "demo",
            "--events",
            "2000",
            "--bootstrap-servers",
            &bootstrap,
        ],
    );
    assert!(
        out.contains("move to this cluster's logs") && !out.contains("was the topic deleted"),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| l.contains("records="))
        .unwrap_or_else(|| panic!("{out}"));
    let (records, accepted, dead) = (
        count(line, "", "records"),
        count(line, "", "accepted"),
        count(line, "", "dead_lettered"),
    );
    // The four topics' records (and the producer's copies), every one landed or a dead letter:
    // readings in the spec's JSON, not Avro (no invalid_utf8 wall).
    assert!(records >= 4 * 2000, "{line}");
    let deletes = count_or_0(line, "key_deletes");
    assert_eq!(accepted + deletes + dead, records, "{line}");
    assert!(dead <= records * 2 / 100, "{line}");
    let joined_demo = number(&home, &spec, "SELECT count(*) AS n FROM order_payments");
    assert!(
        joined_demo > joined_before,
        "{joined_before} → {joined_demo}"
    );

    // `produce` orders (at a rate) and payments (at full speed), then `run`: the orders land
    // as orders, the join gains the pairs, and the printed counts add up.
    for (t, rate) in [("orders", "5000"), ("payments", "0")] {
        let out = ok(
            &home,
            &spec,
            &[
                "produce",
                "--bootstrap-servers",
                &bootstrap,
                "--topic",
                &topic(t),
                "--records",
                "5000",
                "--rate",
                rate,
            ],
        );
        assert!(
            out.contains("the 5000 asked for") && out.contains("producer-retry copies"),
            "{out}"
        );
    }
    let late_before = number(
        &home,
        &spec,
        "SELECT count(*) AS n FROM dead_letters WHERE error_kind = 'late'",
    );
    let out = ok(
        &home,
        &spec,
        &[
            "run",
            "--bootstrap-servers",
            &bootstrap,
            "--until-idle",
            "3",
            "--maximum-batching-window",
            "0.5",
        ],
    );
    let line = out
        .lines()
        .find(|l| l.contains("batches landed"))
        .unwrap_or_else(|| panic!("{out}"));
    let (records, accepted, seen, dead) = (
        count(line, "", "records"),
        count(line, "", "accepted"),
        count(line, "", "already_seen"),
        count(line, "", "dead_lettered"),
    );
    assert!(records >= 2 * 5000, "{line}");
    let deletes = count_or_0(line, "key_deletes");
    assert_eq!(accepted + deletes + seen + dead, records, "{line}");
    let late = number(
        &home,
        &spec,
        "SELECT count(*) AS n FROM dead_letters WHERE error_kind = 'late'",
    ) - late_before;
    assert!(late <= records / 100, "{late} late of {records}: {line}");
    let joined = number(&home, &spec, "SELECT count(*) AS n FROM order_payments");
    // One payment in 250 is bad and one in 50 pays an order of another channel: the rest
    // (~9,760) find their order.
    assert!(
        joined - joined_demo >= 4 * 5000 / 5,
        "the join gained {} rows",
        joined - joined_demo
    );

    // Every offset accounted for, the moved partitions' local rows left out.
    let (success, out, err) = step(&home, &spec, &["audit"]);
    assert!(success, "{out}\n{err}");

    // The tables' history, as in Athena: one snapshot per commit, and a time before a table
    // existed is said to be so.
    let snapshots = number(
        &home,
        &spec,
        "SELECT count(*) AS n FROM \"orders$snapshots\" WHERE operation = 'append'",
    );
    assert!(snapshots >= 3, "{snapshots} append snapshots");
    let history = number(
        &home,
        &spec,
        "SELECT count(*) AS n FROM \"orders$history\" WHERE is_current_ancestor",
    );
    assert!(history >= snapshots, "{history} < {snapshots}");
    let files = number(
        &home,
        &spec,
        "SELECT sum(record_count) AS n FROM \"orders$files\" WHERE content = 0",
    );
    assert_eq!(
        files,
        number(&home, &spec, "SELECT count(*) AS n FROM orders"),
        "$files' records are the table's rows"
    );
    let (success, _, err) = step(
        &home,
        &spec,
        &[
            "query",
            "SELECT count(*) AS n FROM orders",
            "--as-of",
            "2000-01-01T00:00:00Z",
        ],
    );
    assert!(success, "{err}");
    assert!(
        err.contains("orders had no snapshot yet at the --as-of time"),
        "{err}"
    );
    // A metadata table that does not exist, and a view's, are said so.
    for (sql, says) in [
        (
            "SELECT * FROM \"orders$manifests\"",
            "no metadata table \"orders$manifests\"",
        ),
        (
            "SELECT * FROM \"orders_per_minute$files\"",
            "\"orders_per_minute_partials$files\"",
        ),
    ] {
        let (success, _, err) = step(&home, &spec, &["query", sql]);
        assert!(!success && err.contains(says), "{sql}: {err}");
    }
}
