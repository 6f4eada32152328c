//! Reliability scenarios about where and how data is laid out: partition values in paths,
//! batches the event source mapping gave up on, row groups bounded by bytes, commit intents
//! bounded in size. Each is run on every backend and checked through the outside readers.

use serde_json::{Value, json};
use streamtable::commit::commit_pending;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::scheduled;
use streamtable::spec::PipelineSpec;

use super::table_scenarios::{check_table, opts, sched};
use super::{Harness, event, records};

/// String partition values cannot escape the table's directory (`../`), very long ones make
/// valid keys, and compaction never mixes partitions whose paths look alike (null and "null").
pub async fn partition_values_are_escaped_and_grouped_by_value(h: &mut Harness) {
    let spec = r#"
[[tables]]
name = "events"
topic = "events"
partition_by = ["kind"]
columns = [
  { name = "id", type = "long", required = true },
  { name = "kind", type = "string" },
]
"#;
    h.spec = PipelineSpec::parse(
        spec,
        std::path::Path::new("events.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec");
    let tables = h.tables();
    let long = "x".repeat(3000);
    let kinds: [Option<&str>; 5] = [
        Some("../../escape"),
        None,
        Some("null"),
        Some(&long),
        Some("a/b c"),
    ];
    let mut offset = 0i64;
    for round in 0..3 {
        let mut recs = Vec::new();
        for kind in kinds {
            let mut r = records("orders", 0, [offset]).remove(0);
            r.topic = "events".into();
            let kind = kind.map_or("null".to_string(), |k| format!("{k:?}"));
            r.value = Some(format!(r#"{{"id":{offset},"kind":{kind}}}"#).into_bytes());
            recs.push(r);
            offset += 1;
        }
        h.ingestor().handle(&event(&recs)).await.expect("ingest");
        commit_pending(&h.backend, &tables)
            .await
            .unwrap_or_else(|e| panic!("commit {round}: {e}"));
    }
    let eager = CompactOptions {
        min_input_files: 2,
        ..opts()
    };
    compact_all(&h.backend, &tables, &eager)
        .await
        .expect("compaction");

    // A topic no table is fed from, with a path in its name: its dead letter stays inside.
    let mut stray = records("orders", 0, [0]).remove(0);
    stray.topic = "../../../escaped".into();
    h.ingestor()
        .handle(&event(&[stray]))
        .await
        .expect("stray topic");

    let root = h.backend.warehouse.root().to_string();
    for o in h
        .backend
        .warehouse
        .list(&format!("{root}/"))
        .await
        .expect("list")
    {
        let rest = o
            .location
            .strip_prefix(&root)
            .expect("inside the warehouse");
        assert!(!rest.split('/').any(|p| p == ".."), "{}", o.location);
    }
    let dead_dir = h
        .backend
        .warehouse
        .table_location(&h.backend.namespace, "dead_letters");
    assert!(
        h.backend
            .warehouse
            .list(&format!("{dead_dir}/data/"))
            .await
            .expect("list")
            .iter()
            .any(|o| o.location.contains("..%2F..%2F..%2Fescaped-0-")),
        "the stray record's dead letter, named with its topic escaped"
    );
    let location = h
        .backend
        .warehouse
        .table_location(&h.backend.namespace, "events");
    for o in h
        .backend
        .warehouse
        .list(&format!("{location}/"))
        .await
        .expect("list")
    {
        let rest = o
            .location
            .strip_prefix(&location)
            .expect("inside the table");
        assert!(!rest.split('/').any(|p| p == ".."), "{}", o.location);
        let name_len = rest.split('/').map(str::len).max().unwrap_or(0);
        assert!(
            name_len < 255,
            "{} has a component of {name_len} bytes",
            o.location
        );
    }
    // Every live file holds rows of its own partition only.
    let (table, _) = h
        .backend
        .catalog
        .load(&tables.ident("events"))
        .await
        .expect("load")
        .expect("table");
    let files = streamtable::table::files::load_current(&table)
        .await
        .expect("files");
    let mut seen = 0;
    for f in files.live() {
        let df = f.entry.data_file();
        let want: Option<String> = df.partition().fields()[0].as_ref().map(|l| match l {
            iceberg::spec::Literal::Primitive(iceberg::spec::PrimitiveLiteral::String(s)) => {
                s.clone()
            }
            other => panic!("{other:?}"),
        });
        let bytes = h
            .backend
            .warehouse
            .read(df.file_path())
            .await
            .expect("read");
        for b in super::read_parquet(bytes) {
            use arrow_array::Array;
            use arrow_array::cast::AsArray;
            let kind = b.column_by_name("kind").expect("kind").as_string::<i32>();
            for i in 0..b.num_rows() {
                let got = (!kind.is_null(i)).then(|| kind.value(i).to_string());
                assert_eq!(got, want, "row in {}", df.file_path());
                seen += 1;
            }
        }
    }
    assert_eq!(seen, 15);
    let py = h.read_external("pyiceberg", "events");
    assert_eq!(py["count"], 15);
}

/// A batch the event source mapping gave up on (ingest failed through all its retries, so it
/// went to the S3 on-failure destination and later batches moved the checkpoint past it) is fed
/// back by `replay` exactly once: plain ingest would drop it as already seen.
pub async fn a_batch_given_up_on_is_replayed_exactly_once(h: &Harness) {
    use super::faults::{Fault, FaultyState};
    let tables = h.tables();
    let mut b = records("orders", 0, 20..40);
    b[3].value = Some(b"not json".to_vec());
    let (a, b, c) = (
        event(&records("orders", 0, 0..20)),
        event(&b),
        event(&records("orders", 0, 40..60)),
    );
    h.ingestor().handle(&a).await.expect("a");
    let failing = h.ingestor_with_state(FaultyState::new(
        h.backend.state.clone(),
        vec![Fault::CrashBeforeAdvance],
    ));
    failing
        .handle(&b)
        .await
        .expect_err("b fails, and the ESM gives up on it");
    // What the S3 on-failure destination keeps: the invocation record, the event as a string.
    let record = json!({
        "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 11},
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
        "version": "1.0",
        "KafkaBatchInfo": {"batchSize": 20},
        "payload": serde_json::to_string(&b).expect("event json"),
    })
    .to_string();
    h.ingestor().handle(&c).await.expect("c");
    scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("run");

    let plain = h.ingestor().handle(&b).await.expect("plain ingest");
    assert_eq!(
        (plain.accepted, plain.already_seen),
        (0, 20),
        "plain ingest drops it"
    );

    let event = streamtable::replay::parse_failed_batch(record.as_bytes(), "s3://failed/b")
        .expect("failure record");
    let first = streamtable::replay::replay(&h.ingestor(), &h.backend, &h.spec, &event)
        .await
        .expect("replay");
    assert_eq!(first.len(), 1);
    assert_eq!(
        (
            first[0].accepted,
            first[0].dead_lettered,
            first[0].already_landed
        ),
        (19, 1, 0)
    );
    // Again, before and after the commit; and a batch that had landed anyway.
    for ev in [&event, &a] {
        let again = streamtable::replay::replay(&h.ingestor(), &h.backend, &h.spec, ev)
            .await
            .expect("replay again");
        assert_eq!(
            (
                again[0].accepted,
                again[0].dead_lettered,
                again[0].already_landed
            ),
            (0, 0, 20)
        );
    }
    scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("run");
    let again = streamtable::replay::replay(&h.ingestor(), &h.backend, &h.spec, &event)
        .await
        .expect("replay after commit");
    assert_eq!((again[0].accepted, again[0].already_landed), (0, 20));
    let expected: Vec<Value> = (0..60)
        .filter(|o| *o != 23)
        .map(|o| json!([0, o]))
        .collect();
    check_table(h, "orders", &expected);
    check_table(h, "dead_letters", &[json!(["orders", 0, 23])]);

    // Two replays of one partition at once: the second waits for the first.
    let lock = "replay#orders-0";
    assert!(
        h.backend
            .state
            .try_lock(lock, "someone", 0, i64::MAX)
            .await
            .expect("lock")
    );
    let err = streamtable::replay::replay(&h.ingestor(), &h.backend, &h.spec, &event)
        .await
        .expect_err("locked");
    assert!(
        err.is_retryable() && err.to_string().contains("another replay"),
        "{err}"
    );
    h.backend
        .state
        .unlock(lock, "someone")
        .await
        .expect("unlock");
}

/// Wide rows (dead letters keep whole record values, up to 1 MiB each) close a re-encoded row
/// group by its bytes, not only by its rows, so a rewrite's memory stays bounded.
pub async fn wide_rows_make_row_groups_bounded_by_bytes(h: &Harness) {
    let tables = h.tables();
    let mut expected = Vec::new();
    for i in 0..6i64 {
        let mut recs = records("orders", 0, i * 4..(i + 1) * 4);
        for r in &mut recs {
            // Not JSON, 100 KB: a dead letter carrying its value.
            let filler: String = (0..100_000)
                .map(|j| (b'a' + ((j * 7 + r.offset) % 26) as u8) as char)
                .collect();
            r.value = Some(filler.into_bytes());
            expected.push(json!(["orders", 0, r.offset]));
        }
        h.ingestor().handle(&event(&recs)).await.expect("ingest");
    }
    commit_pending(&h.backend, &tables).await.expect("commit");
    let options = CompactOptions {
        max_row_group_bytes: 512 * 1024,
        ..opts()
    };
    let done = compact_all(&h.backend, &tables, &options)
        .await
        .expect("compact");
    let dl = done
        .iter()
        .find(|c| c.table == "dead_letters")
        .expect("dead letters compacted");
    assert_eq!((dl.input_files, dl.output_files), (6, 1));
    let (table, _) = h
        .backend
        .catalog
        .load(&tables.ident("dead_letters"))
        .await
        .expect("load")
        .expect("table");
    let files = streamtable::table::files::load_current(&table)
        .await
        .expect("files");
    let live: Vec<_> = files.live().collect();
    assert_eq!(live.len(), 1);
    let bytes = h
        .backend
        .warehouse
        .read(live[0].entry.data_file().file_path())
        .await
        .expect("read");
    let meta = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(&bytes)
        .expect("footer");
    assert!(
        meta.num_row_groups() >= 3,
        "24 rows of 100 KB in row groups of at most 512 KB: {} row groups",
        meta.num_row_groups()
    );
    check_table(h, "dead_letters", &expected);
}

/// A commit intent names at most `max_intent_bytes` of batch keys (long topic names made one
/// outgrow a DynamoDB item); the rest is committed in further rounds.
pub async fn commit_intents_stay_within_their_size(h: &mut Harness) {
    let long = "t".repeat(249);
    h.spec
        .tables
        .iter_mut()
        .find(|t| t.name == "orders")
        .expect("orders")
        .topic = long.clone();
    let tables = h.tables();
    for p in 0..20 {
        let mut recs = records("orders", p, 0..3);
        for r in &mut recs {
            r.topic = long.clone();
        }
        h.ingestor().handle(&event(&recs)).await.expect("ingest");
    }
    let options = streamtable::commit::CommitOptions {
        max_intent_bytes: 2_000,
        ..Default::default()
    };
    let report = streamtable::commit::commit_pending_with(&h.backend, &tables, &options, None)
        .await
        .expect("commit");
    assert_eq!(report.batches, 20);
    assert!(report.rounds >= 4, "{} rounds", report.rounds);
    let mut expected: Vec<Value> = (0..20)
        .flat_map(|p| (0..3).map(move |o| json!([p, o])))
        .collect();
    expected.sort_by_key(|v| (v[0].as_i64(), v[1].as_i64()));
    check_table(h, "orders", &expected);
}
