//! Test harness: real backends (embedded SQLite + local files, or S3 + DynamoDB on the moto
//! server), synthetic ESM events, and readers that check what landed.
#![allow(dead_code)]

pub mod analyst_scenarios;
pub mod audit_scenarios;
pub mod blocked_scenarios;
pub mod chaos;
pub mod commit_race_scenarios;
pub mod compaction_scenarios;
pub mod debezium_scenarios;
pub mod derived_scenarios;
pub mod event_time_scenarios;
pub mod evolution_scenarios;
pub mod faults;
pub mod format_scenarios;
pub mod idle_scenarios;
pub mod join_bound_scenarios;
pub mod join_scenarios;
pub mod protobuf_scenarios;
pub mod register_scenarios;
pub mod registry_columns_scenarios;
pub mod reliability_layout_scenarios;
pub mod reliability_scenarios;
pub mod scenarios;
pub mod spec_change_scenarios;
pub mod state_scenarios;
pub mod status_scenarios;
pub mod struct_scenarios;
pub mod table_scenarios;
pub mod trino;
pub mod upsert_oracle;
pub mod upsert_scenarios;
pub mod window_scenarios;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use streamtable::backend::{Backend, BackendConfig};
use streamtable::checkpoint::PendingFile;
use streamtable::esm::EsmEvent;
use streamtable::generate::{EventFactory, SourceRecord, esm_event};
use streamtable::ingest::Ingestor;
use streamtable::spec::PipelineSpec;
use streamtable::store::StateStore;

/// A connected backend plus the example pipeline spec.
pub struct Harness {
    pub backend: Backend,
    pub spec: PipelineSpec,
    /// Keeps the embedded home alive.
    pub _home: Option<tempfile::TempDir>,
    /// How an outside reader reaches the catalog.
    pub catalog_args: Vec<String>,
}

/// The shipped spec's topics' tables, without its derived tables: the spine's scenarios count
/// files and rows per topic. The derived tables have their own scenarios
/// (`derived_scenarios.rs`) on the full spec ([`shipped_spec`]).
pub fn example_spec() -> PipelineSpec {
    let mut spec = shipped_spec();
    spec.derived.clear();
    spec.references.clear();
    spec
}

/// `infra/pipeline.toml` as shipped.
pub fn shipped_spec() -> PipelineSpec {
    PipelineSpec::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml"),
        &streamtable::process::Planner,
    )
    .expect("example spec")
}

/// A fresh embedded backend in a temporary directory.
pub async fn embedded() -> Harness {
    let home = tempfile::tempdir().expect("tempdir");
    let backend = Backend::connect(&BackendConfig::Embedded {
        home: home.path().to_path_buf(),
    })
    .await
    .expect("embedded backend");
    let catalog_args = vec![
        "--catalog".into(),
        "sql".into(),
        "--home".into(),
        home.path().display().to_string(),
    ];
    Harness {
        backend,
        spec: example_spec(),
        _home: Some(home),
        catalog_args,
    }
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// A fresh bucket and DynamoDB table on the moto server named by `AWS_ENDPOINT_URL`.
pub async fn moto() -> Harness {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap_or_default();
    assert!(
        !endpoint.is_empty(),
        "AWS_ENDPOINT_URL is not set: the moto-backed tests need a moto server; run ./scripts/test, which starts one"
    );
    let name = format!(
        "st-{}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    );
    let sdk = streamtable::aws::load_config().await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .build(),
    );
    s3.create_bucket()
        .bucket(&name)
        .send()
        .await
        .expect("create bucket on moto");
    let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
    create_state_table(&dynamo, &name).await;
    let database = name.replace('-', "_");
    let backend = Backend::connect(&BackendConfig::Aws {
        bucket: name.clone(),
        prefix: "warehouse".into(),
        state_table: name,
        glue_database: database.clone(),
    })
    .await
    .expect("aws backend");
    let catalog_args = vec![
        "--catalog".into(),
        "glue".into(),
        "--endpoint".into(),
        endpoint,
        "--database".into(),
        database,
    ];
    Harness {
        backend,
        spec: example_spec(),
        _home: None,
        catalog_args,
    }
}

/// The DynamoDB table of a moto harness (its Glue database, with dashes).
pub fn state_table(h: &Harness) -> String {
    let at = h
        .catalog_args
        .iter()
        .position(|a| a == "--database")
        .expect("--database");
    h.catalog_args[at + 1].replace('_', "-")
}

/// Writes the state table's layout item as a release before writes it: the bucket layout,
/// synced, with `bodies` (`None`: a release before `bodies` existed).
pub async fn put_layout_of_release_before(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    bodies: Option<i64>,
) {
    use aws_sdk_dynamodb::types::AttributeValue;
    let mut put = dynamo
        .put_item()
        .table_name(table)
        .item("pk", AttributeValue::S("meta".into()))
        .item("sk", AttributeValue::S("layout".into()))
        .item("version", AttributeValue::N("3".into()))
        .item("since_ms", AttributeValue::N("0".into()))
        .item("synced", AttributeValue::Bool(true));
    if let Some(b) = bodies {
        put = put.item("bodies", AttributeValue::N(b.to_string()));
    }
    put.send().await.expect("layout of the release before");
}

pub async fn create_state_table(dynamo: &aws_sdk_dynamodb::Client, name: &str) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let attr = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .expect("attribute")
    };
    let key = |n: &str, t| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
            .expect("key")
    };
    dynamo
        .create_table()
        .table_name(name)
        .attribute_definitions(attr("pk"))
        .attribute_definitions(attr("sk"))
        .key_schema(key("pk", KeyType::Hash))
        .key_schema(key("sk", KeyType::Range))
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create DynamoDB table on moto");
}

