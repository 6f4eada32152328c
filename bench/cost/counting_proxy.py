"""A counting HTTP proxy in front of a moto server: what each request would be billed on AWS.

Every request is forwarded unchanged to the upstream moto server and counted by service and
billing class:
  - S3: PUT-class (PUT, POST, COPY, LIST), GET-class (GET, HEAD), DELETE (free); and the
    PUTs and bytes of processing state (objects under `_state/`);
  - DynamoDB: read and write request units, computed as DynamoDB bills them from the sizes of
    the items involved (the proxy reads each written item before and after the request,
    directly from moto, uncounted): 1 WRU per KB written (the larger of the item before and
    after), twice that inside a transaction; 1 RRU per 4 KB read strongly consistently, half
    for an eventually consistent read, twice for a transactional one; at least one unit per
    item;
  - Glue: requests by action.

Control: GET /_counts (JSON); POST /_counts returns them and starts again from zero.

Usage: python bench/cost/counting_proxy.py LISTEN_PORT UPSTREAM_URL   (prints "ready")
"""

import base64
import http.client
import json
import math
import os
import sys
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import boto3
from botocore.config import Config

LOCK = threading.Lock()
COUNTS = defaultdict(float)
# DynamoDB requests are serialised so that "before" and "after" belong to one request.
DDB_LOCK = threading.Lock()


def av_size(av):
    (t, v), = av.items()
    if t == "S":
        return len(v.encode())
    if t == "N":
        digits = v.lstrip("-").replace(".", "").lstrip("0") or "0"
        return math.ceil(len(digits.rstrip("0") or "0") / 2) + 1
    if t == "B":
        return len(base64.b64decode(v)) if isinstance(v, str) else len(v)
    if t in ("BOOL", "NULL"):
        return 1
    if t == "M":
        return 3 + sum(len(k.encode()) + av_size(x) + 1 for k, x in v.items())
    if t == "L":
        return 3 + sum(av_size(x) + 1 for x in v)
    if t == "SS":
        return sum(len(x.encode()) for x in v)
    if t == "NS":
        return sum(av_size({"N": x}) for x in v)
    if t == "BS":
        return sum(len(base64.b64decode(x)) for x in v)
    return 0


def item_size(item):
    if not item:
        return 0
    return sum(len(k.encode()) + av_size(v) for k, v in item.items())


class Dynamo:
    def __init__(self, upstream):
        self.client = boto3.client(
            "dynamodb",
            endpoint_url=upstream,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"max_attempts": 1}),
        )

    def get(self, table, key):
        try:
            raw = self.client.get_item(TableName=table, Key=key, ConsistentRead=True)
        except Exception:
            return None
        return raw.get("Item")


def key_of(table_keys, item):
    return {k: item[k] for k in table_keys if k in item}


def wru(size, transactional=False):
    return max(1, math.ceil(size / 1024)) * (2 if transactional else 1)


def rru(size, consistent=True, transactional=False):
    units = max(1, math.ceil(size / 4096))
    if transactional:
        return units * 2
    return units if consistent else units / 2


# S3 requests by object kind and DynamoDB write units by item kind, for
# `STREAMTABLE_COST_BREAKDOWN` (not billed separately).
KINDS = defaultdict(int)


def kind_of(path, query):
    """What an S3 request touches: table metadata, manifest list, manifest, data file,
    processing state, pending file list, or other; `+part` for multipart requests."""
    name = path.rsplit("/", 1)[-1]
    if "_state/" in path and ".db/" not in path.split("_state/")[0]:
        kind = "state"
    elif "/_pending/" in path:
        kind = "pending"
    elif name.endswith(".metadata.json") or name == "version-hint.text":
        kind = "metadata"
    elif name.startswith("snap-") and name.endswith(".avro"):
        kind = "manifest-list"
    elif name.endswith(".avro"):
        kind = "manifest"
    elif name.endswith(".parquet"):
        kind = "data"
    elif not name or "list-type" in query:
        kind = "list"
    else:
        kind = "other"
    if "uploadId" in query or "uploads" in query:
        kind += "+part"
    return kind


