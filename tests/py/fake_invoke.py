"""A stand-in for a Lambda Invoke endpoint (`cargo lambda watch`) for `streamtable run --invoke`:
saves each request body as DIR/NNNN.json and fails the first FAILS invocations the way Lambda's
Invoke API marks a function error (X-Amz-Function-Error), then answers a summary.

  fake_invoke.py PORT DIR FAILS
"""

import http.server
import json
import os
import sys

port, out, fails = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
count = 0


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global count
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open(os.path.join(out, f"{count:04d}.json"), "wb") as f:
            f.write(body)
        count += 1
        if count <= fails:
            answer = json.dumps({"errorType": "Error", "errorMessage": "injected failure"}).encode()
            self.send_response(200)
            self.send_header("X-Amz-Function-Error", "Unhandled")
        else:
            records = sum(len(v) for v in json.loads(body)["records"].values())
            answer = json.dumps({"records": records, "accepted": records}).encode()
            self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
