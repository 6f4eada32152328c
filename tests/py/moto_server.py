"""The moto server the tests run against, made to keep two promises AWS keeps and moto does not.

1. Glue `UpdateTable` with a `VersionId` fails with `ConcurrentModificationException` when the
   table changed since that version (moto ignores `VersionId`).
2. DynamoDB requests are linearizable: moto runs `TransactWriteItems` without a lock (its
   rollback deep-copies whole tables), so two concurrent conditional transactions can both pass.
   Serialising DynamoDB requests restores what real DynamoDB guarantees.

Usage: python tests/py/moto_server.py PORT   (prints "ready" once it accepts requests)
"""

import signal
import sys
import threading

from moto.dynamodb.responses import DynamoHandler
from moto.glue.exceptions import GlueClientError
from moto.glue.responses import GlueResponse
from moto.moto_server.threaded_moto_server import ThreadedMotoServer


class ConcurrentModificationException(GlueClientError):
    def __init__(self, msg: str):
        super().__init__("ConcurrentModificationException", msg)


_glue_lock = threading.Lock()
_original_update_table = GlueResponse.update_table


def _strict_update_table(self):
    version = self.parameters.get("VersionId")
    with _glue_lock:
        if version is not None:
            database = self.parameters.get("DatabaseName")
            name = self.parameters.get("TableInput", {}).get("Name")
            table = self.glue_backend.get_table(database, name)
            if str(table._current_version) != str(version):
                raise ConcurrentModificationException(
                    f"Table {database}.{name} is at version {table._current_version}, not {version}"
                )
        return _original_update_table(self)


GlueResponse.update_table = _strict_update_table

_dynamo_lock = threading.RLock()
_original_call_action = DynamoHandler.call_action


def _serial_call_action(self):
    with _dynamo_lock:
        return _original_call_action(self)


DynamoHandler.call_action = _serial_call_action


def main() -> None:
    port = int(sys.argv[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
