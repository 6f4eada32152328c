"""streamtable against Apache Flink on the same window query and the same events.

The query is `orders_per_minute` of infra/pipeline.toml (1-minute tumbling windows on
created_at by country: count and sum of amount; watermark created_at - 30 s). The events are
generated here once, in created_at order with up to ±10 s of disorder, and written twice: as
MSK ESM event files of 10,000 records over 4 partitions (what the ingest Lambda receives) and as
JSON lines (Flink's filesystem source). Same JSON values in both.

- streamtable: `streamtable ingest` on the event files (orders not landed, only the windowed
  table; land = false), then `streamtable scheduled` (the commit that makes the rows queryable).
- Flink: job.py on a local mini-cluster (PyFlink, Java 17), the `print` sink.

For each side: wall time from process start to result, CPU seconds of the whole process tree
(sampled with psutil, JVM included), events per CPU-second. Then the results are compared on
every window streamtable closed (Flink closes all at the end of its bounded input).

Usage:
  compare.py --streamtable BIN --flink-python PY [--orders N] [--work DIR]
"""

import argparse
import base64
import csv
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from decimal import Decimal

import psutil

COUNTRIES = ["US", "DE", "GB", "FR", "CA", "BR", "IN", "JP"]
WEIGHTS = [30, 15, 12, 10, 6, 9, 10, 8]
PARTITIONS = 4
BATCH = 10_000
BASE_MS = 1_795_946_400_000  # 2026-11-29T10:00:00Z

SPEC = """
[settings]

[[tables]]
name = "orders"
topic = "orders"
land = false
watermark = "created_at - INTERVAL '30' SECOND"
columns = [
  { name = "order_id",    type = "string",        required = true },
  { name = "customer_id", type = "string" },
  { name = "amount",      type = "decimal(18,2)", required = true },
  { name = "currency",    type = "string" },
  { name = "country",     type = "string" },
  { name = "status",      type = "string" },
  { name = "created_at",  type = "timestamp",     required = true },
]

[[derived_tables]]
name = "orders_per_minute"
partition_by = ["day(window_start)"]
sql = '''
SELECT window_start, window_end, country, COUNT(*) AS orders, SUM(amount) AS revenue
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, country
'''
"""


