"""The waitress server that `kvreport serve` runs, with errors in the JSON design.

waitress refuses some requests itself, before the app sees them: a body over its hard cap (413),
an unparsable request line or header (400), headers that are too large (431). Its own replies are
plain text, so the channel here uses an error task that answers ``{"error": {"code", "message"}}``
instead (design.md, HTTP API). The hard cap is twice the app's body limit (KVREPORT_MAX_BODY_BYTES),
so a body a little over the limit reaches the app and gets the app's own message; anything larger
is refused by waitress with the same code, message and ``limit``.
"""

from __future__ import annotations

import json

from waitress.channel import HTTPChannel
from waitress.task import ErrorTask

from kvreport_server.errors import _CODES, error_body

SECURITY_HEADERS = [("X-Content-Type-Options", "nosniff"), ("Cache-Control", "no-store")]


def _error_task_class(max_body: int) -> type[ErrorTask]:
    class JsonErrorTask(ErrorTask):
        """waitress's error reply as kvreport's JSON error (Connection: close, as waitress does)."""

        def execute(self):
            e = self.request.error
            code = int(getattr(e, "code", 400) or 400)
            extra = {}
            if code == 413:
                message = f"request body exceeds the limit of {max_body} bytes (KVREPORT_MAX_BODY_BYTES)"
                extra["limit"] = max_body
            else:
                detail = str(getattr(e, "body", "") or "").strip()
                message = f"{e.reason}: {detail}" if detail else str(e.reason)
            body = json.dumps(error_body(_CODES.get(code, "bad_request"), message, **extra)).encode("utf-8")
            self.status = f"{code} {e.reason}"
            self.response_headers.extend([("Content-Type", "application/json"), *SECURITY_HEADERS])
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    return JsonErrorTask


def create_server(app, host: str, port: int, threads: int = 8):
    """A waitress server for ``app`` on ``host:port`` (not started; ``.run()`` serves).

    Raises ``OSError`` when the address cannot be bound and ``ValueError`` when waitress cannot
    resolve ``host``/``port``.
    """
    from waitress import create_server as waitress_create_server

    max_body = int(app.config["MAX_BODY_BYTES"])
    server = waitress_create_server(app, host=host, port=port, threads=threads, ident="kvreport",
                                    max_request_body_size=2 * (max_body + 65536))
    channel = type("KvreportChannel", (HTTPChannel,), {"error_task_class": _error_task_class(max_body)})
    # one server per listen address; a MultiSocketServer keeps them in its socket map
    for srv in [server, *getattr(server, "map", {}).values()]:
        if hasattr(srv, "channel_class"):
            srv.channel_class = channel
    return server
