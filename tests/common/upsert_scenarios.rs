//! Upsert tables (`mode = "upsert"`): after every commit the table holds the last record of
//! each key — computed here from all input, by a model that knows nothing of the index or the
//! delete files — as pyiceberg and DuckDB read it (position deletes applied), through
//! re-deliveries, a commit re-run and compactions that apply the deletes.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use streamtable::commit::commit_pending;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::generate::SourceRecord;
use streamtable::spec::PipelineSpec;

use super::table_scenarios::check_table;
use super::{Harness, event};

const SPEC: &str = r#"
[[tables]]
name = "order_status"
topic = "order-status"
mode = "upsert"
primary_key = ["order_id"]
partition_by = ["day(updated_at)"]
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "status", type = "string" },
  { name = "amount", type = "decimal(12,2)" },
  { name = "updated_at", type = "timestamp", required = true },
]
"#;

const STATUSES: [&str; 4] = ["placed", "paid", "shipped", "cancelled"];

fn upsert_spec() -> PipelineSpec {
    PipelineSpec::parse(
        SPEC,
        Path::new("upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("upsert spec")
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The input so far and what the table must hold: per key, the last record's position.
#[derive(Default)]
struct Model {
    offsets: [i64; 2],
    last: BTreeMap<String, (i32, i64)>,
}

impl Model {
    /// `n` records of random keys among `keys`; a key always goes to the same partition (as a
    /// producer keying by the primary key sends it), its event time moving over three days.
    fn batch(&mut self, rng: &mut Rng, n: usize, keys: u64, round: i64) -> Vec<SourceRecord> {
        let base = 1_795_946_400_000i64; // 2026-11-29T08:00:00Z
        (0..n)
            .map(|_| {
                let k = rng.next(keys);
                let key = format!("o{k}");
                let partition = (k % 2) as i32;
                let offset = self.offsets[partition as usize];
                self.offsets[partition as usize] += 1;
                let at = base + round * 16 * 3600 * 1000 + offset * 1000;
                // One record in eight deletes its order: a tombstone, its key as text or as
                // a JSON object of the key's columns.
                if rng.next(8) == 0 {
                    self.last.remove(&key);
                    let key = if offset % 2 == 0 {
                        key.into_bytes()
                    } else {
                        serde_json::json!({ "order_id": key })
                            .to_string()
                            .into_bytes()
                    };
                    return SourceRecord {
                        topic: "order-status".into(),
                        partition,
                        offset,
                        timestamp_ms: at,
                        key: Some(key),
                        value: None,
                        raw_value_field: None,
                    };
                }
                let status = STATUSES[rng.next(4) as usize];
                let value = serde_json::json!({
                    "order_id": key,
                    "status": status,
                    "amount": format!("{}.{:02}", rng.next(500), rng.next(100)),
                    "updated_at": chrono::DateTime::from_timestamp_millis(at)
                        .expect("time")
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                });
                self.last.insert(key.clone(), (partition, offset));
                SourceRecord {
                    topic: "order-status".into(),
                    partition,
                    offset,
                    timestamp_ms: at,
                    key: Some(key.into_bytes()),
                    value: Some(value.to_string().into_bytes()),
                    raw_value_field: None,
                }
            })
            .collect()
    }

    fn expected(&self) -> Vec<Value> {
        let mut keys: Vec<(i32, i64)> = self.last.values().copied().collect();
        keys.sort();
        keys.into_iter()
            .map(|(p, o)| serde_json::json!([p, o]))
            .collect()
    }
}

/// A field of the current snapshot's summary, as pyiceberg reads it.
fn summary(v: &Value, key: &str) -> i64 {
    let last = v["snapshots"]
        .as_array()
        .and_then(|s| s.last())
        .expect("snapshots");
    last["summary"][key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1)
}

pub async fn upserts_read_back_as_the_last_record_per_key(h: &mut Harness) {
    h.spec = upsert_spec();
    let tables = h.tables();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut model = Model::default();
    let compact = CompactOptions {
        min_input_files: 2,
        ..CompactOptions::default()
    };
    let mut previous: Option<Vec<SourceRecord>> = None;
    let (mut bases, mut runs_of_changes, mut cold, mut keys_deleted) = (0, 0, 0, 0);
    for round in 0..10i64 {
        // Every other round starts as a cold process does: the key index read from its runs.
        if round % 2 == 1 {
            super::forget_warm_index(h, "order_status").await;
        }
        let batch = model.batch(&mut rng, 30, 40, round);
        h.ingestor().handle(&event(&batch)).await.expect("ingest");
        // The ESM delivers the batch before again (and this one twice): nothing lands twice.
        if let Some(before) = &previous {
            let mut again = before.clone();
            again.extend(batch.iter().cloned());
            h.ingestor()
                .handle(&event(&again))
                .await
                .expect("re-delivery");
        }
        previous = Some(batch);
        let report = commit_pending(&h.backend, &tables).await.expect("commit");
        // The round's own audit counts rows and tombstones (key deletes) alike.
        assert!(report.audit.ok(), "round {round}: {:?}", report.audit);
        assert!(report.audit.delivered > 0, "round {round}");
        let upsert = report
            .tables
            .iter()
            .find(|t| t.table == "order_status")
            .and_then(|t| t.upsert.clone())
            .expect("the upsert table's round");
        assert_eq!(
            upsert.keys as usize,
            model.last.len(),
            "keys after round {round}"
        );
        if round > 0 {
            assert!(upsert.rows_deleted > 0, "round {round} replaced rows");
        }
        assert_eq!(
            upsert.index_warm,
            round % 2 == 0 && round > 0,
            "round {round}"
        );
        if upsert.index_base {
            bases += 1;
        } else {
            runs_of_changes += 1;
        }
        cold += usize::from(!upsert.index_warm);
        keys_deleted += upsert.keys_deleted;
        // A commit run again finds nothing more to do, and changes nothing.
        let again = commit_pending(&h.backend, &tables)
            .await
            .expect("commit again");
        assert_eq!(again.batches, 0);
        if round == 3 {
            let done = compact_all(&h.backend, &tables, &compact)
                .await
                .expect("compact");
            assert!(
                !done.is_empty(),
                "compaction rewrote the partitions with deleted rows"
            );
            let v = check_table(h, "order_status", &model.expected());
            assert_eq!(
                summary(&v, "total-delete-files"),
                0,
                "compaction applied every delete file and dropped it"
            );
            assert_eq!(
                summary(&v, "total-records"),
                model.last.len() as i64,
                "after compaction the files hold only the live rows"
            );
        }
        check_table(h, "order_status", &model.expected());
    }
    assert!(
        bases >= 2 && runs_of_changes >= 2,
        "the key index was written as bases ({bases}) and as runs of changes ({runs_of_changes})"
    );
    assert!(cold >= 5, "rounds read their index from its runs: {cold}");
    assert!(keys_deleted > 0, "tombstones deleted keys");
    // Trino (Athena's engine) applies the position deletes as pyiceberg does (on moto).
    h.assert_trino_reads_as_pyiceberg("order_status", None);
    // The engine of `streamtable query` applies the deletes too.
    let n = super::count(h, "SELECT count(*) FROM order_status").await;
    assert_eq!(n as usize, model.last.len());
    let distinct = super::count(h, "SELECT count(DISTINCT order_id) FROM order_status").await;
    assert_eq!(distinct, n, "one row per key");
}

const DERIVED: &str = r#"
[[tables]]
name = "order_events"
topic = "order-events"
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "status", type = "string" },
  { name = "updated_at", type = "timestamp", required = true },
]

[[derived_tables]]
name = "orders_latest"
mode = "upsert"
primary_key = ["order_id"]
sql = """
SELECT order_id, upper(status) AS status, updated_at
FROM order_events
WHERE status <> 'ignored'
"""
"#;

/// A derived upsert table (`mode = "upsert"` on SQL over a topic's table): per key, the row of
/// the last record its WHERE kept, while the topic's own table keeps every record; through
/// re-deliveries and a compaction, read by pyiceberg and DuckDB after every commit.
pub async fn a_derived_upsert_table_holds_the_last_row_per_key(h: &mut Harness) {
    h.spec = PipelineSpec::parse(
        DERIVED,
        Path::new("derived-upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec");
    let tables = h.tables();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let statuses = ["placed", "paid", "ignored", "shipped"];
    // Per key: the partition and offset of the last record the WHERE kept.
    let mut last: BTreeMap<String, (i32, i64)> = BTreeMap::new();
    let mut next = [0i64; 2];
    let mut previous: Option<Vec<SourceRecord>> = None;
    let mut total = 0;
    for round in 0..4 {
        let mut batch = Vec::new();
        for _ in 0..16 {
            let k = rng.next(6);
            let p = (k % 2) as i32;
            let o = next[p as usize];
            next[p as usize] += 1;
            let status = statuses[rng.next(4) as usize];
            let id = format!("o{k}");
            if status != "ignored" {
                last.insert(id.clone(), (p, o));
            }
            batch.push(SourceRecord {
                topic: "order-events".into(),
                partition: p,
                offset: o,
                timestamp_ms: 1_795_946_400_000 + o,
                key: Some(id.clone().into_bytes()),
                value: Some(
                    serde_json::json!({"order_id": id, "status": status,
                                       "updated_at": 1_795_946_400_000i64 + o * 1000})
                    .to_string()
                    .into_bytes(),
                ),
                raw_value_field: None,
            });
        }
        total += batch.len();
        let mut delivery = previous.take().unwrap_or_default();
        delivery.extend(batch.iter().cloned());
        h.ingestor()
            .handle(&event(&delivery))
            .await
            .expect("ingest");
        previous = Some(batch);
        let report = commit_pending(&h.backend, &tables).await.expect("commit");
        let upsert = report
            .tables
            .iter()
            .find(|t| t.table == "orders_latest")
            .and_then(|t| t.upsert.clone())
            .expect("the derived upsert table's round");
        assert_eq!(upsert.keys as usize, last.len(), "keys after round {round}");
        if round == 2 {
            compact_all(
                &h.backend,
                &tables,
                &CompactOptions {
                    min_input_files: 2,
                    ..CompactOptions::default()
                },
            )
            .await
            .expect("compact");
        }
        let mut want: Vec<(i32, i64)> = last.values().copied().collect();
        want.sort();
        check_table(
            h,
            "orders_latest",
            &want
                .iter()
                .map(|p| serde_json::json!([p.0, p.1]))
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(
        super::count(h, "SELECT count(*) FROM order_events").await as usize,
        total,
        "the topic's table keeps every record once"
    );
    let rows = super::query_rows(
        h,
        "SELECT count(*), count(DISTINCT order_id), sum(CASE WHEN status = upper(status) THEN 1 ELSE 0 END) FROM orders_latest",
    )
    .await;
    let n = last.len().to_string();
    assert_eq!(
        rows,
        [[Some(n.clone()), Some(n.clone()), Some(n)]].map(|r| r.to_vec()),
        "one row per key, each the SELECT's"
    );

    // A key the older files lack (a new column of the SELECT) would read as one NULL key for
    // all their rows: the commit refuses it, saying what to do, and deletes nothing.
    h.spec = PipelineSpec::parse(
        &DERIVED
            .replace(
                "primary_key = [\"order_id\"]",
                "primary_key = [\"order_key\"]",
            )
            .replace(
                "updated_at\nFROM order_events",
                "updated_at, lower(order_id) AS order_key\nFROM order_events",
            ),
        Path::new("derived-upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec with a new key");
    let tables = h.tables();
    let mut more = previous.take().unwrap_or_default();
    for r in &mut more {
        r.offset += 100;
    }
    // As a deploy does: the ingest start evolves the table (order_key a new column).
    streamtable::ingest::Ingestor::connect(&h.spec, &h.backend)
        .await
        .expect("ingestor")
        .handle(&event(&more))
        .await
        .expect("ingest");
    let refused = match commit_pending(&h.backend, &tables).await {
        Ok(r) => format!("{:?}", r.blocked),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains(r#"primary_key changed from [\"order_id\"] to [\"order_key\"]"#),
        "refused: {refused}"
    );
    let rows = super::count(h, "SELECT count(*) FROM orders_latest").await;
    assert_eq!(rows as usize, last.len(), "no row deleted");
    // Acknowledged with rekey_from, the key is still one the older files lack: refused too.
    h.spec = PipelineSpec::parse(
        &DERIVED
            .replace(
                "primary_key = [\"order_id\"]",
                "primary_key = [\"order_key\"]\nrekey_from = [\"order_id\"]",
            )
            .replace(
                "updated_at\nFROM order_events",
                "updated_at, lower(order_id) AS order_key\nFROM order_events",
            ),
        Path::new("derived-upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec with a new key, re-keyed");
    let refused = match commit_pending(&h.backend, &h.tables()).await {
        Ok(r) => format!("{:?}", r.blocked),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains("lacks the primary_key columns"),
        "refused: {refused}"
    );
    let rows = super::count(h, "SELECT count(*) FROM orders_latest").await;
    assert_eq!(rows as usize, last.len(), "no row deleted");
}

/// A changed `primary_key` never re-keys the table silently: the commit refuses the table's
/// batches (deleting nothing) and `streamtable check` names the change, until the spec says
/// `rekey_from` — then the next commit keeps one row per new key, as said.
pub async fn a_changed_primary_key_is_refused_until_the_spec_rekeys(h: &mut Harness) {
    let by_order = SPEC.replace(
        "{ name = \"status\", type = \"string\" }",
        "{ name = \"status\", type = \"string\", required = true }",
    );
    h.spec = PipelineSpec::parse(
        &by_order,
        Path::new("upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec keyed by order");
    let mut model = Model::default();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let first = model.batch(&mut rng, 60, 12, 0);
    h.ingestor().handle(&event(&first)).await.expect("ingest");
    commit_pending(&h.backend, &h.tables())
        .await
        .expect("commit");
    let keyed = super::count(h, "SELECT count(*) FROM order_status").await;
    assert_eq!(keyed as usize, model.last.len(), "one row per order");
    let statuses = super::count(h, "SELECT count(DISTINCT status) FROM order_status").await;
    assert!(
        statuses < keyed,
        "more orders ({keyed}) than statuses ({statuses})"
    );

    // The key changed to the status, with nothing else said: refused.
    let by_status = by_order.replace("primary_key = [\"order_id\"]", "primary_key = [\"status\"]");
    h.spec = PipelineSpec::parse(
        &by_status,
        Path::new("upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec keyed by status");
    let (plan, refused) = streamtable::cli::check::catalog_plan(&h.backend, &h.tables())
        .await
        .expect("check");
    assert_eq!(refused, 1, "{plan}");
    assert!(
        plan.contains(r#"! primary_key — refused: table order_status's primary_key changed from ["order_id"] to ["status"]"#)
            && plan.contains(r#"add rekey_from = ["order_id"]"#),
        "{plan}"
    );
    let second = model.batch(&mut rng, 20, 12, 1);
    let second: Vec<SourceRecord> = second.into_iter().filter(|r| r.value.is_some()).collect();
    h.ingestor().handle(&event(&second)).await.expect("ingest");
    let report = commit_pending(&h.backend, &h.tables())
        .await
        .expect("commit");
    let blocked = format!("{:?}", report.blocked);
    assert!(
        blocked.contains("primary_key changed from"),
        "the table's batches are blocked, naming the change: {blocked}"
    );
    assert_eq!(
        super::count(h, "SELECT count(*) FROM order_status").await,
        keyed,
        "no row deleted, none added"
    );

    // rekey_from names the key before: the re-key is done, one row per status.
    let rekeyed = by_status.replace(
        "primary_key = [\"status\"]",
        "primary_key = [\"status\"]\nrekey_from = [\"order_id\"]",
    );
    h.spec = PipelineSpec::parse(
        &rekeyed,
        Path::new("upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec re-keyed");
    let (plan, refused) = streamtable::cli::check::catalog_plan(&h.backend, &h.tables())
        .await
        .expect("check");
    assert_eq!(refused, 0, "{plan}");
    assert!(
        plan.contains("~ primary_key [order_id] → [status]"),
        "{plan}"
    );
    let report = commit_pending(&h.backend, &h.tables())
        .await
        .expect("commit");
    assert!(report.blocked.is_empty(), "{:?}", report.blocked);
    let rows = super::count(h, "SELECT count(*) FROM order_status").await;
    let distinct = super::count(h, "SELECT count(DISTINCT status) FROM order_status").await;
    assert_eq!(rows, distinct, "one row per status");
    let (plan, refused) = streamtable::cli::check::catalog_plan(&h.backend, &h.tables())
        .await
        .expect("check");
    assert_eq!(refused, 0, "{plan}");
    assert!(plan.contains("rekey_from is spent"), "{plan}");
}

/// `streamtable audit` of an upsert table: every record its partitions were delivered is a row
/// (deleted ones too), a tombstone, a row compaction dropped (both counted in the table's
/// metadata) or a dead letter — so it passes an honest history through superseded keys,
/// tombstones, re-deliveries and compaction, and fails where a batch was lost before its
/// commit, skipped by the event source, or rows were lost from a data file.
pub async fn the_audit_counts_every_record_of_an_upsert_table(h: &mut Harness) {
    use streamtable::audit::{AuditOptions, GivenUp, audit_with};
    h.spec = upsert_spec();
    let tables = h.tables();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut model = Model::default();
    let compact = CompactOptions {
        min_input_files: 2,
        ..CompactOptions::default()
    };
    let audit = |h: &Harness, given_up: Option<GivenUp>| {
        let backend = h.backend.clone();
        let spec = h.spec.clone();
        async move {
            audit_with(
                &backend,
                &spec,
                &AuditOptions {
                    given_up: given_up.as_ref(),
                    ..Default::default()
                },
            )
            .await
            .expect("audit")
        }
    };
    for round in 0..4i64 {
        let batch = model.batch(&mut rng, 40, 12, round);
        h.ingestor().handle(&event(&batch)).await.expect("ingest");
        h.ingestor()
            .handle(&event(&batch))
            .await
            .expect("re-delivery");
        commit_pending(&h.backend, &tables).await.expect("commit");
        if round == 2 {
            compact_all(&h.backend, &tables, &compact)
                .await
                .expect("compact");
        }
    }
    let a = audit(h, None).await;
    assert!(a.ok(), "{}", streamtable::cli::audit::render(&a));
    let t = &a.tables[0];
    assert_eq!(t.table, "order_status");
    assert!(t.skipped.is_none(), "{:?}", t.skipped);
    let (tombstones, dropped): (i64, i64) = t
        .partitions
        .iter()
        .filter_map(|p| p.upsert.as_ref())
        .fold((0, 0), |(a, b), u| (a + u.tombstones, b + u.dropped));
    assert!(
        tombstones > 0 && dropped > 0,
        "tombstones {tombstones}, dropped {dropped}: {}",
        streamtable::cli::audit::render(&a)
    );

    // The event source gives up on a batch (written to its on-failure destination) and goes
    // on: missing until replayed; nothing says so, and the offsets are Kafka's gaps.
    let skipped = model.batch(&mut rng, 20, 12, 4);
    let after = model.batch(&mut rng, 20, 12, 5);
    h.ingestor().handle(&event(&after)).await.expect("ingest");
    commit_pending(&h.backend, &tables).await.expect("commit");
    let mut given_up = GivenUp::default();
    given_up.add(&event(&skipped)).expect("a failed batch");
    let a = audit(h, Some(given_up.clone())).await;
    assert!(!a.ok());
    let skipped_offsets: i64 = a.tables[0]
        .partitions
        .iter()
        .map(|p| p.skipped_offsets)
        .sum();
    assert_eq!(
        skipped_offsets,
        20,
        "{}",
        streamtable::cli::audit::render(&a)
    );
    assert!(
        audit(h, None).await.ok(),
        "without the record: Kafka's gaps"
    );
    streamtable::replay::replay(&h.ingestor(), &h.backend, &h.spec, &event(&skipped))
        .await
        .expect("replay");
    commit_pending(&h.backend, &tables).await.expect("commit");
    let a = audit(h, Some(given_up)).await;
    assert!(a.ok(), "{}", streamtable::cli::audit::render(&a));

    // A pending batch lost before its commit: covered by no entry, named.
    let lost = model.batch(&mut rng, 20, 12, 6);
    h.ingestor().handle(&event(&lost)).await.expect("ingest");
    let pending = h.backend.state.pending().await.expect("pending");
    let intent = streamtable::store::CommitIntent {
        id: "lost".into(),
        created_at_ms: 1,
        batches: pending.iter().map(|b| b.key()).collect(),
    };
    assert!(h.backend.state.begin_commit(&intent).await.expect("begin"));
    h.backend
        .state
        .finish_commit(&intent)
        .await
        .expect("finish");
    let later = model.batch(&mut rng, 20, 12, 7);
    h.ingestor().handle(&event(&later)).await.expect("ingest");
    commit_pending(&h.backend, &tables).await.expect("commit");
    let a = audit(h, None).await;
    assert!(!a.ok());
    let missing: i64 = a.tables[0]
        .partitions
        .iter()
        .map(|p| p.missing.iter().map(|[x, y]| y - x + 1).sum::<i64>())
        .sum();
    assert_eq!(missing, 20, "{}", streamtable::cli::audit::render(&a));

    // Rows lost from the table (a data file dropped by a faulty rewrite): counted unaccounted.
    // Compaction first applies every delete (counting the rows it drops), so that a file can
    // be removed alone.
    compact_all(&h.backend, &tables, &compact)
        .await
        .expect("compact");
    let before = audit(h, None).await;
    let unaccounted_before: i64 = before.tables[0]
        .partitions
        .iter()
        .filter_map(|p| p.upsert.as_ref())
        .map(|u| u.unaccounted())
        .sum();
    assert_eq!(
        unaccounted_before,
        0,
        "{}",
        streamtable::cli::audit::render(&before)
    );
    let (table, _) = h
        .backend
        .catalog
        .load(&tables.ident("order_status"))
        .await
        .expect("load")
        .expect("table");
    let files = streamtable::table::files::load_current(&table)
        .await
        .expect("files");
    // A file no position delete names (the replace would be stale otherwise).
    let mut rows = 0;
    for victim in files.live() {
        let removed = std::collections::HashSet::from([victim.entry.file_path().to_string()]);
        let outcome = streamtable::table::replace::commit_replace(
            &h.backend.catalog,
            &tables.ident("order_status"),
            &removed,
            &[],
            &Default::default(),
        )
        .await
        .expect("drop a file");
        if matches!(
            outcome,
            streamtable::table::replace::ReplaceOutcome::Committed(_)
        ) {
            rows = victim.entry.record_count() as i64;
            break;
        }
    }
    assert!(rows > 0, "a file was dropped");
    let a = audit(h, None).await;
    let unaccounted: i64 = a.tables[0]
        .partitions
        .iter()
        .filter_map(|p| p.upsert.as_ref())
        .map(|u| u.unaccounted())
        .sum();
    assert_eq!(unaccounted, rows, "{}", streamtable::cli::audit::render(&a));
    // --since audits an upsert table whole (its counts are of whole partitions): the loss is
    // seen all the same.
    let since = audit_with(
        &h.backend,
        &h.spec,
        &AuditOptions {
            since_ms: Some(1_795_946_400_000 + 3_600_000),
            ..Default::default()
        },
    )
    .await
    .expect("audit since");
    assert!(!since.ok(), "{}", streamtable::cli::audit::render(&since));
    assert!(!since.tables[0].notes.is_empty());
}

/// A data file too large to rewrite for a few deleted rows (here: every file, with
/// `rewrite_with_deletes_below` 0) keeps its position deletes through compaction — readers
/// apply them — until 30% of its rows are deleted, or its partition has 16 delete files; then
/// compaction rewrites it without them and drops the delete files that named only it.
pub async fn a_large_file_keeps_its_deletes_until_enough_of_its_rows_are_gone(h: &mut Harness) {
    h.spec = upsert_spec();
    let tables = h.tables();
    let base = 1_795_946_400_000i64; // 2026-11-29T08:00:00Z: one day, one partition
    let mut offsets = [0i64; 2];
    let mut batch = |keys: std::ops::Range<u64>, status: &str| -> Vec<SourceRecord> {
        keys.map(|k| {
            let partition = (k % 2) as i32;
            let offset = offsets[partition as usize];
            offsets[partition as usize] += 1;
            let value = serde_json::json!({
                "order_id": format!("o{k}"),
                "status": status,
                "amount": "1.00",
                "updated_at": streamtable::clock::rfc3339_ms(base + offset),
            });
            SourceRecord {
                topic: "order-status".into(),
                partition,
                offset,
                timestamp_ms: base + offset,
                key: Some(format!("o{k}").into_bytes()),
                value: Some(value.to_string().into_bytes()),
                raw_value_field: None,
            }
        })
        .collect()
    };
    let compact = CompactOptions {
        min_input_files: 100,
        rewrite_with_deletes_below: 0,
        ..CompactOptions::default()
    };
    let land = |records: Vec<SourceRecord>| {
        let (h, tables) = (&*h, &tables);
        async move {
            h.ingestor().handle(&event(&records)).await.expect("ingest");
            commit_pending(&h.backend, tables).await.expect("commit");
        }
    };
    land(batch(0..100, "placed")).await;
    // 10 of the first file's 100 rows superseded: it keeps its deletes.
    land(batch(0..10, "paid")).await;
    let done = compact_all(&h.backend, &tables, &compact)
        .await
        .expect("compact");
    assert!(done.is_empty(), "nothing worth rewriting yet: {done:?}");
    let v = h.read_external("pyiceberg", "order_status");
    assert_eq!(summary(&v, "total-delete-files"), 1, "the deletes stay");
    assert_eq!(v["count"], 100, "pyiceberg applies them");
    assert_eq!(
        super::count(h, "SELECT COUNT(*) FROM order_status").await,
        100
    );
    assert_eq!(
        super::count(h, "SELECT COUNT(*) FROM order_status WHERE status = 'paid'").await,
        10
    );
    // 30 more: 40% of the first file's rows are gone, and compaction rewrites it.
    land(batch(10..40, "shipped")).await;
    let done = compact_all(&h.backend, &tables, &compact)
        .await
        .expect("compact");
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].input_files, 1, "the first file alone: {done:?}");
    assert_eq!(done[0].rows, 60, "its 60 live rows: {done:?}");
    let v = h.read_external("pyiceberg", "order_status");
    assert_eq!(
        summary(&v, "total-delete-files"),
        0,
        "both delete files named only the first file"
    );
    assert_eq!(v["count"], 100);
    assert_eq!(
        super::count(h, "SELECT COUNT(*) FROM order_status").await,
        100
    );
    assert_eq!(
        super::count(
            h,
            "SELECT COUNT(*) FROM order_status WHERE status = 'shipped'"
        )
        .await,
        30
    );
    // Rounds that each supersede a row of one of the three files (the first's rewrite, the
    // 10 paid, the 30 shipped), none of them reaching 30% or 16 delete files of its own: the
    // partition's 16th delete file has its files rewritten.
    let keys = |j: u64| match j {
        0..2 => j,
        2..8 => 10 + j,
        _ => 40 + j,
    };
    for j in 0..16u64 {
        if j == 15 {
            let done = compact_all(&h.backend, &tables, &compact)
                .await
                .expect("compact");
            assert!(done.is_empty(), "15 delete files wait: {done:?}");
        }
        land(batch(keys(j)..keys(j) + 1, "cancelled")).await;
    }
    let done = compact_all(&h.backend, &tables, &compact)
        .await
        .expect("compact");
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(
        done[0].input_files, 3,
        "the three files with deleted rows: {done:?}"
    );
    let v = h.read_external("pyiceberg", "order_status");
    assert_eq!(summary(&v, "total-delete-files"), 0);
    assert_eq!(v["count"], 100);
    assert_eq!(
        super::count(
            h,
            "SELECT COUNT(*) FROM order_status WHERE status = 'cancelled'"
        )
        .await,
        16
    );
}
