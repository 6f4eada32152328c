//! Compaction scenarios, checked from outside through pyiceberg and DuckDB, run on every
//! backend.

use streamtable::commit::commit_pending;
use streamtable::compact::{CompactOptions, compact_all};

use super::table_scenarios::{check_table, json_keys, keys, operations, opts};
use super::{Harness, event, records};

/// Eight small appends in one partition become one file in one `replace` snapshot; every row
/// is read exactly once before and after, and the old snapshot still reads as it was.
pub async fn compaction_replaces_small_files_in_one_snapshot(h: &Harness) {
    let tables = h.tables();
    for i in 0..8 {
        let ev = event(&records("orders", 0, i * 40..(i + 1) * 40));
        h.ingestor().handle(&ev).await.expect("ingest");
        commit_pending(&h.backend, &tables).await.expect("commit");
    }
    let expected = json_keys(0, 0..320);
    let before = check_table(h, "orders", &expected);
    let before_snapshot = before["current_snapshot_id"].as_i64().expect("snapshot id");

    let report = compact_all(&h.backend, &tables, &opts())
        .await
        .expect("compact");
    let orders: Vec<_> = report.iter().filter(|c| c.table == "orders").collect();
    assert_eq!(orders.len(), 1, "{report:?}");
    assert_eq!(
        (
            orders[0].input_files,
            orders[0].output_files,
            orders[0].rows
        ),
        (8, 1, 320)
    );
    assert!(orders[0].snapshot_id.is_some());

    let after = check_table(h, "orders", &expected);
    assert_eq!(
        before["checksum"], after["checksum"],
        "values unchanged by compaction"
    );
    let ops = operations(&after);
    assert_eq!(ops.len(), 9);
    assert_eq!(ops.last().map(String::as_str), Some("replace"));
    let last = &after["snapshots"][8]["summary"];
    assert_eq!(last["total-records"], "320");
    assert_eq!(last["total-data-files"], "1");
    assert_eq!(last["deleted-data-files"], "8");
    let old = h.read_external_at("pyiceberg", "orders", Some(before_snapshot));
    assert_eq!(
        keys(&old),
        expected,
        "time travel to the pre-compaction snapshot"
    );

    // Nothing left to compact.
    let again = compact_all(&h.backend, &tables, &opts())
        .await
        .expect("compact again");
    assert!(again.iter().all(|c| c.table != "orders"));
}