impl Harness {
    pub fn tables(&self) -> streamtable::tables::TableSet {
        streamtable::tables::TableSet::new(&self.spec, &self.backend.namespace).expect("table set")
    }

    /// Reads `table` with an independent implementation (`pyiceberg` or `duckdb`).
    pub fn read_external(&self, reader: &str, table: &str) -> serde_json::Value {
        self.read_external_at(reader, table, None)
    }

    pub fn read_external_at(
        &self,
        reader: &str,
        table: &str,
        snapshot: Option<i64>,
    ) -> serde_json::Value {
        self.read_external_with(&["--reader", reader, "--table", table], snapshot)
    }

    /// pyiceberg's view of every row of `table`, canonicalised (see `read_table.py --rows`).
    pub fn pyiceberg_rows(&self, table: &str, snapshot: Option<i64>) -> Vec<Vec<String>> {
        let v = self.read_external_with(
            &["--reader", "pyiceberg", "--table", table, "--rows"],
            snapshot,
        );
        serde_json::from_value(v["rows"].clone()).expect("rows")
    }

    fn read_external_with(&self, args: &[&str], snapshot: Option<i64>) -> serde_json::Value {
        let python = std::env::var("STREAMTABLE_TEST_PYTHON").expect(
            "STREAMTABLE_TEST_PYTHON is not set: these tests read tables back through pyiceberg and DuckDB; run ./scripts/test, which installs them",
        );
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/read_table.py");
        let mut cmd = std::process::Command::new(python);
        cmd.arg(script).args(args).args(&self.catalog_args);
        if let Some(s) = snapshot {
            cmd.args(["--snapshot", &s.to_string()]);
        }
        let out = cmd.output().expect("run read_table.py");
        assert!(
            out.status.success(),
            "read_table.py {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("reader output is JSON")
    }

    pub fn ingestor(&self) -> Ingestor {
        Ingestor::new(&self.spec, &self.backend).expect("ingestor")
    }

    pub fn ingestor_with_state(&self, state: Arc<dyn StateStore>) -> Ingestor {
        let mut backend = self.backend.clone();
        backend.state = state;
        Ingestor::new(&self.spec, &backend).expect("ingestor")
    }

    /// Every pending file, resolving spilled file lists.
    pub async fn pending_files(&self) -> Vec<PendingFile> {
        let mut out = Vec::new();
        for batch in self.backend.state.pending().await.expect("pending") {
            out.extend(batch.files.clone());
            if let Some(loc) = &batch.files_location {
                let bytes = self
                    .backend
                    .warehouse
                    .read(loc)
                    .await
                    .expect("spilled file list");
                let files: Vec<PendingFile> =
                    serde_json::from_slice(&bytes).expect("file list json");
                out.extend(files);
            }
        }
        out
    }

    /// All rows of `table` in its pending files.
    pub async fn rows(&self, table: &str) -> Vec<RecordBatch> {
        let mut out = Vec::new();
        for f in self
            .pending_files()
            .await
            .into_iter()
            .filter(|f| f.table == table && f.key_deletes.is_none())
        {
            if let Some(c) = &f.carried {
                // Rows carried in a state file: the part its pending entry names.
                let file = self
                    .backend
                    .warehouse
                    .read(&c.file)
                    .await
                    .expect("state file");
                let parts = streamtable::process::partition_state::decode_rows(&file, &c.file)
                    .expect("rows");
                let part = parts[c.part as usize].clone();
                assert_eq!(part.len() as u64, f.bytes, "{}: part size", c.file);
                let batches = read_parquet(part);
                let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                assert_eq!(rows as u64, f.rows, "{}: part rows", c.file);
                out.extend(batches);
                continue;
            }
            let df: serde_json::Value = serde_json::from_str(&f.data_file).expect("data file json");
            let path = df["file_path"].as_str().expect("file_path").to_string();
            let bytes = self
                .backend
                .warehouse
                .read(&path)
                .await
                .expect("data file readable");
            assert_eq!(
                bytes.len() as u64,
                f.bytes,
                "{path}: size differs from its pending record"
            );
            assert_eq!(
                df["file_size_in_bytes"].as_u64(),
                Some(f.bytes),
                "{path}: DataFile size"
            );
            let batches = read_parquet(bytes);
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            assert_eq!(
                rows as u64, f.rows,
                "{path}: row count differs from its pending record"
            );
            assert_eq!(
                df["record_count"].as_u64(),
                Some(f.rows),
                "{path}: DataFile record_count"
            );
            out.extend(batches);
        }
        out
    }

    /// (kafka_partition, kafka_offset) of every landed row of a business table, sorted.
    pub async fn landed(&self, table: &str) -> Vec<(i32, i64)> {
        let mut keys: Vec<(i32, i64)> = Vec::new();
        for b in self.rows(table).await {
            let p = b
                .column_by_name("kafka_partition")
                .expect("kafka_partition")
                .as_primitive::<Int32Type>();
            let o = b
                .column_by_name("kafka_offset")
                .expect("kafka_offset")
                .as_primitive::<Int64Type>();
            keys.extend((0..b.num_rows()).map(|i| (p.value(i), o.value(i))));
        }
        keys.sort();
        keys
    }

    /// Dead letters: (topic, partition, offset) -> (kind, value bytes), one entry per row.
    pub async fn dead_letters(&self) -> Vec<DeadRow> {
        let mut out = Vec::new();
        for b in self.rows("dead_letters").await {
            let topic = b.column_by_name("topic").expect("topic").as_string::<i32>();
            let p = b
                .column_by_name("kafka_partition")
                .expect("p")
                .as_primitive::<Int32Type>();
            let o = b
                .column_by_name("kafka_offset")
                .expect("o")
                .as_primitive::<Int64Type>();
            let kind = b
                .column_by_name("error_kind")
                .expect("kind")
                .as_string::<i32>();
            let msg = b
                .column_by_name("error_message")
                .expect("msg")
                .as_string::<i32>();
            let value = b
                .column_by_name("kafka_value")
                .expect("value")
                .as_binary::<i64>();
            for i in 0..b.num_rows() {
                out.push(DeadRow {
                    topic: topic.value(i).to_string(),
                    partition: p.value(i),
                    offset: o.value(i),
                    kind: kind.value(i).to_string(),
                    message: msg.value(i).to_string(),
                    value: (!value.is_null(i)).then(|| value.value(i).to_vec()),
                });
            }
        }
        out.sort_by(|a, b| {
            (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset))
        });
        out
    }

