//! What lands from the broker, and how.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

#[test]
fn records_from_a_real_broker_land_exactly_once_through_kills_and_aborted_transactions() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let base = unique("e2e");
    let topics: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|s| format!("{base}_{s}"))
        .collect();
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let spec = write_spec(dir.path(), &refs, false);
    for t in &topics {
        client(&bootstrap, &["create", "--topic", t, "--partitions", "4"]);
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    eprintln!("kill schedule seed {seed}");
    let mut rng = Lcg(seed);

    // The producers, in the background: 30,000 + 30,000 + 30,000 plain records and 10,000
    // transactional ones (every third transaction of 50 aborted).
    let plans = [
        serde_json::json!({"topic": topics[0], "records": 30000, "partitions": 4, "bad_every": 100, "compression": "lz4"}),
        serde_json::json!({"topic": topics[1], "records": 30000, "partitions": 4, "bad_every": 100, "compression": "zstd"}),
        serde_json::json!({"topic": topics[2], "records": 30000, "partitions": 4, "bad_every": 100, "compression": "gzip"}),
        serde_json::json!({"topic": topics[0], "records": 10000, "first": 1000000, "partitions": 4, "bad_every": 100, "compression": "zstd",
            "transactional": {"id": format!("{base}-txn"), "per_txn": 50, "abort_every": 3}}),
    ];
    let producers: Vec<std::thread::JoinHandle<Vec<Value>>> = plans
        .into_iter()
        .map(|plan| {
            let b = bootstrap.clone();
            std::thread::spawn(move || produce(&b, plan))
        })
        .collect();

    // Kill `streamtable run` at random moments, five times.
    for round in 0..5 {
        let mut child: Child = streamtable(
            &home,
            &spec,
            &bootstrap,
            &["--batch-size", "2000", "--group-id", &base],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn streamtable run");
        let wait = 500 + rng.below(3000);
        std::thread::sleep(Duration::from_millis(wait));
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        eprintln!("round {round}: killed after {wait} ms");
    }
    let mut manifest = Vec::new();
    for p in producers {
        manifest.extend(p.join().expect("producer"));
    }
    assert_eq!(manifest.len(), 100_000);
    run_until_idle(
        &home,
        &spec,
        &bootstrap,
        &["--batch-size", "2000", "--group-id", &base],
        Duration::from_secs(300),
    );
    let dead = keys(&home, "dead_letters");
    for t in &topics {
        assert_exactly_once(&home, t, &manifest, &dead);
    }
    let want = expected(&manifest);
    let aborted = want
        .get(&(topics[0].clone(), "aborted".to_string()))
        .map_or(0, BTreeSet::len);
    assert!(aborted >= 3000, "aborted transactions: {aborted} records");
    // The consumer group's offsets were committed after landed batches: Kafka's view of the
    // group has reached every record the tables hold.
    let committed = client(
        &bootstrap,
        &["committed", "--topic", &topics[1], "--group", &base],
    );
    for k in keys(&home, &topics[1]) {
        let (p, o) = (k[0].as_i64().unwrap_or(-1), k[1].as_i64().unwrap_or(-1));
        let c = committed[p.to_string()].as_i64().unwrap_or(-1);
        assert!(
            c > o,
            "{}/{p}: the group committed {c}, the table holds offset {o}",
            topics[1]
        );
    }
}

/// Kafka's corners, each produced by confluent-kafka: a compacted topic (offsets missing where
/// the cleaner removed records), null keys and tombstones, records near the size limits (one
/// over `max_record_bytes`, one of 5.5 MB that an invocation takes alone), and a topic of 64
/// partitions.
#[test]
fn compacted_topics_tombstones_null_keys_large_values_and_64_partitions_land() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let base = unique("corners");
    let compacted = format!("{base}_compacted");
    let wide = format!("{base}_wide");
    let sizes = format!("{base}_sizes");
    let spec = write_spec(dir.path(), &[&compacted, &wide, &sizes], false);
    client(
        &bootstrap,
        &[
            "create",
            "--topic",
            &compacted,
            "--partitions",
            "2",
            "--config",
            "cleanup.policy=compact",
            "--config",
            "segment.ms=100",
            "--config",
            "min.cleanable.dirty.ratio=0.01",
            "--config",
            "delete.retention.ms=100",
        ],
    );
    client(
        &bootstrap,
        &["create", "--topic", &wide, "--partitions", "64"],
    );
    client(
        &bootstrap,
        &["create", "--topic", &sizes, "--partitions", "1"],
    );

    // The compacted topic: 10 keys written 50 times each, a null key and a tombstone now and
    // then; then wait for the cleaner to remove superseded records.
    let mut manifest = produce(
        &bootstrap,
        serde_json::json!({"topic": compacted, "records": 500, "partitions": 2, "keys": 10,
            "tombstone_every": 37, "bad_every": 0, "compression": "lz4"}),
    );
    let produced = manifest.len();
    let deadline = Instant::now() + Duration::from_secs(60);
    let survivors = loop {
        // A record after the cleaner's delay rolls the active segment.
        std::thread::sleep(Duration::from_millis(1500));
        manifest.extend(produce(
            &bootstrap,
            serde_json::json!({"topic": compacted, "records": 2, "first": 100000 + manifest.len(),
                "partitions": 2, "keys": 10, "compression": "lz4"}),
        ));
        let read = client(&bootstrap, &["consume", "--topic", &compacted]);
        let n = read.as_array().map_or(0, Vec::len);
        if n < produced / 2 {
            break read;
        }
        assert!(
            Instant::now() < deadline,
            "the cleaner never compacted {compacted}: {n} of {produced} records remain"
        );
    };
    let survivors: BTreeSet<(i64, i64)> = survivors
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r["partition"].as_i64().unwrap_or(-1),
                r["offset"].as_i64().unwrap_or(-1),
            )
        })
        .collect();

    // 64 partitions, null keys every 7th record.
    let wide_manifest = produce(
        &bootstrap,
        serde_json::json!({"topic": wide, "records": 640, "partitions": 64, "null_key_every": 7,
            "bad_every": 50, "compression": "zstd"}),
    );
    // Values near the limits: 900 kB (lands), 2 MB (over max_record_bytes: a dead letter) and
    // 5.5 MB (near the 6 MB invocation payload: goes alone, a dead letter).
    let sizes_manifest = produce(
        &bootstrap,
        serde_json::json!({"topic": sizes, "records": 20, "partitions": 1,
            "sizes": [900000, 2000000, 5500000], "compression": "zstd"}),
    );

    run_until_idle(&home, &spec, &bootstrap, &[], Duration::from_secs(240));
    let dead = keys(&home, "dead_letters");

    // The compacted topic: what the log still holds, no more and no less.
    let landed: BTreeSet<(i64, i64)> = keys(&home, &compacted)
        .iter()
        .map(|k| (k[0].as_i64().unwrap_or(-1), k[1].as_i64().unwrap_or(-1)))
        .collect();
    let tombstones: BTreeSet<(i64, i64)> = dead
        .iter()
        .filter(|k| k[0].as_str() == Some(compacted.as_str()))
        .map(|k| (k[1].as_i64().unwrap_or(-1), k[2].as_i64().unwrap_or(-1)))
        .collect();
    let mut all: BTreeSet<(i64, i64)> = landed.clone();
    all.extend(&tombstones);
    // The cleaner may have removed more since it was read, never less.
    assert!(
        all.is_subset(&survivors),
        "{compacted}: landed records the log no longer held"
    );
    assert!(
        survivors.len() - all.len() <= survivors.len() / 2 && !landed.is_empty(),
        "{compacted}: {} of {} surviving records landed",
        all.len(),
        survivors.len()
    );
    assert!(
        landed.len() + tombstones.len() < produced,
        "nothing was compacted"
    );

    assert_exactly_once(&home, &wide, &wide_manifest, &dead);
    let wide_partitions: BTreeSet<i64> = keys(&home, &wide)
        .iter()
        .map(|k| k[0].as_i64().unwrap_or(-1))
        .collect();
    assert_eq!(wide_partitions.len(), 64);

    // 900 kB lands; 2 MB and 5.5 MB are dead letters (over max_record_bytes).
    let mut m = sizes_manifest.clone();
    for r in &mut m {
        if r["kind"] == "size2000000" || r["kind"] == "size5500000" {
            r["kind"] = "bad".into();
        }
    }
    assert_exactly_once(&home, &sizes, &m, &dead);
}

