"""A Kafka client nobody here wrote (confluent-kafka, librdkafka), for the broker tests.

  kafka_client.py create  --bootstrap B --topic T --partitions N [--config name=value ...]
  kafka_client.py produce --bootstrap B --plan PLAN_JSON      -> manifest JSON on stdout
  kafka_client.py consume --bootstrap B --topic T             -> records JSON on stdout
  kafka_client.py committed --bootstrap B --topic T --group G -> {partition: offset, endP: high watermark} on stdout

A plan: {"topic", "records", "partitions", "bad_every", "compression", "first": first id,
"transactional": {"id", "per_txn", "abort_every"} or null, "headers": bool,
"null_key_every", "tombstone_every", "keys": number of distinct keys,
"sizes": [value sizes in bytes of extra records, padded with a "pad" member]}.

Good values are {"id": "<topic>-<n>", "n": n, "amount": n / 2}; a bad one is cut JSON; a
tombstone has no value. The manifest lists every delivered record: topic, partition, offset,
kind (good, bad, tombstone, aborted) and n.
"""

import argparse
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create(args):
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    config = dict(c.split("=", 1) for c in args.config or [])
    fs = admin.create_topics(
        [NewTopic(args.topic, num_partitions=args.partitions, replication_factor=1, config=config)]
    )
    for f in fs.values():
        try:
            f.result(30)
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise


def record(plan, n):
    """(key, value, kind, headers) of record n of the plan."""
    topic = plan["topic"]
    keys = plan.get("keys", 97)
    key = f"k{n % keys}".encode()
    if plan.get("null_key_every") and n % plan["null_key_every"] == 0:
        key = None
    headers = None
    if plan.get("headers"):
        headers = [("trace", f"t{n}".encode()), ("trace", b"again"), ("bin", bytes([0, 255, n % 256])), ("none", None)]
    if plan.get("tombstone_every") and n % plan["tombstone_every"] == plan["tombstone_every"] - 1:
        return key, None, "tombstone", headers
    if plan.get("bad_every") and n % plan["bad_every"] == plan["bad_every"] - 1:
        return key, b'{"id": "cut', "bad", headers
    value = {"id": f"{topic}-{n}", "n": n, "amount": n / 2}
    return key, json.dumps(value).encode(), "good", headers


def produce(args):
    plan = json.loads(args.plan)
    topic, partitions = plan["topic"], plan.get("partitions", 1)
    conf = {
        "bootstrap.servers": args.bootstrap,
        "compression.type": plan.get("compression", "none"),
        "linger.ms": 5,
        "message.max.bytes": 10485760,
        "enable.idempotence": True,
    }
    txn = plan.get("transactional")
    if txn:
        conf["transactional.id"] = txn["id"]
    producer = Producer(conf)
    manifest = []

    def delivered(kind, n):
        def cb(err, msg):
            if err is not None:
                raise SystemExit(f"delivery failed: {err}")
            manifest.append({"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(), "kind": kind, "n": n})

        return cb

    first = plan.get("first", 0)
    items = [(n,) + record(plan, n) for n in range(first, first + plan["records"])]
    for i, size in enumerate(plan.get("sizes", [])):
        n = first + plan["records"] + i
        value = {"id": f"{topic}-{n}", "n": n, "amount": 0.5, "pad": ""}
        pad = size - len(json.dumps(value).encode())
        value["pad"] = "x" * max(pad, 0)
        items.append((n, f"k{n}".encode(), json.dumps(value).encode(), f"size{size}", None))

    def send(n, key, value, kind, headers):
        while True:
            try:
                extra = {"timestamp": plan["timestamp_ms"]} if plan.get("timestamp_ms") else {}
                producer.produce(topic, value=value, key=key, partition=n % partitions, headers=headers, on_delivery=delivered(kind, n), **extra)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)

    if txn:
        producer.init_transactions(30)
        per, abort_every = txn["per_txn"], txn["abort_every"]
        for t, start in enumerate(range(0, len(items), per)):
            producer.begin_transaction()
            aborting = abort_every and t % abort_every == abort_every - 1
            for n, key, value, kind, headers in items[start : start + per]:
                send(n, key, value, "aborted" if aborting else kind, headers)
            if aborting:
                producer.flush(30)
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
    else:
        for item in items:
            send(*item)
    if producer.flush(60) != 0:
        raise SystemExit("records left undelivered")
    json.dump(manifest, sys.stdout)


def consume(args):
    """Every committed record of the topic, read from the beginning (read_committed)."""
    c = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"kafka-client-{time.time_ns()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.message.max.bytes": 10485760,
        }
    )
    md = c.list_topics(args.topic, timeout=30)
    parts = sorted(md.topics[args.topic].partitions)
    c.assign([TopicPartition(args.topic, p, -2) for p in parts])
    left, out = set(parts), []
    deadline = time.time() + 120
    while left and time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            if m.error().code() == -191:  # _PARTITION_EOF
                left.discard(m.partition())
                continue
            raise SystemExit(str(m.error()))
        out.append({"partition": m.partition(), "offset": m.offset(), "null_value": m.value() is None,
                    "value_len": len(m.value() or b""), "null_key": m.key() is None})
    c.close()
    if left:
        raise SystemExit(f"partitions {sorted(left)} not read to their end")
    json.dump(out, sys.stdout)


def committed(args):
    """The consumer group's committed offsets of the topic's partitions (-1001: none)."""
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, "enable.auto.commit": False})
    md = c.list_topics(args.topic, timeout=30)
    parts = [TopicPartition(args.topic, p) for p in sorted(md.topics[args.topic].partitions)]
    out = {str(tp.partition): tp.offset for tp in c.committed(parts, timeout=30)}
    for tp in parts:
        low, high = c.get_watermark_offsets(tp, timeout=30)
        out[f"end{tp.partition}"] = high
    c.close()
    json.dump(out, sys.stdout)


def delete_records(args):
    """Deletes every record of the topic's partitions below OFFSET (--offset)."""
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    md = admin.list_topics(args.topic, timeout=30)
    parts = [TopicPartition(args.topic, p, args.offset) for p in sorted(md.topics[args.topic].partitions)]
    for f in admin.delete_records(parts).values():
        f.result(30)


def delete_topic(args):
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    for f in admin.delete_topics([args.topic]).values():
        f.result(30)
    deadline = time.time() + 30
    while args.topic in admin.list_topics(timeout=30).topics and time.time() < deadline:
        time.sleep(0.2)


def add_partitions(args):
    """Grows the topic to --partitions partitions."""
    from confluent_kafka.admin import NewPartitions

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    for f in admin.create_partitions([NewPartitions(args.topic, args.partitions)]).values():
        f.result(30)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["create", "produce", "consume", "committed", "delete-records", "delete-topic", "add-partitions"])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--config", action="append")
    p.add_argument("--plan")
    p.add_argument("--group")
    p.add_argument("--offset", type=int)
    args = p.parse_args()
    {"create": create, "produce": produce, "consume": consume, "committed": committed,
     "delete-records": delete_records, "delete-topic": delete_topic, "add-partitions": add_partitions}[args.command](args)


if __name__ == "__main__":
    main()