    /// The checkpoint's next offset for a topic-partition.
    /// The data files `table`'s current snapshot reads, sorted.
    pub async fn live_files(&self, table: &str) -> Vec<String> {
        let (loaded, _) = self
            .backend
            .catalog
            .load(&self.tables().ident(table))
            .await
            .expect("load")
            .expect("table");
        let mut live = streamtable::maintenance::live_files(&loaded)
            .await
            .expect("live files");
        live.sort();
        live
    }

    pub async fn next_offset(&self, topic: &str, partition: i32) -> i64 {
        let source = streamtable::checkpoint::SourcePartition::new(topic, partition);
        self.backend
            .state
            .checkpoint(&source)
            .await
            .expect("checkpoint")
            .next_offset
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadRow {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub kind: String,
    pub message: String,
    pub value: Option<Vec<u8>>,
}

pub fn read_parquet(bytes: Bytes) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(bytes)
        .expect("parquet")
        .build()
        .expect("reader")
        .collect::<Result<Vec<_>, _>>()
        .expect("batches")
}

/// Good records of `topic` in `partition` at `offsets`.
pub fn records(
    topic: &str,
    partition: i32,
    offsets: impl IntoIterator<Item = i64>,
) -> Vec<SourceRecord> {
    let mut f = EventFactory::new(partition as u64 + 1);
    let base = 1_795_946_400_000;
    offsets
        .into_iter()
        .map(|o| SourceRecord {
            topic: topic.to_string(),
            partition,
            offset: o,
            timestamp_ms: base + o * 1000,
            key: Some(format!("key-{o}").into_bytes()),
            value: Some(
                f.event(topic, (partition as u64) << 32 | o as u64, base + o * 1000)
                    .into_bytes(),
            ),
            raw_value_field: None,
        })
        .collect()
}

/// The pending files of `table_name` in `batches` as data files of `table` (their recorded JSON
/// passed through `edit` first), as a hand-made commit adds them.
pub fn pending_data_files(
    table: &iceberg::table::Table,
    batches: &[streamtable::checkpoint::PendingBatch],
    table_name: &str,
    edit: impl Fn(&str) -> String,
) -> Vec<iceberg::spec::DataFile> {
    let schema = table.metadata().current_schema().clone();
    let spec = table.metadata().default_partition_spec().clone();
    let partition_type = spec.partition_type(&schema).expect("partition type");
    batches
        .iter()
        .flat_map(|b| b.files.iter())
        .filter(|f| f.table == table_name)
        .map(|f| {
            iceberg::spec::deserialize_data_file_from_json(
                &edit(&f.data_file),
                spec.spec_id(),
                &partition_type,
                &schema,
            )
            .expect("data file")
        })
        .collect()
}

/// An ESM event carrying `records`.
pub fn event(records: &[SourceRecord]) -> EsmEvent {
    serde_json::from_str(&esm_event(records)).expect("generated event parses")
}

/// The expected landed keys for `partition` and `offsets`.
pub fn keys(partition: i32, offsets: impl IntoIterator<Item = i64>) -> Vec<(i32, i64)> {
    offsets.into_iter().map(|o| (partition, o)).collect()
}

/// Counts per kind.
pub fn kinds(rows: &[DeadRow]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in rows {
        *m.entry(r.kind.clone()).or_default() += 1;
    }
    m
}

/// The rows `sql` gives through `streamtable query`'s engine, each value as text (NULL: `None`).
pub async fn query_rows(h: &Harness, sql: &str) -> Vec<Vec<Option<String>>> {
    let engine =
        streamtable::query::QueryEngine::new(&h.backend, streamtable::query::TimeTravel::Current)
            .await
            .expect("query engine");
    let mut out = Vec::new();
    for b in engine.query(sql).await.expect(sql) {
        let columns: Vec<arrow_array::StringArray> = b
            .columns()
            .iter()
            .map(|c| {
                let text = datafusion::arrow::compute::cast(
                    c,
                    &datafusion::arrow::datatypes::DataType::Utf8,
                )
                .expect("as text");
                text.as_string::<i32>().clone()
            })
            .collect();
        for i in 0..b.num_rows() {
            out.push(
                columns
                    .iter()
                    .map(|c| (!c.is_null(i)).then(|| c.value(i).to_string()))
                    .collect(),
            );
        }
    }
    out
}

/// Makes the next commit of upsert table `table` start cold (its key index read from storage),
/// leaving other tables' (other tests') indexes alone.
pub async fn forget_warm_index(h: &Harness, table: &str) {
    let ident = h.tables().ident(table);
    if let Some((t, _)) = h.backend.catalog.load(&ident).await.expect("load") {
        streamtable::upsert::forget_warm_index(t.metadata().location());
    }
}

/// The one integer `sql` gives (a count).
pub async fn count(h: &Harness, sql: &str) -> i64 {
    query_rows(h, sql).await[0][0]
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{sql}: not one integer"))
}

/// (window start `HH:MM`, count) of a windowed table's view, `column` the count's name.
pub async fn window_counts(h: &Harness, view: &str, column: &str) -> Vec<(String, i64)> {
    query_rows(
        h,
        &format!("SELECT window_start, CAST({column} AS BIGINT) FROM {view} ORDER BY 1"),
    )
    .await
    .into_iter()
    .map(|r| {
        let start = r[0].clone().unwrap_or_default();
        let n = r[1].as_deref().and_then(|v| v.parse().ok()).unwrap_or(-1);
        (start.get(11..16).unwrap_or_default().to_string(), n)
    })
    .collect()
}