/// The broker stopped and started again mid-run (the partitions' leader restarts): `run`
/// waits, reconnects and lands what was produced before and after, exactly once.
#[test]
fn a_broker_restart_mid_run_loses_and_duplicates_nothing() {
    let Ok(kafka_local) = std::env::var("STREAMTABLE_KAFKA_LOCAL") else {
        panic!("STREAMTABLE_KAFKA_LOCAL is not set: run ./scripts/test, which sets it");
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("kafka");
    let start = |port: Option<&str>| -> (Child, String) {
        let mut c = Command::new(&kafka_local);
        c.arg("--data").arg(&data);
        if let Some(p) = port {
            c.args(["--port", p]);
        }
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start scripts/kafka-local");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("read bootstrap line");
        let bootstrap = line
            .trim()
            .strip_prefix("bootstrap=")
            .unwrap_or_else(|| panic!("kafka-local printed {line:?}"))
            .to_string();
        (child, bootstrap)
    };
    let stop = |child: &mut Child| {
        // SIGTERM: the script stops the broker cleanly (SIGKILL would orphan it).
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
    };
    let (mut broker, bootstrap) = start(None);
    let port = bootstrap.rsplit(':').next().unwrap_or_default().to_string();
    let home = dir.path().join("home");
    let topic = unique("restart");
    let spec = write_spec(dir.path(), &[&topic], false);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "3"],
    );
    let mut manifest = produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 3000, "partitions": 3, "bad_every": 100}),
    );
    let mut run = streamtable(&home, &spec, &bootstrap, &["--until-idle", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn streamtable run");
    std::thread::sleep(Duration::from_secs(2));
    stop(&mut broker);
    std::thread::sleep(Duration::from_secs(2));
    let (mut broker, again) = start(Some(&port));
    assert_eq!(again, bootstrap);
    manifest.extend(produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 3000, "first": 3000, "partitions": 3, "bad_every": 100}),
    ));
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = run.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "run did not finish after the restart"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = run.wait_with_output().expect("output");
    assert!(
        status.success(),
        "run failed across the restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dead = keys(&home, "dead_letters");
    assert_exactly_once(&home, &topic, &manifest, &dead);
    stop(&mut broker);
}