/// Ingest + commit and compaction running at the same time: no row lost, none doubled.
pub async fn concurrent_commit_and_compaction_keep_every_row_once(h: &Harness) {
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    let eager = CompactOptions {
        min_input_files: 2,
        ..opts()
    };
    let writer = {
        let backend = h.backend.clone();
        let tables = tables.clone();
        let ingestor = h.ingestor();
        tokio::spawn(async move {
            for i in 0..10 {
                ingestor
                    .handle(&event(&records("orders", 0, i * 20..(i + 1) * 20)))
                    .await
                    .expect("ingest");
                commit_pending(&backend, &tables).await.expect("commit");
            }
        })
    };
    let compactor = {
        let backend = h.backend.clone();
        let tables = tables.clone();
        let eager = eager.clone();
        tokio::spawn(async move {
            let mut rounds = 0;
            for _ in 0..15 {
                let r = compact_all(&backend, &tables, &eager)
                    .await
                    .expect("compact");
                rounds += r.iter().filter(|c| c.snapshot_id.is_some()).count();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            rounds
        })
    };
    writer.await.expect("writer task");
    let rounds = compactor.await.expect("compactor task");
    compact_all(&h.backend, &tables, &eager)
        .await
        .expect("final compaction");
    let py = check_table(h, "orders", &json_keys(0, 0..200));
    let ops = operations(&py);
    assert_eq!(ops.iter().filter(|o| *o == "append").count(), 10);
    assert!(rounds + 1 >= ops.iter().filter(|o| *o == "replace").count());
    assert!(
        ops.iter().any(|o| o == "replace"),
        "compaction ran: {ops:?}"
    );
}

/// Large row groups are copied byte for byte, small ones re-encoded together, in one output
/// file that both outside readers read exactly as before.
pub async fn compaction_copies_large_row_groups_and_merges_small_ones(h: &Harness) {
    let tables = h.tables();
    let mut offset = 0;
    let mut big_sizes = Vec::new();
    for (i, rows) in [300i64, 20, 300, 20, 20, 300].into_iter().enumerate() {
        h.ingestor()
            .handle(&event(&records("orders", 0, offset..offset + rows)))
            .await
            .expect("ingest");
        offset += rows;
        if rows == 300 {
            big_sizes.extend(h.pending_files().await.iter().map(|f| f.bytes));
        }
        commit_pending(&h.backend, &tables)
            .await
            .unwrap_or_else(|e| panic!("commit {i}: {e}"));
    }
    let expected = json_keys(0, 0..offset);
    let before = check_table(h, "orders", &expected);
    // Between the small files' row groups and the large ones'.
    let threshold = big_sizes.iter().min().copied().expect("big files") / 2;
    let options = CompactOptions {
        stitch_min_row_group_bytes: threshold,
        ..opts()
    };
    let report = compact_all(&h.backend, &tables, &options)
        .await
        .expect("compact");
    let orders = report
        .iter()
        .find(|c| c.table == "orders")
        .expect("orders compacted");
    assert_eq!(
        (orders.input_files, orders.output_files, orders.rows),
        (6, 1, offset as u64)
    );
    let after = check_table(h, "orders", &expected);
    assert_eq!(before["checksum"], after["checksum"], "values unchanged");

    let live = h.live_files("orders").await;
    assert_eq!(live.len(), 1);
    let bytes = h
        .backend
        .warehouse
        .read(&live[0])
        .await
        .expect("read output");
    let meta = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
        .expect("parquet");
    let groups: Vec<i64> = meta
        .metadata()
        .row_groups()
        .iter()
        .map(|rg| rg.num_rows())
        .collect();
    // 300 (copied), 20 (re-encoded, flushed before the next copy), 300, 40, 300.
    assert_eq!(groups, [300, 20, 300, 40, 300], "row groups of the output");
}

/// A replace whose new file is gone before its commit (orphan clean-up of a run that outlasted
/// its grace period deleted it) commits nothing: a snapshot naming a missing file would fail
/// every reader. The table keeps its snapshot and its rows.
pub async fn a_replace_whose_new_file_is_gone_commits_nothing(h: &Harness) {
    use iceberg::spec::{DataContentType, DataFileBuilder, DataFileFormat};
    use std::collections::{HashMap, HashSet};
    let tables = h.tables();
    for i in 0..2 {
        let ev = event(&records("orders", 0, i * 40..(i + 1) * 40));
        h.ingestor().handle(&ev).await.expect("ingest");
        commit_pending(&h.backend, &tables).await.expect("commit");
    }
    let expected = json_keys(0, 0..80);
    let before = check_table(h, "orders", &expected);
    let ident = tables.ident("orders");
    let (table, _) = h
        .backend
        .catalog
        .load(&ident)
        .await
        .expect("load")
        .expect("orders exists");
    let current = table
        .metadata()
        .current_snapshot()
        .expect("snapshot")
        .clone();
    let files = streamtable::table::files::load(&table, &current)
        .await
        .expect("files");
    let old = files.live().next().expect("a live file").entry.data_file();
    // What a rewrite would add: the file's rows under a path that is no longer there.
    let gone = DataFileBuilder::default()
        .content(DataContentType::Data)
        .file_path(format!(
            "{}.rewritten-then-deleted.parquet",
            old.file_path()
        ))
        .file_format(DataFileFormat::Parquet)
        .partition(old.partition().clone())
        .record_count(old.record_count())
        .file_size_in_bytes(old.file_size_in_bytes())
        .build()
        .expect("data file");
    let removed = HashSet::from([old.file_path().to_string()]);
    let err = streamtable::table::replace::commit_replace(
        &h.backend.catalog,
        &ident,
        &removed,
        &[gone],
        &HashMap::new(),
    )
    .await
    .expect_err("a replace adding a missing file must not commit");
    assert!(err.is_retryable(), "the next run rewrites again: {err}");
    assert!(
        err.to_string().contains("orphan_grace"),
        "names the fix: {err}"
    );
    let after = check_table(h, "orders", &expected);
    assert_eq!(
        before["current_snapshot_id"], after["current_snapshot_id"],
        "nothing committed"
    );
}

/// With size tiers (`tier_ratio` 2), a compacted file is left alone while the files beside it
/// are small against it, and rewritten with them once they add up to half its size; every row is read
/// exactly once throughout.
pub async fn size_tiers_leave_a_compacted_file_until_newer_files_add_up_to_it(h: &Harness) {
    let tables = h.tables();
    let tiers = CompactOptions {
        min_input_files: 2,
        tier_ratio: Some(2.0),
        ..opts()
    };
    let offset = std::cell::Cell::new(0i64);
    let land = |rows: i64| {
        let range = offset.get()..offset.get() + rows;
        offset.set(offset.get() + rows);
        let tables = tables.clone();
        async move {
            h.ingestor()
                .handle(&event(&records("orders", 0, range)))
                .await
                .expect("ingest");
            commit_pending(&h.backend, &tables).await.expect("commit");
        }
    };
    let orders = |report: &[streamtable::compact::PartitionCompaction]| {
        report
            .iter()
            .find(|c| c.table == "orders")
            .map(|c| (c.input_files, c.output_files))
    };
    for _ in 0..6 {
        land(300).await;
    }
    let report = compact_all(&h.backend, &tables, &tiers)
        .await
        .expect("compact");
    assert_eq!(orders(&report), Some((6, 1)), "{report:?}");
    let big = h.live_files("orders").await;
    assert_eq!(big.len(), 1);

    // Two small appends: merged with each other, the compacted file left alone.
    land(30).await;
    land(30).await;
    let report = compact_all(&h.backend, &tables, &tiers)
        .await
        .expect("compact");
    assert_eq!(orders(&report), Some((2, 1)), "{report:?}");
    let now = h.live_files("orders").await;
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(
        now.contains(&big[0]),
        "the compacted file is untouched: {now:?}"
    );
    check_table(h, "orders", &json_keys(0, 0..offset.get()));

    // Newer files adding up to half its size or more: it is rewritten with them.
    for _ in 0..7 {
        land(300).await;
    }
    let report = compact_all(&h.backend, &tables, &tiers)
        .await
        .expect("compact");
    let (inputs, outputs) = orders(&report).expect("orders compacted");
    assert!(inputs >= 8 && outputs == 1, "{report:?}");
    let now = h.live_files("orders").await;
    assert!(
        !now.contains(&big[0]),
        "the compacted file joined the newer ones: {now:?}"
    );
    assert!(now.len() <= 2, "{now:?}");
    check_table(h, "orders", &json_keys(0, 0..offset.get()));
}
