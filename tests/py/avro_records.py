"""Writes Avro records with fastavro and frames them as the registries' serializers do.

  avro_records.py --schema JSON --records JSON-LIST (--confluent URL --subject S | --glue REGISTRY:SCHEMA [--zlib])

Registers the schema (Confluent REST, or the Glue Schema Registry at AWS_ENDPOINT_URL via boto3),
encodes each record with fastavro's schemaless writer and frames it:
  Confluent: magic byte 0, the schema id as 4 bytes big-endian, the body;
  Glue:      header version 3, compression 0 (none) or 5 (zlib), the schema version UUID, the body.
Prints {"id": schema id or version UUID, "values": [base64 of each framed value]}.
"""

import argparse
import base64
import io
import json
import os
import struct
import urllib.request
import uuid
import zlib

import fastavro


def register_confluent(url, subject, schema_text):
    return register_confluent_kind(url, subject, schema_text, "AVRO")


def register_confluent_kind(url, subject, schema_text, kind):
    body = {"schema": schema_text}
    if kind != "AVRO":
        body["schemaType"] = kind
    req = urllib.request.Request(
        f"{url}/subjects/{subject}/versions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["id"]


def register_glue(target, schema_text):
    return register_glue_format(target, schema_text, "AVRO")


def register_glue_format(target, schema_text, data_format):
    import boto3

    registry, name = target.split(":")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    glue = boto3.client("glue", region_name=region)
    try:
        glue.create_registry(RegistryName=registry)
    except glue.exceptions.AlreadyExistsException:
        pass
    try:
        out = glue.create_schema(RegistryId={"RegistryName": registry}, SchemaName=name,
                                 DataFormat=data_format, Compatibility="BACKWARD",
                                 SchemaDefinition=schema_text)
        return out["SchemaVersionId"]
    except glue.exceptions.AlreadyExistsException:
        out = glue.register_schema_version(
            SchemaId={"RegistryName": registry, "SchemaName": name}, SchemaDefinition=schema_text)
        return out["SchemaVersionId"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schema", required=True)
    ap.add_argument("--records", required=True)
    ap.add_argument("--confluent")
    ap.add_argument("--subject")
    ap.add_argument("--glue")
    ap.add_argument("--zlib", action="store_true")
    args = ap.parse_args()

    parsed = fastavro.parse_schema(json.loads(args.schema))
    records = json.loads(args.records)
    if args.confluent:
        schema_id = register_confluent(args.confluent, args.subject, args.schema)
        header = b"\x00" + struct.pack(">I", schema_id)
    else:
        schema_id = register_glue(args.glue, args.schema)
        header = bytes([3, 5 if args.zlib else 0]) + uuid.UUID(schema_id).bytes
    values = []
    for record in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, decode_logical(record))
        body = buf.getvalue()
        if args.glue and args.zlib:
            body = zlib.compress(body)
        values.append(base64.b64encode(header + body).decode())
    print(json.dumps({"id": schema_id, "values": values}))


def decode_logical(record):
    """JSON stand-ins for Avro logical values: {"$decimal": "12.34"}, {"$ts_ms": epoch ms}."""
    import datetime
    import decimal

    def conv(v):
        if isinstance(v, dict) and "$decimal" in v:
            return decimal.Decimal(v["$decimal"])
        if isinstance(v, dict) and "$ts_ms" in v:
            return datetime.datetime.fromtimestamp(v["$ts_ms"] / 1000, tz=datetime.timezone.utc)
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v

    return conv(record)


if __name__ == "__main__":
    main()