/// A table with `kafka_headers = true` keeps each record's headers as Kafka sent them
/// (repeated keys in order, a header without a value, binary values), read back by pyiceberg.
#[test]
fn headers_with_repeated_keys_land_in_kafka_headers() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let topic = unique("headers");
    let spec = write_spec(dir.path(), &[&topic], true);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "1"],
    );
    let manifest = produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 20, "partitions": 1, "headers": true}),
    );
    run_until_idle(&home, &spec, &bootstrap, &[], Duration::from_secs(120));
    assert_exactly_once(&home, &topic, &manifest, &keys(&home, "dead_letters"));
    let out = Command::new(python())
        .arg(script("read_table.py"))
        .args([
            "--reader",
            "pyiceberg",
            "--catalog",
            "sql",
            "--table",
            &topic,
            "--rows",
        ])
        .arg("--home")
        .arg(&home)
        .output()
        .expect("run read_table.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let columns: Vec<&str> = v["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let h = columns
        .iter()
        .position(|c| *c == "kafka_headers")
        .expect("a kafka_headers column");
    let n = columns.iter().position(|c| *c == "n").expect("n");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 20);
    for row in rows {
        let n: u64 = row[n].as_str().and_then(|s| s.parse().ok()).expect("n");
        let headers = row[h].as_str().expect("headers as text");
        let want = format!(
            "[{{'key': 'trace', 'value': b't{n}'}}, {{'key': 'trace', 'value': b'again'}}, \
             {{'key': 'bin', 'value': b'\\x00\\xff{}'}}, {{'key': 'none', 'value': None}}]",
            match n % 256 {
                9 => "\\t".to_string(),
                10 => "\\n".to_string(),
                13 => "\\r".to_string(),
                b @ 0x20..=0x7e if b != u64::from(b'\\') && b != u64::from(b'\'') => {
                    (b as u8 as char).to_string()
                }
                b => format!("\\x{b:02x}"),
            }
        );
        assert_eq!(headers, want, "record {n}");
    }
}