def item_kind(key):
    """What a DynamoDB item holds, for the breakdown: its partition key up to the first `#`
    (`checkpoints`, `state`, `pending`, `lock`...)."""
    pk = key.get("pk", {}).get("S") or next(
        (v.get("S", "") for v in key.values() if isinstance(v, dict) and "S" in v), ""
    )
    return pk.split("#", 1)[0] or "?"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = None
    dynamo = None

    def log_message(self, *_):
        pass

    def _forward(self, body):
        u = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect")
        }
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        out = (resp.status, resp.getheaders(), data)
        conn.close()
        return out

    def _reply(self, status, headers, data):
        self.send_response(status)
        head = self.command == "HEAD"
        for k, v in headers:
            if k.lower() in ("transfer-encoding", "connection"):
                continue
            if k.lower() == "content-length" and not head:
                continue
            self.send_header(k, v)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _count(self, name, value=1):
        with LOCK:
            COUNTS[name] += value

    def handle_any(self):
        body = self._body()
        if self.path.startswith("/_counts"):
            with LOCK:
                data = json.dumps(dict(COUNTS), sort_keys=True).encode()
                dump = os.environ.get("STREAMTABLE_COST_BREAKDOWN")
                if dump:
                    # Whenever the counts are read (a phase ends), S3 requests by object kind
                    # since the last reset (see `kind_of`).
                    with open(dump, "a") as f:
                        f.write(json.dumps(dict(KINDS), sort_keys=True) + "\n")
                if self.command == "POST":
                    COUNTS.clear()
                    KINDS.clear()
            return self._reply(200, [("Content-Type", "application/json")], data)
        target = self.headers.get("X-Amz-Target", "")
        if target.startswith("DynamoDB_"):
            return self._dynamo(target.split(".", 1)[1], body)
        if target.startswith("AWSGlue."):
            self._count("glue_requests")
            self._count("glue." + target.split(".", 1)[1])
            with LOCK:
                KINDS["Glue " + target.split(".", 1)[1]] += 1
            return self._reply(*self._forward(body))
        status, headers, data = self._forward(body)
        self._s3(status, len(body))
        return self._reply(status, headers, data)

    def _s3(self, status, size):
        path, _, query = self.path.partition("?")
        parts = [p for p in path.split("/") if p]
        with LOCK:
            KINDS[f"{self.command} {kind_of(path, query)}"] += 1
        if self.command in ("PUT", "POST"):
            if len(parts) >= 2:
                self._count("s3_put")
                # Processing state (partition state files, join runs and backlogs).
                # (not a table called `_state`: tables are under `{namespace}.db/`)
                at = parts.index("_state") if "_state" in parts else -1
                if at > 0 and not any(p.endswith(".db") for p in parts[:at]):
                    self._count("s3_state_put")
                    self._count("s3_state_bytes", size)
        elif self.command in ("GET", "HEAD"):
            if len(parts) <= 1 or "list-type" in query:
                self._count("s3_list")
            else:
                self._count("s3_get")
        elif self.command == "DELETE":
            self._count("s3_delete")

    def _dynamo(self, action, body):
        req = json.loads(body or b"{}")
        with DDB_LOCK:
            keys = {}

            def table_keys(table):
                if table not in keys:
                    desc = self.dynamo.client.describe_table(TableName=table)
                    keys[table] = [k["AttributeName"] for k in desc["Table"]["KeySchema"]]
                return keys[table]

            writes = []  # (table, key, transactional)
            if action in ("PutItem", "UpdateItem", "DeleteItem"):
                t = req["TableName"]
                k = req.get("Key") or key_of(table_keys(t), req.get("Item", {}))
                writes.append((t, k, False))
            elif action == "TransactWriteItems":
                for ti in req.get("TransactItems", []):
                    (kind, op), = ti.items()
                    t = op["TableName"]
                    k = op.get("Key") or key_of(table_keys(t), op.get("Item", {}))
                    writes.append((t, k, True))
            elif action == "BatchWriteItem":
                for t, reqs in req.get("RequestItems", {}).items():
                    for r in reqs:
                        if "PutRequest" in r:
                            writes.append((t, key_of(table_keys(t), r["PutRequest"]["Item"]), False))
                        else:
                            writes.append((t, r["DeleteRequest"]["Key"], False))
            before = [item_size(self.dynamo.get(t, k)) for t, k, _ in writes]
            status, headers, data = self._forward(body)
            self._count("dynamodb_requests")
            self._count("dynamodb." + action)
            if status == 200 or action == "TransactWriteItems":
                after = [item_size(self.dynamo.get(t, k)) for t, k, _ in writes]
                unprocessed = set()
                if action == "BatchWriteItem" and status == 200:
                    for t, reqs in json.loads(data).get("UnprocessedItems", {}).items():
                        unprocessed.add(t)  # coarse: none expected against moto
                for (t, k, tx), b, a in zip(writes, before, after):
                    size = max(b, a)
                    if action == "TransactWriteItems" and status != 200:
                        size = b  # a cancelled transaction is still billed
                    self._count("dynamodb_wru", wru(size, tx))
                    with LOCK:
                        KINDS[f"WRU {item_kind(k)}"] += wru(size, tx)
                        # Item sizes by kind: how far each is from the next billed kilobyte.
                        KINDS[f"writes {item_kind(k)}"] += 1
                        KINDS[f"bytes {item_kind(k)}"] += size
                        KINDS[f"max bytes {item_kind(k)}"] = max(
                            KINDS[f"max bytes {item_kind(k)}"], size
                        )
            if status == 200:
                self._reads(action, req, json.loads(data))
            else:
                self._count("dynamodb_errors")
        return self._reply(status, headers, data)

    def _reads(self, action, req, resp):
        if action == "GetItem":
            self._count("dynamodb_rru", rru(item_size(resp.get("Item")), req.get("ConsistentRead", False)))
        elif action == "BatchGetItem":
            found = defaultdict(list)
            for t, items in resp.get("Responses", {}).items():
                found[t].extend(items)
            for t, ka in req.get("RequestItems", {}).items():
                consistent = ka.get("ConsistentRead", False)
                sizes = [item_size(i) for i in found.get(t, [])]
                missing = len(ka.get("Keys", [])) - len(sizes)
                for s in sizes:
                    self._count("dynamodb_rru", rru(s, consistent))
                self._count("dynamodb_rru", rru(0, consistent) * max(0, missing))
        elif action in ("Query", "Scan"):
            total = sum(item_size(i) for i in resp.get("Items", []))
            self._count("dynamodb_rru", rru(total, req.get("ConsistentRead", False)))
        elif action == "TransactGetItems":
            for r in resp.get("Responses", []):
                self._count("dynamodb_rru", rru(item_size(r.get("Item")), transactional=True))

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


def main():
    port, upstream = int(sys.argv[1]), sys.argv[2]
    Handler.upstream = upstream
    Handler.dynamo = Dynamo(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
