"""Writes Protobuf records with Google's protobuf library and frames them as the registries'
serializers do.

  proto_records.py --proto SOURCE --message FULL.NAME --records JSON-LIST
                   (--confluent URL --subject S | --glue REGISTRY:SCHEMA [--zlib])

Compiles the .proto with grpcio-tools' protoc into Python classes, builds each record from its
JSON form (google.protobuf.json_format), serializes it, registers the .proto (Confluent REST with
schemaType PROTOBUF, or the Glue Schema Registry at AWS_ENDPOINT_URL with DataFormat PROTOBUF) and
frames each value:
  Confluent: magic 0, schema id (4 bytes big-endian), message indexes (zig-zag count and indexes
             into the file's messages; the single byte 0 for the first message), the body;
  Glue:      version 3, compression 0 or 5 (zlib), schema version UUID, then the message's index
             among all the file's messages sorted by full name (varint) and the body.
Prints {"id": ..., "values": [base64 ...]}.
"""

import argparse
import base64
import importlib
import json
import os
import struct
import sys
import tempfile
import uuid
import zlib

from google.protobuf import json_format
from grpc_tools import protoc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from avro_records import register_confluent_kind, register_glue_format  # noqa: E402


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def zigzag(n):
    return varint((n << 1) ^ (n >> 63))


def confluent_indexes(file_desc, full_name):
    def search(messages, path):
        for i, m in enumerate(messages):
            if m.full_name == full_name:
                return path + [i]
            found = search(m.nested_types, path + [i])
            if found:
                return found
        return None

    path = search(list(file_desc.message_types_by_name.values()), [])
    if path == [0]:
        return b"\x00"
    return zigzag(len(path)) + b"".join(zigzag(i) for i in path)


def glue_index(file_desc, full_name):
    names, queue = [], list(file_desc.message_types_by_name.values())
    while queue:
        m = queue.pop(0)
        names.append(m.full_name)
        queue.extend(m.nested_types)
    return sorted(names).index(full_name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto", required=True)
    ap.add_argument("--message", required=True)
    ap.add_argument("--records", required=True)
    ap.add_argument("--confluent")
    ap.add_argument("--subject")
    ap.add_argument("--glue")
    ap.add_argument("--zlib", action="store_true")
    args = ap.parse_args()

    out = tempfile.mkdtemp()
    with open(os.path.join(out, "schema.proto"), "w") as f:
        f.write(args.proto)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    if protoc.main(["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}", "schema.proto"]) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)
    module = importlib.import_module("schema_pb2")
    file_desc = module.DESCRIPTOR
    cls = None
    for part in args.message.split(".")[len(file_desc.package.split(".")) if file_desc.package else 0:]:
        cls = getattr(cls or module, part)

    if args.confluent:
        schema_id = register_confluent_kind(args.confluent, args.subject, args.proto, "PROTOBUF")
        header = b"\x00" + struct.pack(">I", schema_id) + confluent_indexes(file_desc, args.message)
    else:
        schema_id = register_glue_format(args.glue, args.proto, "PROTOBUF")
        header = bytes([3, 5 if args.zlib else 0]) + uuid.UUID(schema_id).bytes
    values = []
    for record in json.loads(args.records):
        body = json_format.ParseDict(record, cls()).SerializeToString()
        if args.glue:
            body = varint(glue_index(file_desc, args.message)) + body
            if args.zlib:
                body = zlib.compress(body)
        values.append(base64.b64encode(header + body).decode())
    print(json.dumps({"id": schema_id, "values": values}))


if __name__ == "__main__":
    main()
