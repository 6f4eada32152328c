"""The moto server the tests run against, made to keep two promises AWS keeps and moto does not.

1. Glue `UpdateTable` with a `VersionId` fails with `ConcurrentModificationException` when the
   table changed since that version (moto ignores `VersionId`).
2. DynamoDB requests are linearizable: moto runs `TransactWriteItems` without a lock (its
   rollback deep-copies whole tables), so two concurrent conditional transactions can both pass.
   Serialising DynamoDB requests restores what real DynamoDB guarantees.

It also injects one fault real networks cause: a Glue request that succeeds but whose answer is
lost (the client sees HTTP 500 and its SDK sends the request again). Tests arm it per database:
  POST /_streamtable/lose-answer?action=UpdateTable&database=DB&count=N

Usage: python tests/py/moto_server.py PORT   (prints "ready" once it accepts requests)
"""

import signal
import sys
import threading
from urllib.parse import parse_qs

from werkzeug.serving import make_server
from werkzeug.wrappers import Response

from moto.dynamodb.responses import DynamoHandler
from moto.glue.exceptions import GlueClientError
from moto.glue.responses import GlueResponse
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


class ConcurrentModificationException(GlueClientError):
    def __init__(self, msg: str):
        super().__init__("ConcurrentModificationException", msg)


class AnswerLost(GlueClientError):
    code = 500

    def __init__(self):
        super().__init__("InternalServiceException", "injected: the request was applied, its answer lost")


_glue_lock = threading.Lock()
_lose_answers = {}  # (action, database) -> how many more answers to lose


def _maybe_lose_answer(action, database):
    key = (action, database)
    if _lose_answers.get(key, 0) > 0:
        _lose_answers[key] -= 1
        raise AnswerLost()


_original_update_table = GlueResponse.update_table
_original_create_table = GlueResponse.create_table


def _strict_update_table(self):
    version = self.parameters.get("VersionId")
    database = self.parameters.get("DatabaseName")
    with _glue_lock:
        if version is not None:
            name = self.parameters.get("TableInput", {}).get("Name")
            table = self.glue_backend.get_table(database, name)
            if str(table._current_version) != str(version):
                raise ConcurrentModificationException(
                    f"Table {database}.{name} is at version {table._current_version}, not {version}"
                )
        out = _original_update_table(self)
        _maybe_lose_answer("UpdateTable", database)
        return out


def _create_table_maybe_losing_answer(self):
    with _glue_lock:
        out = _original_create_table(self)
        _maybe_lose_answer("CreateTable", self.parameters.get("DatabaseName"))
        return out


GlueResponse.update_table = _strict_update_table
GlueResponse.create_table = _create_table_maybe_losing_answer

_dynamo_lock = threading.RLock()
_original_call_action = DynamoHandler.call_action


def _serial_call_action(self):
    with _dynamo_lock:
        return _original_call_action(self)


DynamoHandler.call_action = _serial_call_action


def with_fault_control(app):
    """The moto app, plus POST /_streamtable/lose-answer to arm injected faults."""

    def wsgi(environ, start_response):
        if environ.get("PATH_INFO") == "/_streamtable/lose-answer":
            q = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
            with _glue_lock:
                _lose_answers[(q["action"], q["database"])] = int(q.get("count", "1"))
            return Response("armed\n")(environ, start_response)
        return app(environ, start_response)

    return wsgi


class Server(ThreadedMotoServer):
    def _server_entry(self) -> None:
        app = with_fault_control(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(
            self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()


def main() -> None:
    port = int(sys.argv[1])
    server = Server(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
