//! Commit, compaction and maintenance on AWS emulated by moto (Glue catalog with VersionId
//! checks, S3), read back through pyiceberg's GlueCatalog and DuckDB over S3.

use crate::common;
use crate::common::compaction_scenarios as c;
use crate::common::table_scenarios as s;

#[tokio::test]
async fn committed_tables_read_back_through_pyiceberg_and_duckdb() {
    s::committed_tables_read_back_through_pyiceberg_and_duckdb(&common::moto().await).await;
}

#[tokio::test]
async fn tables_are_created_on_first_use() {
    s::tables_are_created_on_first_use(&common::moto().await).await;
}

#[tokio::test]
async fn commit_crash_before_bookkeeping_is_finished_without_duplicates() {
    s::commit_crash_before_bookkeeping_is_finished_without_duplicates(&common::moto().await).await;
}

#[tokio::test]
async fn commit_crash_between_tables_is_resumed() {
    s::commit_crash_between_tables_is_resumed(&common::moto().await).await;
}

#[tokio::test]
async fn a_replace_whose_new_file_is_gone_commits_nothing() {
    c::a_replace_whose_new_file_is_gone_commits_nothing(&common::moto().await).await;
}

#[tokio::test]
async fn compaction_replaces_small_files_in_one_snapshot() {
    c::compaction_replaces_small_files_in_one_snapshot(&common::moto().await).await;
}

