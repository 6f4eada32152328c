"""Runs SQL in a Trino server (scripts/trino-local) through Trino's own Python client and prints
the answers as JSON, in the canonical form of read_table.py --rows.

  trino_query.py --trino URL --schema DB [--catalog iceberg] SQL [SQL ...]

Output: one JSON object per statement, in a list: {"columns": [names], "types": [Trino types],
"rows": [[text, ...]]} in the order Trino returned them, or {"error": message} when Trino
refused the statement. Canonical values: NULL as "NULL", timestamps as epoch microseconds,
varbinary as hex, booleans as true/false, decimals as plain text, doubles as Python prints
them; rows and arrays as Python prints the dicts and lists pyarrow gives for them. The session
runs in UTC, as Athena's does.
"""

import argparse
import datetime
import decimal
import json
import sys
import urllib.parse

import trino

EPOCH = datetime.datetime(1970, 1, 1)
EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
MICRO = datetime.timedelta(microseconds=1)


def nested(v):
    """A nested value as pyarrow's to_pylist gives it: rows as dicts, arrays as lists."""
    if isinstance(v, tuple) and hasattr(v, "_names"):
        return {n: nested(x) for n, x in zip(v._names, v)}
    if isinstance(v, (list, tuple)):
        return [nested(x) for x in v]
    if isinstance(v, dict):
        return [(nested(k), nested(x)) for k, x in v.items()]
    return v


def canonical(v):
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            return str((v - EPOCH) // MICRO)
        return str((v - EPOCH_UTC) // MICRO)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (list, tuple, dict)):
        return str(nested(v))
    return str(v)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trino", required=True)
    p.add_argument("--catalog", default="iceberg")
    p.add_argument("--schema", required=True)
    p.add_argument("sql", nargs="+")
    args = p.parse_args()
    url = urllib.parse.urlparse(args.trino)
    conn = trino.dbapi.connect(
        host=url.hostname,
        port=url.port,
        http_scheme=url.scheme,
        user="streamtable",
        catalog=args.catalog,
        schema=args.schema,
        timezone="UTC",
    )
    out = []
    for sql in args.sql:
        cur = conn.cursor()
        try:
            cur.execute(sql)
            rows = cur.fetchall()
        except trino.exceptions.TrinoQueryError as e:
            out.append({"error": e.message, "error_name": e.error_name})
            continue
        # A statement without a result set (DDL) has no description.
        described = cur.description or []
        out.append(
            {
                "columns": [d[0] for d in described],
                "types": [d[1] for d in described],
                "rows": [[canonical(v) for v in r] for r in rows],
            }
        )
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
