"""The ingest job as a Python Lambda would do it: pyarrow + pyiceberg.

This is the comparison point for `streamtable-bench reference`: the same MSK ESM batches of
orders, decoded and appended to an Iceberg table of the same schema and partitioning in a SQLite
catalog (pyiceberg's SqlCatalog, the same kind as streamtable's embedded catalog), with the
consumer offsets checkpointed in SQLite after each append.

Two decoders, both the way a team would write them:

  simple  base64 + json.loads per record, Python values, pa.Table.from_pylist
  fast    the decoded values joined as NDJSON, pyarrow.json.read_json with an explicit schema

Usage:
  ingest.py --mode simple|fast --events DIR --home DIR [--hot-iterations N] [--check-against HOME]
  ingest.py --mode simple|fast --rss-once EVENT --home DIR

Prints one JSON object with the timings (wall and process CPU, milliseconds), the rows written
and, with --check-against, whether the table equals the one streamtable wrote in HOME.
"""

import argparse
import base64
import datetime as dt
import decimal
import glob
import io
import json
import os
import resource
import sqlite3
import statistics
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

# The orders table of infra/pipeline.toml, as streamtable lays it out: the business columns,
# then the Kafka metadata columns.
BUSINESS = [
    ("order_id", pa.string(), False),
    ("customer_id", pa.string(), True),
    ("amount", pa.decimal128(18, 2), False),
    ("currency", pa.string(), True),
    ("country", pa.string(), True),
    ("status", pa.string(), True),
    ("created_at", pa.timestamp("us"), False),
]
KAFKA = [
    ("kafka_partition", pa.int32(), False),
    ("kafka_offset", pa.int64(), False),
    ("kafka_timestamp", pa.timestamp("us"), False),
    ("kafka_key", pa.string(), True),
]
ARROW_SCHEMA = pa.schema([pa.field(n, t, nullable=o) for n, t, o in BUSINESS + KAFKA])
JSON_SCHEMA = pa.schema([pa.field(n, t) for n, t, _ in BUSINESS])


def cpu():
    return time.process_time()


def records_of(event):
    for key in sorted(event["records"]):
        yield from event["records"][key]


EPOCH = dt.datetime(1970, 1, 1)


def from_ms(ms):
    return EPOCH + dt.timedelta(milliseconds=ms)


def parse_ts(v):
    if isinstance(v, (int, float)):
        return from_ms(v)
    t = dt.datetime.fromisoformat(v)
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return t


def decode_simple(event):
    """base64 + json.loads per record; bad records are returned apart (the dead letters)."""
    rows, bad = [], []
    for r in records_of(event):
        try:
            v = json.loads(base64.b64decode(r["value"]))
            amount = decimal.Decimal(str(v["amount"]))
            rows.append(
                {
                    "order_id": v["order_id"],
                    "customer_id": v.get("customer_id"),
                    "amount": amount,
                    "currency": v.get("currency"),
                    "country": v.get("country"),
                    "status": v.get("status"),
                    "created_at": parse_ts(v["created_at"]),
                    "kafka_partition": r["partition"],
                    "kafka_offset": r["offset"],
                    "kafka_timestamp": from_ms(r["timestamp"]),
                    "kafka_key": base64.b64decode(r["key"]).decode() if r.get("key") else None,
                }
            )
        except (ValueError, KeyError, TypeError, decimal.InvalidOperation) as e:
            bad.append((r["topic"], r["partition"], r["offset"], str(e)))
    return pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), bad


def decode_fast(event):
    """Values joined as NDJSON and parsed by pyarrow's JSON reader with an explicit schema."""
    records = list(records_of(event))
    values = b"\n".join(base64.b64decode(r["value"]) for r in records)
    opts = pajson.ParseOptions(explicit_schema=JSON_SCHEMA, unexpected_field_behavior="ignore")
    body = pajson.read_json(io.BytesIO(values), parse_options=opts)
    ms = pa.array([r["timestamp"] for r in records], pa.int64())
    kafka = [
        pa.array([r["partition"] for r in records], pa.int32()),
        pa.array([r["offset"] for r in records], pa.int64()),
        pc.multiply(ms, 1000).cast(pa.timestamp("us")),
        pa.array([base64.b64decode(r["key"]) if r.get("key") else None for r in records], pa.binary()).cast(
            pa.string()
        ),
    ]
    table = pa.Table.from_arrays(list(body.columns) + kafka, schema=ARROW_SCHEMA)
    return table, []


DECODERS = {"simple": decode_simple, "fast": decode_fast}


def catalog(home):
    from pyiceberg.catalog.sql import SqlCatalog

    os.makedirs(f"{home}/warehouse", exist_ok=True)
    return SqlCatalog("streamtable", uri=f"sqlite:///{home}/catalog.db", warehouse=f"file://{home}/warehouse")


def orders_table(cat):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform
    from pyiceberg.types import DecimalType, IntegerType, LongType, NestedField, StringType, TimestampType

    iceberg_type = {
        pa.string(): StringType(),
        pa.decimal128(18, 2): DecimalType(18, 2),
        pa.timestamp("us"): TimestampType(),
        pa.int32(): IntegerType(),
        pa.int64(): LongType(),
    }
    # Field ids 1.. in column order, as streamtable assigns them.
    schema = Schema(
        *[
            NestedField(i + 1, f.name, iceberg_type[f.type], required=not f.nullable)
            for i, f in enumerate(ARROW_SCHEMA)
        ]
    )
    spec = PartitionSpec(PartitionField(source_id=7, field_id=1000, transform=DayTransform(), name="created_at_day"))
    try:
        cat.create_namespace("streamtable")
    except Exception:
        pass
    return cat.create_table_if_not_exists(
        "streamtable.orders",
        schema=schema,
        partition_spec=spec,
        properties={"write.parquet.compression-codec": "zstd", "write.parquet.compression-level": "1"},
    )


