"""Small-file compaction the way a Python job would do it: pyarrow read-and-rewrite.

pyiceberg 0.12 has no data-file rewrite of its own, so this reads every data file of the table
(found through pyiceberg's scan planning, as such a job would) with pyarrow and writes them back
as files of about the target size with the same settings streamtable uses (ZSTD level 1, row
groups of 262,144 rows). The comparison point for `streamtable-bench reference`.

Usage: compact.py --home DIR [--table orders] [--target-mb 128] --out DIR

Prints one JSON object: input and output files, bytes and rows, wall and CPU seconds, peak RSS.
"""

import argparse
import json
import os
import resource
import sys
import time

import pyarrow.parquet as pq

ROW_GROUP_ROWS = 262_144


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--home", required=True, help="streamtable's embedded home (catalog.db, warehouse/)")
    p.add_argument("--table", default="orders")
    p.add_argument("--target-mb", type=int, default=128)
    p.add_argument("--out", required=True, help="directory for the rewritten files")
    args = p.parse_args()

    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog(
        "streamtable", uri=f"sqlite:///{args.home}/catalog.db", warehouse=f"file://{args.home}/warehouse"
    )
    table = cat.load_table(f"streamtable.{args.table}")
    paths = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    if not paths:
        sys.exit(f"table {args.table} in {args.home} has no data files")
    os.makedirs(args.out, exist_ok=True)

    wall, cpu = time.perf_counter(), time.process_time()
    target = args.target_mb * 1024 * 1024
    writer, written, outputs = None, 0, []
    rows_in = bytes_in = 0
    for path in paths:
        data = pq.read_table(path)
        size = os.path.getsize(path)
        if writer is None or written + size > target:
            if writer is not None:
                writer.close()
            outputs.append(os.path.join(args.out, f"compacted-{len(outputs):05}.parquet"))
            writer = pq.ParquetWriter(outputs[-1], data.schema, compression="zstd", compression_level=1)
            written = 0
        writer.write_table(data, row_group_size=ROW_GROUP_ROWS)
        written += size
        rows_in += data.num_rows
        bytes_in += size
    writer.close()
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall

    rows_out = sum(pq.ParquetFile(o).metadata.num_rows for o in outputs)
    json.dump(
        {
            "input_files": len(paths),
            "input_mb": bytes_in / 1048576,
            "rows_in": rows_in,
            "output_files": len(outputs),
            "output_mb": sum(os.path.getsize(o) for o in outputs) / 1048576,
            "rows_out": rows_out,
            "wall_s": wall,
            "cpu_s": cpu,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
