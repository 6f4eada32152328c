//! `streamtable run` against a real Apache Kafka broker (scripts/kafka-local, started by
//! scripts/test as `STREAMTABLE_TEST_KAFKA`), with records produced by a client nobody here
//! wrote (confluent-kafka, tests/py/kafka_client.py), read back by pyiceberg: `landing` (what
//! lands, and how: exactly once through kills, Kafka's corners, the events' shape, the demo),
//! `positions` (where `run` starts and when it stops).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn broker() -> String {
    std::env::var("STREAMTABLE_TEST_KAFKA").expect(
        "STREAMTABLE_TEST_KAFKA is not set: these tests need a Kafka broker; run ./scripts/test, \
         which starts one (scripts/kafka-local)",
    )
}

fn python() -> String {
    std::env::var("STREAMTABLE_TEST_PYTHON").expect(
        "STREAMTABLE_TEST_PYTHON is not set: run ./scripts/test, which installs confluent-kafka \
         and pyiceberg",
    )
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// A name no other test (or earlier run on the same broker) uses.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}_{:x}", nanos % (1 << 40))
}

fn client(bootstrap: &str, args: &[&str]) -> Value {
    let out = Command::new(python())
        .arg(script("kafka_client.py"))
        .args(args)
        .args(["--bootstrap", bootstrap])
        .output()
        .expect("run kafka_client.py");
    assert!(
        out.status.success(),
        "kafka_client.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout).expect("kafka_client.py prints JSON")
    }
}

fn produce(bootstrap: &str, plan: Value) -> Vec<Value> {
    let v = client(bootstrap, &["produce", "--plan", &plan.to_string()]);
    v.as_array().expect("a manifest").clone()
}

/// A spec with one JSON table per topic (table name = topic), columns id, n, amount.
fn write_spec(dir: &Path, topics: &[&str], headers: bool) -> PathBuf {
    let mut toml = String::from("[settings]\nmax_record_bytes = 1048576\n");
    for t in topics {
        toml.push_str(&format!(
            "\n[[tables]]\nname = \"{t}\"\ntopic = \"{t}\"\n{}columns = [\n  \
             {{ name = \"id\", type = \"string\", required = true }},\n  \
             {{ name = \"n\", type = \"long\", required = true }},\n  \
             {{ name = \"amount\", type = \"double\" }},\n]\n",
            if headers {
                "kafka_headers = true\n"
            } else {
                ""
            }
        ));
    }
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, toml).expect("write spec");
    path
}

fn streamtable(home: &Path, spec: &Path, bootstrap: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_streamtable"));
    c.env("STREAMTABLE_HOME", home)
        .env("STREAMTABLE_PIPELINE", spec)
        .env_remove("STREAMTABLE_BACKEND")
        .env("RUST_LOG", "warn")
        .args(["run", "--bootstrap-servers", bootstrap])
        .args([
            "--maximum-batching-window",
            "0.2",
            "--schedule-interval",
            "1",
        ])
        .args(extra);
    c
}

/// Runs `streamtable run --until-idle` to its end, within `limit`.
fn run_until_idle(home: &Path, spec: &Path, bootstrap: &str, extra: &[&str], limit: Duration) {
    let mut child = streamtable(home, spec, bootstrap, extra)
        .args(["--until-idle", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn streamtable run");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            assert!(
                status.success(),
                "streamtable run failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "streamtable run --until-idle did not finish within {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// pyiceberg's (partition, offset) keys of `table` (with the topic for dead_letters).
fn keys(home: &Path, table: &str) -> Vec<Value> {
    let out = Command::new(python())
        .arg(script("read_table.py"))
        .args([
            "--reader",
            "pyiceberg",
            "--catalog",
            "sql",
            "--table",
            table,
        ])
        .arg("--home")
        .arg(home)
        .output()
        .expect("run read_table.py");
    assert!(
        out.status.success(),
        "read_table.py {table}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["keys"].as_array().expect("keys").clone()
}

/// Per topic: the (partition, offset) of its records of each kind in `manifest`.
fn expected(manifest: &[Value]) -> BTreeMap<(String, String), BTreeSet<(i64, i64)>> {
    let mut out: BTreeMap<(String, String), BTreeSet<(i64, i64)>> = BTreeMap::new();
    for r in manifest {
        let key = (
            r["topic"].as_str().expect("topic").to_string(),
            r["kind"].as_str().expect("kind").to_string(),
        );
        let po = (
            r["partition"].as_i64().expect("partition"),
            r["offset"].as_i64().expect("offset"),
        );
        assert!(out.entry(key).or_default().insert(po), "{po:?} twice");
    }
    out
}

/// Asserts every committed good record of `topic` is in its table once, every bad one (and
/// tombstone) in dead_letters once, and no aborted one anywhere.
fn assert_exactly_once(home: &Path, topic: &str, manifest: &[Value], dead: &[Value]) {
    let want = expected(manifest);
    let of = |kind: &str| {
        want.get(&(topic.to_string(), kind.to_string()))
            .cloned()
            .unwrap_or_default()
    };
    let landed: Vec<(i64, i64)> = keys(home, topic)
        .iter()
        .map(|k| (k[0].as_i64().expect("p"), k[1].as_i64().expect("o")))
        .collect();
    let landed_set: BTreeSet<(i64, i64)> = landed.iter().copied().collect();
    assert_eq!(
        landed.len(),
        landed_set.len(),
        "{topic}: a record landed twice"
    );
    let mut good = of("good");
    for kind in want.keys().filter(|(t, _)| t == topic).map(|(_, k)| k) {
        if kind.starts_with("size") {
            good.extend(of(kind));
        }
    }
    let missing: Vec<_> = good.difference(&landed_set).take(10).collect();
    let extra: Vec<_> = landed_set.difference(&good).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{topic}: {} committed records, {} rows; missing {missing:?}, not produced as good \
         {extra:?}",
        good.len(),
        landed.len()
    );
    let dead: Vec<(i64, i64)> = dead
        .iter()
        .filter(|k| k[0].as_str() == Some(topic))
        .map(|k| (k[1].as_i64().expect("p"), k[2].as_i64().expect("o")))
        .collect();
    let dead_set: BTreeSet<(i64, i64)> = dead.iter().copied().collect();
    assert_eq!(dead.len(), dead_set.len(), "{topic}: a dead letter twice");
    let mut bad = of("bad");
    bad.extend(of("tombstone"));
    assert_eq!(dead_set, bad, "{topic}: dead letters");
    let aborted = of("aborted");
    assert!(
        aborted.is_disjoint(&landed_set) && aborted.is_disjoint(&dead_set),
        "{topic}: an aborted record landed"
    );
}

/// A small deterministic generator (the seed is printed, so a failure can be replayed).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// 100,000 records (1 in 100 bad) into 3 topics × 4 partitions by a real client, with lz4, zstd
/// and gzip batches, and a transactional producer that aborts every third transaction, while
/// `streamtable run` is killed with SIGKILL at random moments and restarted: every committed
mod landing;
mod positions;
mod readme;
