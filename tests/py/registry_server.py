"""A Confluent-compatible schema registry stand-in for the tests, on 127.0.0.1.

  registry_server.py PORT

Implements the REST calls streamtable and the tests use:
  POST /subjects/{subject}/versions   {"schema": "...", "schemaType"?}  -> {"id": N}
  GET  /schemas/ids/{id}                                                  -> {"schema": "...", "schemaType"?}
  GET  /subjects/{subject}/versions/latest                                -> {"subject", "version", "id", "schema"}
Registering the same schema text under a subject again returns its existing id, as the
registry does. For fault tests, POST /admin/fail {"id": N, "status": S, "count": C} makes the next
C lookups of schema id N answer with HTTP status S. Unknown ids and subjects answer 404 with Confluent's error codes (40403, 40401).
Basic auth is checked when REGISTRY_AUTH=key:secret is set (401 otherwise).
"""

import base64
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
SCHEMAS = {}  # id -> (text, type)
SUBJECTS = {}  # subject -> [id, ...]
FAULTS = {}  # id -> [status, remaining count]
AUTH = os.environ.get("REGISTRY_AUTH")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        if not AUTH:
            return True
        want = "Basic " + base64.b64encode(AUTH.encode()).decode()
        if self.headers.get("Authorization") == want:
            return True
        self.reply(401, {"error_code": 401, "message": "Unauthorized"})
        return False

    def do_GET(self):
        if not self.authorized():
            return
        parts = self.path.strip("/").split("/")
        with LOCK:
            if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
                fault = FAULTS.get(int(parts[2]))
                if fault and fault[1] > 0:
                    fault[1] -= 1
                    return self.reply(fault[0], {"error_code": fault[0], "message": "injected"})
                found = SCHEMAS.get(int(parts[2]))
                if found is None:
                    return self.reply(404, {"error_code": 40403, "message": "Schema not found"})
                text, kind = found
                body = {"schema": text}
                if kind != "AVRO":
                    body["schemaType"] = kind
                return self.reply(200, body)
            if len(parts) == 4 and parts[0] == "subjects" and parts[2:] == ["versions", "latest"]:
                ids = SUBJECTS.get(parts[1])
                if not ids:
                    return self.reply(404, {"error_code": 40401, "message": "Subject not found"})
                return self.reply(200, {"subject": parts[1], "version": len(ids), "id": ids[-1],
                                        "schema": SCHEMAS[ids[-1]][0]})
        self.reply(404, {"error_code": 404, "message": "Not found"})

    def do_POST(self):
        if not self.authorized():
            return
        parts = self.path.strip("/").split("/")
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if parts == ["admin", "fail"]:
            with LOCK:
                FAULTS[int(body["id"])] = [int(body["status"]), int(body["count"])]
            return self.reply(200, {})
        if len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
            text, kind = body["schema"], body.get("schemaType", "AVRO")
            with LOCK:
                for i, (t, _) in SCHEMAS.items():
                    if t == text and i in SUBJECTS.get(parts[1], []):
                        return self.reply(200, {"id": i})
                new_id = len(SCHEMAS) + 1
                SCHEMAS[new_id] = (text, kind)
                SUBJECTS.setdefault(parts[1], []).append(new_id)
            return self.reply(200, {"id": new_id})
        self.reply(404, {"error_code": 404, "message": "Not found"})


if __name__ == "__main__":
    # Stopped by the test script with SIGTERM: a clean exit, not a death by signal.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.serve_forever()
