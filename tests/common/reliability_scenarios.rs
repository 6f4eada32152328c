//! Reliability scenarios: inputs and faults that once stalled a partition or damaged a table.
//! Each is run on every backend and checked through the outside readers.

use serde_json::{Value, json};
use streamtable::commit::commit_pending;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::scheduled;

use super::faults::FaultyPointers;
use super::table_scenarios::{check_table, operations, opts, sched};
use super::{Harness, event, records};

fn order(created_at: &str) -> Vec<u8> {
    format!(r#"{{"order_id":"o","amount":"1.00","created_at":{created_at}}}"#).into_bytes()
}

/// A value no reader can hold (a timestamp in the year 265,000 that once made ingest panic while
/// naming the partition; years 200,000 and 0; a Kafka timestamp out of range) is a dead letter
/// with a reason naming the range; a good order with a binary key lands with its key's bytes;
/// the tables stay readable by pyiceberg and DuckDB.
pub async fn values_readers_cannot_hold_are_dead_letters(h: &Harness) {
    let mut recs = records("orders", 0, 0..8);
    recs[1].value = Some(order("8300000000000000"));
    recs[2].value = Some(order("-8300000000000000"));
    recs[3].value = Some(order("6249000000000000"));
    recs[4].value = Some(order(r#""0000-06-01T00:00:00Z""#));
    recs[5].timestamp_ms = i64::MAX / 1000;
    recs[6].key = Some(vec![0x00, 0xff, 0xfe, 0x01]);
    let s = h
        .ingestor()
        .handle(&event(&recs))
        .await
        .expect("a batch with unrepresentable values lands");
    assert_eq!((s.accepted, s.dead_lettered), (3, 5));
    let dead = h.dead_letters().await;
    assert_eq!(
        dead.iter().map(|d| d.offset).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    for d in &dead {
        assert_eq!(d.kind, "out_of_range", "offset {}: {}", d.offset, d.message);
        assert!(
            d.message.contains("years 0001 to 9999"),
            "offset {}: {}",
            d.offset,
            d.message
        );
    }
    assert!(
        dead[4].message.contains("Kafka timestamp"),
        "{}",
        dead[4].message
    );

    scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("scheduled run");
    check_table(h, "orders", &[json!([0, 0]), json!([0, 6]), json!([0, 7])]);
    let dead_keys: Vec<Value> = (1..=5).map(|o| json!(["orders", 0, o])).collect();
    check_table(h, "dead_letters", &dead_keys);

    // The key is kept losslessly: UTF-8 in kafka_key, other bytes in kafka_key_bytes.
    let rows = h.pyiceberg_rows("orders", None);
    let cols = h.read_external("pyiceberg", "orders")["columns"].clone();
    let col = |name: &str| {
        cols.as_array()
            .expect("columns")
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("column {name}"))
    };
    let (offset, key, key_bytes) = (
        col("kafka_offset"),
        col("kafka_key"),
        col("kafka_key_bytes"),
    );
    let binary = rows.iter().find(|r| r[offset] == "6").expect("offset 6");
    assert_eq!(
        (binary[key].as_str(), binary[key_bytes].as_str()),
        ("NULL", "00fffe01")
    );
    let text = rows.iter().find(|r| r[offset] == "7").expect("offset 7");
    assert_eq!(
        (text[key].as_str(), text[key_bytes].as_str()),
        ("key-7", "NULL")
    );
}

/// How a scenario makes the next catalog swap (or creation) succeed with its answer lost.
pub enum LoseAnswers {
    /// Through a pointer-store wrapper: the swap is applied, then an error is returned.
    Wrapper,
    /// Through the moto server: Glue applies the request and answers HTTP 500, the SDK sends it
    /// again and Glue refuses the repeat (`ConcurrentModificationException` for `UpdateTable`,
    /// `AlreadyExistsException` for `CreateTable`), exactly as on AWS after a lost answer.
    Glue,
}

impl LoseAnswers {
    /// A backend whose next swap loses its answer.
    fn next_swap(&self, h: &Harness) -> streamtable::backend::Backend {
        match self {
            LoseAnswers::Wrapper => {
                FaultyPointers::new(h.backend.catalog.pointers().clone(), vec![], vec![0])
                    .backend(&h.backend)
            }
            LoseAnswers::Glue => {
                arm_glue(&h.backend.namespace, "UpdateTable", 1);
                h.backend.clone()
            }
        }
    }
}

/// Arms the moto server to apply the next `count` Glue `action`s on `database` and lose their
/// answers (see tests/py/moto_server.py).
pub fn arm_glue(database: &str, action: &str, count: u32) {
    use std::io::{Read, Write};
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL");
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(host).expect("connect to moto");
    let request = format!(
        "POST /_streamtable/lose-answer?action={action}&database={database}&count={count} HTTP/1.0\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).expect("arm fault");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("moto answers");
    assert!(
        answer.contains("armed"),
        "moto did not arm the fault: {answer}"
    );
}

/// A commit and a compaction whose catalog swap happened but whose answer was lost: both are
/// recognised as committed (once), nothing they wrote is deleted, and the table reads every row
/// exactly once. (Glue's refusal of the SDK's repeat was once taken as a lost race, and the
/// metadata the table pointed at was deleted.)
pub async fn lost_swap_answers_are_recognised_as_commits(h: &Harness, lose: LoseAnswers) {
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    for i in 0..6 {
        let ev = event(&records("orders", 0, i * 40..(i + 1) * 40));
        h.ingestor().handle(&ev).await.expect("ingest");
    }
    let report = commit_pending(&lose.next_swap(h), &tables)
        .await
        .expect("a commit whose answer was lost is still a commit");
    assert_eq!(report.rows(), 240);
    let expected = super::table_scenarios::json_keys(0, 0..240);
    let py = check_table(h, "orders", &expected);
    assert_eq!(operations(&py), ["append"], "appended exactly once");
    assert!(h.backend.state.pending().await.expect("pending").is_empty());

    let eager = CompactOptions {
        min_input_files: 5,
        ..opts()
    };
    let mut compacted = Vec::new();
    for i in 0..6 {
        // Six small files in one partition.
        let ev = event(&records("orders", 0, 240 + i * 10..240 + (i + 1) * 10));
        h.ingestor().handle(&ev).await.expect("ingest");
        commit_pending(&h.backend, &tables).await.expect("commit");
    }
    compacted.extend(
        compact_all(&lose.next_swap(h), &tables, &eager)
            .await
            .expect("a compaction whose answer was lost is still a compaction"),
    );
    let orders: Vec<_> = compacted.iter().filter(|c| c.table == "orders").collect();
    assert_eq!(orders.len(), 1, "{compacted:?}");
    assert!(orders[0].snapshot_id.is_some(), "{compacted:?}");
    let expected = super::table_scenarios::json_keys(0, 0..300);
    let py = check_table(h, "orders", &expected);
    assert_eq!(operations(&py).last().map(String::as_str), Some("replace"));
    assert_eq!(
        operations(&py).iter().filter(|o| *o == "replace").count(),
        1,
        "replaced exactly once"
    );
}

/// Glue `CreateTable` applied with its answer lost: the SDK's repeat is refused as "already
/// exists", and the metadata the new table points at must not be deleted.
pub async fn lost_create_answers_keep_the_new_table(h: &Harness) {
    arm_glue(&h.backend.namespace, "CreateTable", 4);
    h.tables()
        .ensure_all(&h.backend)
        .await
        .expect("tables created");
    for t in ["orders", "payments", "readings", "dead_letters"] {
        let py = h.read_external("pyiceberg", t);
        assert_eq!(py["count"], 0, "{t} is readable and empty");
    }
}

/// Under a steady stream of new batches the scheduled run still ends on time, and compaction
/// and maintenance run. (The commit step once looped for as long as batches kept arriving.)
pub async fn a_scheduled_run_ends_under_steady_ingest(h: &Harness) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    let tables = h.tables();
    let stop = Arc::new(AtomicBool::new(false));
    let landed = Arc::new(AtomicI64::new(0));
    let writer = {
        let (stop, landed, ingestor) = (stop.clone(), landed.clone(), h.ingestor());
        tokio::spawn(async move {
            let mut next = 0i64;
            while !stop.load(Ordering::SeqCst) {
                ingestor
                    .handle(&event(&records(
                        "orders",
                        (next % 4) as i32,
                        next..next + 5,
                    )))
                    .await
                    .expect("ingest");
                next += 5;
                landed.store(next, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    while landed.load(Ordering::SeqCst) < 50 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let before = landed.load(Ordering::SeqCst);
    let run = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        scheduled::run_until(&h.backend, &tables, &sched(), deadline),
    )
    .await
    .expect("the run ends while batches keep arriving")
    .expect("scheduled run");
    let during = landed.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    writer.await.expect("writer");
    assert!(run.commit.rounds >= 1, "{:?}", run.commit);
    // Batches kept arriving while the run committed (whether any was left at its end depends on
    // which of the two was faster on a loaded machine; a backlog left says how old it is).
    assert!(during > before, "batches kept arriving during the run");
    if run.commit.backlog.batches > 0 || run.commit.backlog.more {
        assert!(
            run.commit.backlog.oldest_age_ms.is_some(),
            "{:?}",
            run.commit
        );
    }
    assert!(
        !run.compaction.is_empty(),
        "the run went on to compaction: {run:?}"
    );
    assert!(run.failures.is_empty(), "{:?}", run.failures);

    // Everything lands exactly once in the runs that follow.
    let mut left = 1;
    let mut maintained = false;
    for _ in 0..20 {
        let r = scheduled::run(&h.backend, &tables, &sched())
            .await
            .expect("run");
        left = r.commit.backlog.batches + u64::from(r.commit.backlog.more);
        maintained |= !r.maintenance.is_empty();
        if left == 0 && maintained && h.backend.state.pending().await.expect("pending").is_empty() {
            break;
        }
    }
    assert_eq!(left, 0);
    assert!(maintained, "maintenance ran");
    let total = landed.load(Ordering::SeqCst);
    let mut expected: Vec<Value> = (0..total)
        .map(|o| json!([((o / 5) % 4) as i32, o]))
        .collect();
    expected.sort_by_key(|v| (v[0].as_i64(), v[1].as_i64()));
    check_table(h, "orders", &expected);
}

/// A partition larger than the run's rewrite budget (a backfill) is compacted in parts, and
/// never stops the other tables from compacting. (A job over the budget once ended the run.)
pub async fn a_partition_over_the_budget_does_not_stop_compaction(h: &Harness) {
    let tables = h.tables();
    for i in 0..12 {
        let ev = event(&records("orders", 0, i * 50..(i + 1) * 50));
        h.ingestor().handle(&ev).await.expect("ingest orders");
    }
    for i in 0..6 {
        let ev = event(&records("payments", 0, i * 5..(i + 1) * 5));
        h.ingestor().handle(&ev).await.expect("ingest payments");
    }
    commit_pending(&h.backend, &tables).await.expect("commit");
    let live = |t: &'static str| async move {
        let (table, _) = h
            .backend
            .catalog
            .load(&tables_ident(h, t))
            .await
            .expect("load")
            .expect("table");
        let files = streamtable::table::files::load_current(&table)
            .await
            .expect("files");
        files
            .live()
            .map(|e| e.entry.file_size_in_bytes())
            .collect::<Vec<u64>>()
    };
    let orders_sizes = live("orders").await;
    let payments_sizes = live("payments").await;
    assert_eq!((orders_sizes.len(), payments_sizes.len()), (12, 6));
    let biggest_orders = *orders_sizes.iter().max().expect("sizes");
    // Room for the payments and for six of the twelve orders files.
    let budget = payments_sizes.iter().sum::<u64>() + 6 * biggest_orders + 1;
    let options = CompactOptions {
        max_rewrite_bytes_per_run: budget,
        ..opts()
    };
    let done = compact_all(&h.backend, &tables, &options)
        .await
        .expect("compaction");
    let payments = done
        .iter()
        .find(|c| c.table == "payments")
        .expect("payments compacted");
    assert_eq!(payments.input_files, 6);
    let orders = done
        .iter()
        .find(|c| c.table == "orders")
        .expect("orders compacted in part");
    assert!(
        (5..12).contains(&orders.input_files),
        "part of the big partition: {orders:?}"
    );
    assert!(
        done.iter().map(|c| c.input_bytes).sum::<u64>() <= budget,
        "{done:?}"
    );
    check_table(h, "orders", &super::table_scenarios::json_keys(0, 0..600));
    check_table(h, "payments", &super::table_scenarios::json_keys(0, 0..30));
}

fn tables_ident(h: &Harness, table: &str) -> iceberg::TableIdent {
    h.tables().ident(table)
}

/// A topic deleted and created again restarts its offsets: a delivery below the checkpoint
/// stamped after the latest record the partition took is another log, not a re-delivery. It
/// used to be taken as already seen (its records lost); it is refused, naming the recreation and
/// the recovery, with nothing landed, while a true re-delivery is still taken as seen; after
/// `reset_partition` (and the ledger set aside), the new log lands whole.
pub async fn a_recreated_topic_is_refused_until_the_partition_is_reset(h: &Harness) {
    // Checkpoints in buckets, as on a new deployment (on DynamoDB: the stamps in a map).
    h.backend
        .state
        .upgrade(streamtable::clock::now_ms())
        .await
        .expect("layout");
    let source = streamtable::checkpoint::SourcePartition::new("orders", 0);
    let old = records("orders", 0, 0..30);
    let s = h
        .ingestor()
        .handle(&event(&old))
        .await
        .expect("the old log");
    assert_eq!(s.accepted, 30);
    commit_pending(&h.backend, &h.tables())
        .await
        .expect("commit");
    // A re-delivery of records taken: seen, nothing else.
    let s = h
        .ingestor()
        .handle(&event(&old[..10]))
        .await
        .expect("a re-delivery");
    assert_eq!((s.already_seen, s.accepted), (10, 0));
    // The new log: the same offsets, stamped an hour after the old log's last record.
    let mut new = records("orders", 0, 0..40);
    for r in &mut new {
        r.timestamp_ms += 3_600_000;
    }
    let err = h
        .ingestor()
        .handle(&event(&new[..10]))
        .await
        .expect_err("the new log is refused");
    let said = err.to_string();
    assert!(
        matches!(err, streamtable::error::Error::Recreated { .. })
            && said.contains("orders-0: offsets 0..=9 (10 records) are below the checkpoint 30")
            && said.contains("streamtable reset-partition orders 0 --recreated"),
        "{said}"
    );
    assert_eq!(h.next_offset("orders", 0).await, 30, "nothing of it landed");
    assert!(
        h.backend.state.pending().await.expect("pending").is_empty(),
        "no batch recorded"
    );
    assert!(said.contains("--recreated --from 30"), "{said}");
    // A batch of the old log still pending: the reset waits for its commit (its pending key
    // would be the new log's).
    h.ingestor()
        .handle(&event(&records("orders", 0, 30..33)))
        .await
        .expect("the old log's last batch");
    let e = h
        .ingestor()
        .reset_partition(&source, 33, 0)
        .await
        .expect_err("a batch is pending");
    assert!(e.to_string().contains("not committed yet"), "{e}");
    commit_pending(&h.backend, &h.tables())
        .await
        .expect("commit");
    // Reset to the new log: the checkpoint goes to its start, the ledger is set aside.
    let reset = h
        .ingestor()
        .reset_partition(&source, 33, 0)
        .await
        .expect("reset");
    assert_eq!((reset.from, reset.to), (33, 0));
    // Run again (a retried runbook step), it changes nothing.
    let e = h
        .ingestor()
        .reset_partition(&source, 33, 0)
        .await
        .expect_err("already reset");
    assert!(
        e.to_string().contains("its checkpoint is at 0, not 33"),
        "{e}"
    );
    let ident = h.tables().ident("orders");
    assert!(
        streamtable::commit::ledger::set_aside(
            &h.backend,
            &ident,
            &source,
            1,
            Some((reset.from, reset.old_newest_ms))
        )
        .await
        .expect("set aside"),
        "the partition had a ledger"
    );
    let s = h
        .ingestor()
        .handle(&event(&new))
        .await
        .expect("the new log");
    assert_eq!(s.accepted, 40);
    commit_pending(&h.backend, &h.tables())
        .await
        .expect("commit");
    assert_eq!(
        super::count(h, "SELECT count(*) FROM orders").await,
        73,
        "the old log's 33 and the new log's 40"
    );
    assert_eq!(h.next_offset("orders", 0).await, 40);
    // The audit takes the partition from the new log on: the old log's rows, at the same
    // offsets, are neither duplicates nor beyond the checkpoint.
    let a = streamtable::audit::audit(&h.backend, &h.spec, Some("orders"))
        .await
        .expect("audit");
    assert!(a.ok(), "{}", streamtable::cli::audit::render(&a));
}

/// An interval join's SQL whose calls a record's values make explode (`repeat` by a number
/// read from the payment): its round fails and is deferred (its log names the call), while the
/// topics' own tables and the scheduled stage go on (it used to abort the process, every
/// round, for good).
pub async fn an_interval_join_whose_sql_explodes_fails_its_round_not_the_stage(h: &mut Harness) {
    use streamtable::generate::SourceRecord;
    const SPEC: &str = r#"
[[tables]]
name = "a"
topic = "a"
watermark = "ts - INTERVAL '1' SECOND"
columns = [
  { name = "id", type = "string", required = true },
  { name = "s", type = "string" },
  { name = "ts", type = "timestamp", required = true },
]

[[tables]]
name = "b"
topic = "b"
watermark = "ts - INTERVAL '1' SECOND"
columns = [
  { name = "id", type = "string", required = true },
  { name = "n", type = "long" },
  { name = "ts", type = "timestamp", required = true },
]

[[derived_tables]]
name = "ab"
sql = """
SELECT x.id, length(repeat(x.s, y.n)) AS l, x.ts
FROM a x JOIN b y ON x.id = y.id AND y.ts BETWEEN x.ts AND x.ts + INTERVAL '1' HOUR
"""
"#;
    h.spec = streamtable::spec::PipelineSpec::parse(
        SPEC,
        std::path::Path::new("join.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec");
    let record = |topic: &str, offset: i64, value: Value| SourceRecord {
        topic: topic.into(),
        partition: 0,
        offset,
        timestamp_ms: 1_795_946_400_000 + offset,
        key: None,
        value: Some(value.to_string().into_bytes()),
        raw_value_field: None,
    };
    let a: Vec<SourceRecord> = (0..4)
        .map(|o| {
            record(
                "a",
                o,
                json!({"id": format!("k{o}"), "s": "hello", "ts": 1_795_946_400_000i64 + o}),
            )
        })
        .collect();
    let b: Vec<SourceRecord> = (0..4)
        .map(|o| {
            record(
                "b",
                o,
                json!({"id": format!("k{o}"), "n": 400_000_000, "ts": 1_795_946_400_000i64 + o + 5}),
            )
        })
        .collect();
    h.ingestor().handle(&event(&a)).await.expect("ingest a");
    h.ingestor().handle(&event(&b)).await.expect("ingest b");
    // The join's round fails (its log names the call) and is deferred, its rows kept in the
    // join's backlog to be tried again; the process goes on.
    let report = scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("the scheduled stage runs");
    let join = report
        .commit
        .tables
        .iter()
        .find(|t| t.table == "ab")
        .and_then(|t| t.join.clone())
        .expect("the join's round");
    assert!(join.deferred, "{report:?}");
    assert_eq!(super::count(h, "SELECT count(*) FROM a").await, 4);
    assert_eq!(super::count(h, "SELECT count(*) FROM b").await, 4);
}

/// A replayed batch that starts past its partition's checkpoint would move the checkpoint past
/// offsets not landed yet (which the event source would then deliver as already seen): refused,
/// naming the gap, unless the replay says the gap is Kafka's own (`after_gap`).
pub async fn a_replay_ahead_of_the_checkpoint_is_refused_naming_the_gap(h: &Harness) {
    h.ingestor()
        .handle(&event(&records("orders", 0, 0..10)))
        .await
        .expect("ingest");
    let ahead = event(&records("orders", 0, 12..16));
    let e = streamtable::replay::replay(&h.ingestor(), &h.backend, &h.spec, &ahead)
        .await
        .expect_err("ahead of the checkpoint");
    assert!(
        e.to_string()
            .contains("the batch starts at offset 12, past the partition's checkpoint 10: offsets 10..=11 have not landed yet"),
        "{e}"
    );
    assert_eq!(h.next_offset("orders", 0).await, 10, "nothing landed");
    let done = streamtable::replay::replay_with(
        &h.ingestor(),
        &h.backend,
        &h.spec,
        &ahead,
        &streamtable::replay::ReplayOptions { after_gap: true },
    )
    .await
    .expect("a gap that is Kafka's own");
    assert_eq!(done[0].accepted, 4);
    assert_eq!(h.next_offset("orders", 0).await, 16);
}