/// `run --invoke URL` against a stand-in for a Lambda Invoke endpoint that fails the first two
/// invocations: the events have the event source mapping's shape (eventSource, ARN,
/// `topic-partition` keys, base64 keys and values, headers as key → byte arrays, at most
/// `--batch-size` records), and a failed batch is retried whole, unchanged.
#[test]
fn invocations_have_the_esm_shape_and_a_failed_batch_is_retried_whole() {
    use base64::Engine as _;
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let bodies = dir.path().join("bodies");
    std::fs::create_dir_all(&bodies).expect("mkdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let mut server = Command::new(python())
        .arg(script("fake_invoke.py"))
        .arg(port.to_string())
        .arg(&bodies)
        .arg("2")
        .spawn()
        .expect("start fake_invoke.py");
    let home = dir.path().join("home");
    let topic = unique("invoke");
    let spec = write_spec(dir.path(), &[&topic], false);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "2"],
    );
    produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 250, "partitions": 2, "headers": true,
            "null_key_every": 5}),
    );
    std::thread::sleep(Duration::from_millis(500));
    let url = format!("http://127.0.0.1:{port}/2015-03-31/functions/ingest/invocations");
    run_until_idle(
        &home,
        &spec,
        &bootstrap,
        &[
            "--invoke",
            &url,
            "--batch-size",
            "100",
            "--event-source",
            "msk",
        ],
        Duration::from_secs(120),
    );
    let _ = server.kill();
    let _ = server.wait();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&bodies)
        .expect("bodies")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let events: Vec<Value> = files
        .iter()
        .map(|f| serde_json::from_slice(&std::fs::read(f).expect("read")).expect("JSON"))
        .collect();
    assert!(events.len() >= 5, "{} invocations", events.len());
    // The two failures and the success that follows them are the same batch.
    assert_eq!(events[0], events[1]);
    assert_eq!(events[1], events[2]);
    let mut seen: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for e in &events[2..] {
        assert_eq!(e["eventSource"], "aws:kafka");
        assert!(
            e["eventSourceArn"]
                .as_str()
                .is_some_and(|a| a.starts_with("arn:aws:kafka:"))
        );
        assert_eq!(e["bootstrapServers"].as_str(), Some(bootstrap.as_str()));
        let records = e["records"].as_object().expect("records");
        let count: usize = records
            .values()
            .map(|v| v.as_array().map_or(0, Vec::len))
            .sum();
        assert!(count <= 100, "{count} records in one invocation");
        for (group, recs) in records {
            for r in recs.as_array().expect("array") {
                let p = r["partition"].as_i64().expect("partition");
                assert_eq!(group, &format!("{topic}-{p}"));
                assert_eq!(r["topic"].as_str(), Some(topic.as_str()));
                assert_eq!(r["timestampType"], "CREATE_TIME");
                let value = base64::engine::general_purpose::STANDARD
                    .decode(r["value"].as_str().expect("value"))
                    .expect("base64");
                let v: Value = serde_json::from_slice(&value).expect("the produced JSON");
                let n = v["n"].as_i64().expect("n");
                if n % 5 == 0 {
                    assert!(r["key"].is_null(), "record {n} has no key");
                } else {
                    let key = base64::engine::general_purpose::STANDARD
                        .decode(r["key"].as_str().expect("key"))
                        .expect("base64");
                    assert_eq!(key, format!("k{}", n % 97).into_bytes());
                }
                let trace: Vec<u8> = format!("t{n}").into_bytes();
                assert_eq!(
                    r["headers"],
                    serde_json::json!([{"trace": trace}, {"trace": b"again".to_vec()},
                        {"bin": [0, 255, n % 256]}, {"none": null}]),
                    "record {n}'s headers"
                );
                seen.entry(p)
                    .or_default()
                    .push(r["offset"].as_i64().expect("offset"));
            }
        }
    }
    // Every record once, in offset order per partition, across the invocations that landed.
    let total: usize = seen.values().map(Vec::len).sum();
    assert_eq!(total, 250);
    for offsets in seen.values() {
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    }
}

