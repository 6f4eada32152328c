//! `streamtable register`: a table whose catalog entry is gone is registered at its head
//! metadata, and read back as it was; a failed commit attempt's file of the same version makes
//! it refuse and list both, until one is chosen.

use iceberg::{NamespaceIdent, TableIdent};
use streamtable::catalog::register::{Registered, metadata_files, register};
use streamtable::commit::commit_pending;

use super::{Harness, event, records};

pub async fn a_table_whose_catalog_entry_is_gone_is_registered_at_its_head(h: &Harness) {
    let tables = h.tables();
    for i in 0..3 {
        h.ingestor()
            .handle(&event(&records("orders", 0, i * 10..(i + 1) * 10)))
            .await
            .expect("ingest");
        commit_pending(&h.backend, &tables).await.expect("commit");
    }
    let before = h.read_external("pyiceberg", "orders");
    let ns = h.backend.namespace.clone();
    let ident = TableIdent::new(NamespaceIdent::new(ns.clone()), "orders".into());
    let (_, head) = h
        .backend
        .catalog
        .load(&ident)
        .await
        .expect("load")
        .expect("orders");
    let pointers = h.backend.catalog.pointers();

    // The entry is gone (a deleted Glue database, a lost catalog.db); the files are not.
    pointers.drop_table(&ns, "orders").await.expect("drop");
    assert!(
        h.backend
            .catalog
            .load(&ident)
            .await
            .expect("load")
            .is_none()
    );
    let got = register(&h.backend, &ns, "orders", None)
        .await
        .expect("register");
    assert_eq!(got, Registered::Registered(head.metadata_location.clone()));
    let after = h.read_external("pyiceberg", "orders");
    assert_eq!(after["current_snapshot_id"], before["current_snapshot_id"]);
    assert_eq!(after["count"], 30);
    assert_eq!(after["checksum"], before["checksum"]);
    assert_eq!(
        register(&h.backend, &ns, "orders", None)
            .await
            .expect("again"),
        Registered::AlreadyThere(head.metadata_location.clone())
    );

    // A commit attempt that lost its swap left a file of the head's version: refused, listed.
    pointers.drop_table(&ns, "orders").await.expect("drop");
    let files = metadata_files(&h.backend, &ns, "orders")
        .await
        .expect("files");
    let (version, _) = files[0].clone();
    let older = files
        .iter()
        .find(|(v, _)| *v < version)
        .map(|(_, l)| l.clone())
        .expect("an older metadata file");
    let io = h.backend.catalog.file_io();
    let bytes = io
        .new_input(&older)
        .expect("input")
        .read()
        .await
        .expect("read");
    let dir = head
        .metadata_location
        .rsplit_once('/')
        .map(|(d, _)| d.to_string())
        .expect("dir");
    let stray = format!("{dir}/{version:05}-{}.metadata.json", uuid::Uuid::new_v4());
    io.new_output(&stray)
        .expect("output")
        .write(bytes)
        .await
        .expect("write");
    let e = register(&h.backend, &ns, "orders", None)
        .await
        .expect_err("ambiguous")
        .to_string();
    assert!(
        e.contains("share the newest version")
            && e.contains(&head.metadata_location)
            && e.contains(&stray),
        "{e}"
    );
    assert!(
        h.backend
            .catalog
            .load(&ident)
            .await
            .expect("load")
            .is_none()
    );
    let name = head
        .metadata_location
        .rsplit('/')
        .next()
        .expect("file name");
    assert_eq!(
        register(&h.backend, &ns, "orders", Some(name))
            .await
            .expect("chosen"),
        Registered::Registered(head.metadata_location.clone())
    );
    assert_eq!(h.read_external("duckdb", "orders")["count"], 30);
}
