"""Reads a table streamtable wrote through an independent Iceberg implementation and prints JSON.

  read_table.py --reader pyiceberg|duckdb --catalog sql --home DIR --table NAME
  read_table.py --reader pyiceberg|duckdb --catalog glue --endpoint URL --database DB --table NAME

Output: {"count": rows, "keys": sorted [kafka_partition, kafka_offset] (with topic first for
dead_letters), "checksum": an order-independent digest of every value, "snapshots": [{"sequence",
"operation", "summary"}] (pyiceberg only), "metadata_location": ..., "columns": [...]}.
"""

import argparse
import hashlib
import json
import os
import sqlite3
import sys


def digest(rows):
    """Order-independent digest of rows given as tuples of Python values."""
    total = 0
    for row in rows:
        h = hashlib.sha256(repr(tuple(str(v) for v in row)).encode()).digest()
        total = (total + int.from_bytes(h[:8], "little")) % (1 << 64)
    return f"{total:016x}"


def canonical_rows(arrow):
    """Every row as a list of strings, in a form SQL can reproduce: timestamps as epoch
    microseconds, decimals as plain text, binary as hex, NULL as "NULL"; sorted."""
    import pyarrow as pa

    columns = []
    for name in arrow.schema.names:
        col = arrow.column(name)
        t = col.type
        if pa.types.is_timestamp(t):
            values = [None if v is None else str(v) for v in col.cast(pa.int64()).to_pylist()]
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            values = [None if v is None else v.hex() for v in col.to_pylist()]
        elif pa.types.is_boolean(t):
            values = [None if v is None else str(v).lower() for v in col.to_pylist()]
        else:
            values = [None if v is None else str(v) for v in col.to_pylist()]
        columns.append(["NULL" if v is None else v for v in values])
    return sorted(list(r) for r in zip(*columns)) if columns else []


def keys_of(names, rows):
    if "kafka_offset" not in names:
        return []  # a reference table (no Kafka columns)
    if "topic" in names:
        t, p, o = names.index("topic"), names.index("kafka_partition"), names.index("kafka_offset")
        return sorted([r[t], r[p], r[o]] for r in rows)
    p, o = names.index("kafka_partition"), names.index("kafka_offset")
    return sorted([r[p], r[o]] for r in rows)


def pyiceberg_catalog(args):
    if args.catalog == "sql":
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(
            "streamtable",
            uri=f"sqlite:///{args.home}/catalog.db",
            warehouse=f"file://{args.home}/warehouse",
        )
    from pyiceberg.catalog.glue import GlueCatalog

    return GlueCatalog(
        "glue",
        **{
            "glue.endpoint": args.endpoint,
            "glue.region": "us-east-1",
            "glue.access-key-id": "testing",
            "glue.secret-access-key": "testing",
            "s3.endpoint": args.endpoint,
            "s3.region": "us-east-1",
            "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing",
            "s3.force-virtual-addressing": "false",
        },
    )


def read_pyiceberg(args):
    catalog = pyiceberg_catalog(args)
    table = catalog.load_table(f"{args.database}.{args.table}")
    scan = table.scan(snapshot_id=args.snapshot) if args.snapshot else table.scan()
    arrow = scan.to_arrow()
    names = arrow.schema.names
    rows = list(zip(*[arrow.column(n).to_pylist() for n in names])) if arrow.num_rows else []
    snapshots = [
        {
            "sequence": s.sequence_number,
            "snapshot_id": s.snapshot_id,
            "operation": s.summary.operation.value,
            "summary": dict(s.summary.additional_properties),
        }
        for s in sorted(table.snapshots(), key=lambda s: s.sequence_number)
    ]
    out = {
        "count": len(rows),
        "keys": keys_of(names, rows),
        "checksum": digest(rows),
        "snapshots": snapshots,
        "metadata_location": table.metadata_location,
        "columns": names,
        "format_version": table.metadata.format_version,
        "current_snapshot_id": table.metadata.current_snapshot_id,
    }
    if args.rows:
        out["rows"] = canonical_rows(arrow)
    return out


def metadata_location(args):
    if args.catalog == "sql":
        con = sqlite3.connect(f"{args.home}/catalog.db")
        row = con.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
            (args.database, args.table),
        ).fetchone()
        return row[0]
    import boto3

    glue = boto3.client("glue", endpoint_url=args.endpoint, region_name="us-east-1")
    return glue.get_table(DatabaseName=args.database, Name=args.table)["Table"]["Parameters"]["metadata_location"]


def read_duckdb(args):
    import duckdb
    import duckdb_ext

    ext = os.path.join(list(duckdb_ext.__path__)[0], "extensions")
    con = duckdb.connect(config={"extension_directory": ext, "autoinstall_known_extensions": False})
    con.execute("LOAD iceberg")
    if args.catalog == "glue":
        con.execute("LOAD httpfs")
        host = args.endpoint.split("://", 1)[1]
        con.execute(
            f"CREATE SECRET moto (TYPE s3, KEY_ID 'testing', SECRET 'testing', REGION 'us-east-1', "
            f"ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"
        )
    location = metadata_location(args)
    rel = con.execute(f"SELECT * FROM iceberg_scan('{location}')")
    names = [d[0] for d in rel.description]
    rows = rel.fetchall()
    return {
        "count": len(rows),
        "keys": keys_of(names, rows),
        "checksum": digest(rows),
        "metadata_location": location,
        "columns": names,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reader", choices=["pyiceberg", "duckdb"], required=True)
    p.add_argument("--catalog", choices=["sql", "glue"], required=True)
    p.add_argument("--home")
    p.add_argument("--endpoint")
    p.add_argument("--database", default="streamtable")
    p.add_argument("--table", required=True)
    p.add_argument("--snapshot", type=int)
    p.add_argument("--rows", action="store_true", help="include every row, canonicalised")
    args = p.parse_args()
    out = read_pyiceberg(args) if args.reader == "pyiceberg" else read_duckdb(args)
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