/// `streamtable produce` of the demo's payments: every record is delivered (none stamped ahead
/// of the clock, which a broker refuses past an hour, `log.message.timestamp.after.max.ms`);
/// `run` with a spec naming a topic that does not exist still finishes (`--until-idle`:
/// nothing to read).
#[test]
fn produce_delivers_records_stamped_ahead_and_run_finishes_beside_a_missing_topic() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let topic = unique("p_payments");
    let out = Command::new(env!("CARGO_BIN_EXE_streamtable"))
        .env("STREAMTABLE_HOME", &home)
        .args([
            "produce",
            "--bootstrap-servers",
            &bootstrap,
            "--topic",
            &topic,
        ])
        .args(["--records", "400", "--partitions", "2", "--bad-every", "0"])
        .output()
        .expect("run streamtable produce");
    assert!(
        out.status.success(),
        "produce failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = client(&bootstrap, &["consume", "--topic", &topic]);
    let n = read.as_array().map_or(0, Vec::len);
    assert!(n >= 400, "{n} of at least 400 records in {topic}");

    let missing = unique("never_created");
    let spec = write_spec(dir.path(), &[&topic, &missing], false);
    let started = Instant::now();
    run_until_idle(&home, &spec, &bootstrap, &[], Duration::from_secs(60));
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// `streamtable demo --bootstrap-servers`: the whole demo through the broker, in the spec's
/// formats. Every record of each demo topic is in its table (once) or a dead letter.
#[test]
fn the_demo_runs_through_the_broker() {
    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let prefix = format!("{}-", unique("demo"));
    let out = Command::new(env!("CARGO_BIN_EXE_streamtable"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("STREAMTABLE_HOME", &home)
        .env_remove("STREAMTABLE_PIPELINE")
        .env_remove("STREAMTABLE_BACKEND")
        .args([
            "demo",
            "--bootstrap-servers",
            &bootstrap,
            "--events",
            "3000",
        ])
        .args(["--topic-prefix", &prefix])
        .output()
        .expect("run streamtable demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Revenue in EUR by country"), "{stdout}");
    let dead = keys(&home, "dead_letters");
    for table in ["orders", "payments", "readings"] {
        let topic = format!("{prefix}{table}");
        let all: BTreeSet<(i64, i64)> = client(&bootstrap, &["consume", "--topic", &topic])
            .as_array()
            .expect("records")
            .iter()
            .map(|r| {
                (
                    r["partition"].as_i64().unwrap_or(-1),
                    r["offset"].as_i64().unwrap_or(-1),
                )
            })
            .collect();
        assert!(all.len() >= 3000, "{topic}: {} records", all.len());
        let rows: Vec<(i64, i64)> = keys(&home, table)
            .iter()
            .map(|k| (k[0].as_i64().unwrap_or(-1), k[1].as_i64().unwrap_or(-1)))
            .collect();
        let mut landed: BTreeSet<(i64, i64)> = rows.iter().copied().collect();
        assert_eq!(landed.len(), rows.len(), "{table}: a record landed twice");
        landed.extend(
            dead.iter()
                .filter(|k| k[0].as_str() == Some(topic.as_str()))
                .map(|k| (k[1].as_i64().unwrap_or(-1), k[2].as_i64().unwrap_or(-1))),
        );
        assert_eq!(
            landed, all,
            "{table}: records neither in the table nor dead letters"
        );
    }
}

/// `streamtable audit` with and without `--bootstrap-servers` on a topic with transactions.
fn audit(home: &Path, spec: &Path, bootstrap: Option<&str>) -> (bool, Value) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_streamtable"));
    c.env("STREAMTABLE_HOME", home)
        .env("STREAMTABLE_PIPELINE", spec)
        .env_remove("STREAMTABLE_BACKEND")
        .env("RUST_LOG", "warn")
        .args(["audit", "--json"]);
    if let Some(b) = bootstrap {
        c.args(["--bootstrap-servers", b]);
    }
    let out = c.output().expect("run streamtable audit");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "audit JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), json)
}

/// The ledger tells the gaps a transactional producer leaves (aborted records, commit markers)
/// from losses; the topic's own log names the records the event source skipped, which no
/// ledger can see.
#[test]
fn the_audit_tells_kafka_gaps_from_losses_and_reads_the_log() {
    use base64::Engine;

    let bootstrap = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let topic = unique("audit");
    let spec = write_spec(dir.path(), &[&topic], false);
    client(
        &bootstrap,
        &["create", "--topic", &topic, "--partitions", "1"],
    );
    produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 20, "partitions": 1}),
    );
    produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 30, "first": 1000, "partitions": 1,
            "transactional": {"id": format!("{topic}-txn"), "per_txn": 5, "abort_every": 3}}),
    );
    run_until_idle(&home, &spec, &bootstrap, &[], Duration::from_secs(120));
    for b in [None, Some(bootstrap.as_str())] {
        let (ok, a) = audit(&home, &spec, b);
        assert!(ok, "{a:#}");
        let p = &a["tables"][0]["partitions"][0];
        // 20 plain records, 20 of 30 transactional ones committed.
        assert_eq!(p["delivered"], 40, "{p:#}");
        // Below the checkpoint (after the last committed record): 5 aborted records and 4
        // transactions' markers, never delivered.
        assert_eq!(p["not_delivered_offsets"], 9, "{p:#}");
        if b.is_some() {
            assert_eq!(p["log"]["records"], 40, "{p:#}");
            assert_eq!(p["log"]["not_landed_offsets"], 0, "{p:#}");
        }
    }
    // The event source skips records: of 10 more, an invocation takes only the last 5.
    let more = produce(
        &bootstrap,
        serde_json::json!({"topic": topic, "records": 10, "first": 5000, "partitions": 1}),
    );
    let mut offsets: Vec<i64> = more
        .iter()
        .map(|r| r["offset"].as_i64().expect("offset"))
        .collect();
    offsets.sort_unstable();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let records: Vec<Value> = offsets[5..]
        .iter()
        .map(|o| {
            serde_json::json!({"topic": topic, "partition": 0, "offset": o, "timestamp": 1,
                "timestampType": "CREATE_TIME", "key": b64("k"),
                "value": b64(&format!(r#"{{"id":"x{o}","n":{o},"amount":1.5}}"#)), "headers": []})
        })
        .collect();
    let event =
        serde_json::json!({"eventSource": "aws:kafka", "records": {format!("{topic}-0"): records}});
    let file = dir.path().join("skipping.json");
    std::fs::write(&file, event.to_string()).expect("write event");
    for args in [
        vec!["ingest", "--event", file.to_str().expect("path")],
        vec!["scheduled"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_streamtable"))
            .env("STREAMTABLE_HOME", &home)
            .env("STREAMTABLE_PIPELINE", &spec)
            .env_remove("STREAMTABLE_BACKEND")
            .args(&args)
            .output()
            .expect("run streamtable");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The ledger alone cannot tell a skip from a gap: passed, the 5 listed as not delivered.
    let (ok, a) = audit(&home, &spec, None);
    assert!(ok, "{a:#}");
    let p = &a["tables"][0]["partitions"][0];
    assert_eq!(p["delivered"], 45, "{p:#}");
    // The log can: those 5 are records, in neither table.
    let (ok, a) = audit(&home, &spec, Some(&bootstrap));
    assert!(!ok, "{a:#}");
    let log = &a["tables"][0]["partitions"][0]["log"];
    assert_eq!(log["not_landed_offsets"], 5, "{log:#}");
    assert_eq!(
        log["not_landed"],
        serde_json::json!([[offsets[0], offsets[4]]]),
        "{log:#}"
    );
}