def iso(ms: int, zone: str) -> str:
    t = time.gmtime(ms // 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{ms % 1000:03d}{zone}"


def generate(n: int, work: str) -> tuple[list[str], str]:
    rng = random.Random(42)
    step = max(3_600_000 // n, 1)  # an hour of events
    events, lines = [], []
    offsets = [0] * PARTITIONS
    batch: list[dict] = []
    for i in range(n):
        at = BASE_MS + i * step + rng.randrange(20_000) - 10_000
        cents = 500 + rng.randrange(49_500)
        country = rng.choices(COUNTRIES, WEIGHTS)[0]
        value = {
            "order_id": f"ord-{i:010d}",
            "customer_id": f"cus-{rng.randrange(100_000):06d}",
            "amount": float(f"{cents // 100}.{cents % 100:02d}"),
            "currency": "EUR",
            "country": country,
            "status": "paid",
        }
        lines.append(json.dumps({**value, "created_at": iso(at, "")}))
        raw = json.dumps({**value, "created_at": iso(at, "Z")}).encode()
        p = i % PARTITIONS
        batch.append(
            {
                "topic": "orders",
                "partition": p,
                "offset": offsets[p],
                "timestamp": at + 250,
                "timestampType": "CREATE_TIME",
                "key": base64.b64encode(value["order_id"].encode()).decode(),
                "value": base64.b64encode(raw).decode(),
                "headers": [],
            }
        )
        offsets[p] += 1
        if len(batch) == BATCH or i == n - 1:
            records: dict[str, list] = {}
            for r in batch:
                records.setdefault(f"orders-{r['partition']}", []).append(r)
            path = os.path.join(work, f"event-{len(events):05d}.json")
            with open(path, "w") as f:
                json.dump(
                    {
                        "eventSource": "aws:kafka",
                        "eventSourceArn": "arn:aws:kafka:us-east-1:123456789012:cluster/bench/x",
                        "bootstrapServers": "b-1:9098",
                        "records": records,
                    },
                    f,
                )
            events.append(path)
            batch = []
    jsonl = os.path.join(work, "orders.jsonl")
    with open(jsonl, "w") as f:
        f.write("\n".join(lines) + "\n")
    return events, jsonl


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds of the process tree (sampled every 50 ms), stdout."""
    out = tempfile.TemporaryFile()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env)
    ps = psutil.Process(proc.pid)
    cpu: dict[int, float] = {}
    while proc.poll() is None:
        try:
            for p in [ps, *ps.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    cpu[p.pid] = max(cpu.get(p.pid, 0.0), t.user + t.system)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - started
    # The direct child's own CPU is exact once waited for.
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({proc.returncode}):\n{err[-3000:]}")
    out.seek(0)
    return wall, sum(cpu.values()), out.read().decode(errors="replace")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streamtable", required=True)
    ap.add_argument("--flink-python", required=True)
    ap.add_argument("--orders", type=int, default=200_000)
    ap.add_argument("--work")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="st-flink-")
    os.makedirs(work, exist_ok=True)
    events, jsonl = generate(args.orders, work)
    spec = os.path.join(work, "pipeline.toml")
    with open(spec, "w") as f:
        f.write(SPEC)

    home = os.path.join(work, "home")
    shutil.rmtree(home, ignore_errors=True)
    st = [args.streamtable, "--pipeline", spec, "--home", home]
    env = {**os.environ, "RUST_LOG": "warn", "NO_COLOR": "1"}
    w1, c1, _ = run_measured(st + ["ingest", *[a for e in events for a in ("--event", e)]], env)
    w2, c2, _ = run_measured(st + ["scheduled"], env)
    st_wall, st_cpu = w1 + w2, c1 + c2
    _, _, out = run_measured(
        st
        + [
            "query",
            "--format",
            "csv",
            "SELECT window_start, country, orders, revenue FROM orders_per_minute",
        ],
        env,
    )
    ours = {}
    for row in csv.DictReader(io.StringIO(out)):
        ours[(row["window_start"][:19], row["country"])] = (int(row["orders"]), Decimal(row["revenue"]))

    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "job.py")
    fl_wall, fl_cpu, out = run_measured([args.flink_python, job, jsonl])
    theirs = {}
    for line in out.splitlines():
        # `<subtask>> +I[2026-11-29T09:59, 2026-11-29T10:00, BR, 13, 2166.48]`
        at = line.find("+I[")
        if at < 0:
            continue
        ws, _we, country, n, rev = [x.strip() for x in line[at + 3 : line.rindex("]")].split(",")]
        ws = ws.replace(" ", "T")
        ws = ws + ":00" if len(ws) == 16 else ws[:19]
        theirs[(ws, country)] = (int(n), Decimal(rev))

    same = sum(1 for k, v in ours.items() if theirs.get(k) == v)
    result = {
        "orders": args.orders,
        "streamtable": {
            "wall_s": round(st_wall, 2),
            "cpu_s": round(st_cpu, 2),
            "events_per_cpu_s": round(args.orders / st_cpu) if st_cpu else None,
            "ingest_wall_s": round(w1, 2),
            "commit_wall_s": round(w2, 2),
            "windows": len(ours),
        },
        "flink": {
            "wall_s": round(fl_wall, 2),
            "cpu_s": round(fl_cpu, 2),
            "events_per_cpu_s": round(args.orders / fl_cpu) if fl_cpu else None,
            "windows": len(theirs),
        },
        "windows_compared": len(ours),
        "windows_equal": same,
    }
    print(json.dumps(result, indent=2))
    if same != len(ours):
        sys.exit("the two results differ on windows streamtable closed")


if __name__ == "__main__":
    main()