#[tokio::test]
async fn maintenance_deletes_only_unreferenced_files() {
    s::maintenance_deletes_only_unreferenced_files(&common::moto().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commit_and_compaction_keep_every_row_once() {
    c::concurrent_commit_and_compaction_keep_every_row_once(&common::moto().await).await;
}

/// What Athena and QuickSight rely on: Glue tables typed ICEBERG, pointing at the current
/// metadata, with StorageDescriptor columns equal to the Iceberg schema.
#[tokio::test]
async fn glue_tables_carry_iceberg_parameters_and_columns() {
    let h = common::moto().await;
    h.ingestor()
        .handle(&common::event(&common::records("orders", 0, 0..5)))
        .await
        .expect("ingest");
    streamtable::scheduled::run(&h.backend, &h.tables(), &Default::default())
        .await
        .expect("run");
    let glue = aws_sdk_glue::Client::new(&streamtable::aws::load_config().await);
    let t = glue
        .get_table()
        .database_name(&h.backend.namespace)
        .name("orders")
        .send()
        .await
        .expect("get table");
    let t = t.table().expect("table");
    let params = t.parameters().expect("parameters");
    assert_eq!(
        params.get("table_type").map(String::as_str),
        Some("ICEBERG")
    );
    let py = h.read_external("pyiceberg", "orders");
    assert_eq!(
        params.get("metadata_location").map(String::as_str),
        py["metadata_location"].as_str()
    );
    let sd = t.storage_descriptor().expect("storage descriptor");
    let cols: Vec<(String, String)> = sd
        .columns()
        .iter()
        .map(|c| {
            (
                c.name().to_string(),
                c.r#type().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let expected = [
        ("order_id", "string"),
        ("customer_id", "string"),
        ("amount", "decimal(18,2)"),
        ("currency", "string"),
        ("country", "string"),
        ("status", "string"),
        ("created_at", "timestamp"),
        ("kafka_partition", "int"),
        ("kafka_offset", "bigint"),
        ("kafka_timestamp", "timestamp"),
        ("kafka_key", "string"),
        ("kafka_key_bytes", "binary"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(cols, expected);
    assert_eq!(
        sd.location(),
        Some(
            h.backend
                .warehouse
                .table_location(&h.backend.namespace, "orders")
                .as_str()
        )
    );
}

/// A swap from a stale VersionId is refused, even when the location it expects is current.
#[tokio::test]
async fn glue_swap_from_a_stale_version_is_refused() {
    let h = common::moto().await;
    let tables = h.tables();
    let table = tables.ensure(&h.backend, "orders").await.expect("table");
    let pointers = h.backend.catalog.pointers();
    let ns = h.backend.namespace.clone();
    let first = pointers
        .get(&ns, "orders")
        .await
        .expect("get")
        .expect("exists");
    h.ingestor()
        .handle(&common::event(&common::records("orders", 0, 0..5)))
        .await
        .expect("ingest");
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    let second = pointers
        .get(&ns, "orders")
        .await
        .expect("get")
        .expect("exists");
    assert_ne!(first, second);

    let metadata = table.metadata();
    let stale = pointers
        .swap(
            &ns,
            "orders",
            &first,
            "s3://nowhere/x.metadata.json",
            metadata,
        )
        .await
        .expect("swap");
    assert!(!stale, "stale location must lose");
    let forged = streamtable::catalog::Pointer {
        metadata_location: second.metadata_location.clone(),
        version: first.version.clone(),
    };
    let refused = pointers
        .swap(
            &ns,
            "orders",
            &forged,
            "s3://nowhere/y.metadata.json",
            metadata,
        )
        .await;
    // Refused, but reported as an unknown outcome: Glue says the same to the SDK's repeat of a
    // swap that succeeded, so only a fresh read of the pointer can tell.
    let err = refused.expect_err("stale VersionId must not be applied");
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("ConcurrentModification"), "{err}");
    assert_eq!(
        pointers.get(&ns, "orders").await.expect("get"),
        Some(second)
    );
}

#[tokio::test]
async fn compaction_copies_large_row_groups_and_merges_small_ones() {
    c::compaction_copies_large_row_groups_and_merges_small_ones(&common::moto().await).await;
}

#[tokio::test]
async fn triggered_commits_are_spaced_by_the_interval() {
    s::triggered_commits_are_spaced_by_the_interval(&common::moto().await).await;
}

/// A windowed table's merging view is a Glue view Athena reads: `VIRTUAL_VIEW`, its definition
/// in Presto's format over the partial table, with the columns and the Trino types the SQL
/// gives; `list_tables` (the Iceberg tables) leaves it out.
#[tokio::test]
async fn windowed_tables_register_their_view_in_glue_for_athena() {
    use base64::Engine as _;
    let mut h = common::moto().await;
    h.spec = common::shipped_spec();
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    let glue = aws_sdk_glue::Client::new(&streamtable::aws::load_config().await);
    let t = glue
        .get_table()
        .database_name(&h.backend.namespace)
        .name("orders_per_minute")
        .send()
        .await
        .expect("get view");
    let t = t.table().expect("view");
    assert_eq!(t.table_type(), Some("VIRTUAL_VIEW"));
    assert_eq!(t.view_expanded_text(), Some("/* Presto View */"));
    let text = t.view_original_text().expect("view text");
    let encoded = text
        .strip_prefix("/* Presto View: ")
        .and_then(|r| r.strip_suffix(" */"))
        .expect("Presto view format");
    let json: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("base64"),
    )
    .expect("json");
    let ns = &h.backend.namespace;
    assert_eq!(json["catalog"], "awsdatacatalog");
    assert_eq!(json["schema"], ns.as_str());
    let sql = json["originalSql"].as_str().expect("sql");
    assert!(
        sql.contains(&format!("FROM \"{ns}\".\"orders_per_minute_partials\"")),
        "{sql}"
    );
    assert!(sql.contains("SUM(\"revenue\") AS \"revenue\""), "{sql}");
    let columns: Vec<(String, String)> = json["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["type"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let expect = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        columns,
        expect(&[
            ("window_start", "timestamp(6)"),
            ("window_end", "timestamp(6)"),
            ("country", "varchar"),
            ("orders", "bigint"),
            ("revenue", "decimal(38,2)"),
        ])
    );
    let sd: Vec<(String, String)> = t
        .storage_descriptor()
        .expect("storage descriptor")
        .columns()
        .iter()
        .map(|c| {
            (
                c.name().to_string(),
                c.r#type().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        sd,
        expect(&[
            ("window_start", "timestamp"),
            ("window_end", "timestamp"),
            ("country", "string"),
            ("orders", "bigint"),
            ("revenue", "decimal(38,2)"),
        ])
    );
    // The sessions' view too; the Iceberg table list leaves views out; a second ensure is a
    // no-op.
    assert!(
        glue.get_table()
            .database_name(ns)
            .name("sensor_sessions")
            .send()
            .await
            .is_ok()
    );
    let listed = h
        .backend
        .catalog
        .pointers()
        .list_tables(ns)
        .await
        .expect("list");
    assert!(listed.contains(&"orders_per_minute_partials".to_string()));
    assert!(!listed.contains(&"orders_per_minute".to_string()));
    tables.ensure_all(&h.backend).await.expect("tables again");
}

#[tokio::test]
async fn status_shows_checkpoints_landings_pending_batches_and_commits() {
    common::status_scenarios::status_shows_checkpoints_landings_pending_batches_and_commits(
        &common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn a_table_whose_catalog_entry_is_gone_is_registered_at_its_head() {
    common::register_scenarios::a_table_whose_catalog_entry_is_gone_is_registered_at_its_head(
        &common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn size_tiers_leave_a_compacted_file_until_newer_files_add_up_to_it() {
    c::size_tiers_leave_a_compacted_file_until_newer_files_add_up_to_it(&common::moto().await)
        .await;
}

/// Every S3 request is billed, so a written object stays one `PutObject` until it outgrows one
/// 64 MiB part (a compacted file of 60 MiB is one request, not a create, 4 parts and a
/// complete); past that it streams as a multipart upload and reads back byte for byte.
/// S3 tells the two apart by the ETag: a multipart object's ends in `-<parts>`.
#[tokio::test]
async fn objects_stay_one_put_until_they_outgrow_a_64_mib_part() {
    let h = common::moto().await;
    let sdk = streamtable::aws::load_config().await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .build(),
    );
    let root = h.backend.warehouse.root().to_string();
    let (bucket, prefix) = root
        .trim_start_matches("s3://")
        .split_once('/')
        .expect("warehouse root is s3://bucket/prefix");
    const MIB: usize = 1024 * 1024;
    for (name, size, parts) in [
        ("one-put", 60 * MIB, None),
        ("multipart", 65 * MIB, Some(2)),
    ] {
        let location = format!("{root}/large/{name}.bin");
        let chunk: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
        let mut writer = h
            .backend
            .warehouse
            .file_io()
            .new_output(&location)
            .expect("output")
            .writer()
            .await
            .expect("writer");
        for _ in 0..size / MIB {
            writer
                .write(bytes::Bytes::from(chunk.clone()))
                .await
                .expect("write");
        }
        writer.close().await.expect("close");
        let key = format!("{prefix}/large/{name}.bin");
        let head = s3
            .head_object()
            .bucket(bucket)
            .key(&key)
            .send()
            .await
            .expect("head");
        assert_eq!(head.content_length(), Some(size as i64), "{name}");
        let etag = head
            .e_tag()
            .unwrap_or_default()
            .trim_matches('"')
            .to_string();
        let uploaded_parts = etag.split_once('-').map(|(_, n)| n.parse::<usize>().ok());
        assert_eq!(uploaded_parts, parts.map(Some), "{name}: ETag {etag}");
        let back = h
            .backend
            .warehouse
            .read(&location)
            .await
            .expect("read back");
        assert_eq!(back.len(), size, "{name}");
        assert!(
            back.chunks(MIB).all(|c| c == chunk.as_slice()),
            "{name}: read back differs"
        );
        h.backend.warehouse.delete(&location).await.expect("delete");
    }
}

#[tokio::test]
async fn upserts_read_back_as_the_last_record_per_key() {
    let mut h = common::moto().await;
    common::upsert_scenarios::upserts_read_back_as_the_last_record_per_key(&mut h).await;
}

#[tokio::test]
async fn a_derived_upsert_table_holds_the_last_row_per_key() {
    let mut h = common::moto().await;
    common::upsert_scenarios::a_derived_upsert_table_holds_the_last_row_per_key(&mut h).await;
}

#[tokio::test]
async fn a_changed_primary_key_is_refused_until_the_spec_rekeys() {
    let mut h = common::moto().await;
    common::upsert_scenarios::a_changed_primary_key_is_refused_until_the_spec_rekeys(&mut h).await;
}

#[tokio::test]
async fn debezium_changes_read_back_as_the_current_rows() {
    let mut h = common::moto().await;
    common::debezium_scenarios::debezium_changes_read_back_as_the_current_rows(&mut h).await;
}

#[tokio::test]
async fn debezium_avro_changes_read_back_as_the_current_rows() {
    let mut h = common::moto().await;
    common::debezium_scenarios::debezium_avro_changes_read_back_as_the_current_rows(&mut h).await;
}

#[tokio::test]
async fn the_audit_counts_every_record_of_an_upsert_table() {
    let mut h = common::moto().await;
    common::upsert_scenarios::the_audit_counts_every_record_of_an_upsert_table(&mut h).await;
}