class Checkpoints:
    """Next offset per (topic, partition), advanced after each append."""

    def __init__(self, path):
        self.db = sqlite3.connect(path)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS checkpoints (topic TEXT, partition INTEGER, next_offset INTEGER, "
            "PRIMARY KEY (topic, partition))"
        )

    def advance(self, event):
        last = {}
        for r in records_of(event):
            key = (r["topic"], r["partition"])
            last[key] = max(last.get(key, -1), r["offset"])
        with self.db:
            self.db.executemany(
                "INSERT INTO checkpoints VALUES (?, ?, ?) ON CONFLICT (topic, partition) DO UPDATE SET "
                "next_offset = max(next_offset, excluded.next_offset)",
                [(t, p, o + 1) for (t, p), o in last.items()],
            )


def handler(event_text, decode, table, checkpoints):
    """One Lambda invocation: parse the event, decode, append (write + commit), checkpoint."""
    event = json.loads(event_text)
    arrow, bad = decode(event)
    if arrow.num_rows:
        table.append(arrow)
    checkpoints.advance(event)
    return arrow.num_rows, len(bad)


def hot_path(event_text, decode):
    """Event JSON to Parquet bytes in memory (ZSTD level 1), no catalog: the decode-to-Parquet core."""
    arrow, _ = decode(json.loads(event_text))
    sink = pa.BufferOutputStream()
    pq.write_table(arrow, sink, compression="zstd", compression_level=1)
    return arrow.num_rows, sink.getvalue().size


def same_table(mine, theirs):
    """Row-for-row equality after sorting both by their Kafka coordinates."""
    names = ARROW_SCHEMA.names
    keys = [("kafka_partition", "ascending"), ("kafka_offset", "ascending")]
    a = mine.select(names).sort_by(keys)
    b = theirs.select(names).sort_by(keys)
    if a.num_rows != b.num_rows:
        return False, f"{a.num_rows} rows here, {b.num_rows} in streamtable's table"
    for n in names:
        x, y = a.column(n).combine_chunks(), b.column(n).combine_chunks()
        if x.type != y.type:
            return False, f"column {n}: {x.type} here, {y.type} in streamtable's table"
        if not x.equals(y):
            return False, f"column {n} differs"
    return True, f"{a.num_rows} rows equal"


def run(args):
    decode = DECODERS[args.mode]
    files = sorted(glob.glob(os.path.join(args.events, "*.json")))
    if not files:
        sys.exit(f"no *.json events in {args.events}")
    first = open(files[0]).read()
    out = {"mode": args.mode, "batches": len(files), "event_mb": len(first) / 1e6}

    hot_wall, hot_cpu = [], []
    for _ in range(args.hot_iterations):
        w, c = time.perf_counter(), cpu()
        rows, size = hot_path(first, decode)
        hot_cpu.append((cpu() - c) * 1e3)
        hot_wall.append((time.perf_counter() - w) * 1e3)
    out["hot"] = {"wall_ms": statistics.median(hot_wall), "cpu_ms": statistics.median(hot_cpu), "rows": rows}

    cat = catalog(args.home)
    table = orders_table(cat)
    checkpoints = Checkpoints(f"{args.home}/checkpoints.db")
    batch_wall, batch_cpu, rows, bad = [], [], 0, 0
    for f in files:
        text = open(f).read()
        w, c = time.perf_counter(), cpu()
        n, b = handler(text, decode, table, checkpoints)
        batch_cpu.append((cpu() - c) * 1e3)
        batch_wall.append((time.perf_counter() - w) * 1e3)
        rows, bad = rows + n, bad + b
    out["batch"] = {"wall_ms": statistics.median(batch_wall), "cpu_ms": statistics.median(batch_cpu)}
    out["all"] = {"wall_s": sum(batch_wall) / 1e3, "cpu_s": sum(batch_cpu) / 1e3, "rows": rows, "bad": bad}

    if args.check_against:
        mine = cat.load_table("streamtable.orders").scan().to_arrow()
        theirs = catalog_of(args.check_against).load_table("streamtable.orders").scan().to_arrow()
        equal, why = same_table(mine, theirs)
        out["check"] = {"equal": equal, "detail": why}
    return out


def catalog_of(home):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("streamtable", uri=f"sqlite:///{home}/catalog.db", warehouse=f"file://{home}/warehouse")


def rss_once(args):
    """A fresh process handling one batch end to end: its peak RSS."""
    decode = DECODERS[args.mode]
    cat = catalog(args.home)
    table = orders_table(cat)
    checkpoints = Checkpoints(f"{args.home}/checkpoints.db")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    text = open(args.rss_once).read()
    rows, _ = handler(text, decode, table, checkpoints)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": args.mode, "rows": rows, "rss_mb": peak, "rss_before_mb": before}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=sorted(DECODERS), required=True)
    p.add_argument("--events", help="directory of ESM event files (*.json), one batch each")
    p.add_argument("--home", required=True, help="directory for the catalog, warehouse and checkpoints")
    p.add_argument("--hot-iterations", type=int, default=9)
    p.add_argument("--check-against", help="streamtable's embedded home to compare the table with")
    p.add_argument("--rss-once", help="one event file: handle it in this fresh process, report peak RSS")
    args = p.parse_args()
    if args.rss_once:
        out = rss_once(args)
    elif args.events:
        out = run(args)
    else:
        p.error("give --events DIR or --rss-once FILE")
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
