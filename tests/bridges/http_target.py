"""A small local HTTP server for the HTTP bridge tests: records every POST and answers
as the test says (200, 500, or not at all: a hanging target)."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class HttpTarget:
    def __init__(self) -> None:
        self.mode = "ok"  # ok | fail (500) | hang | reject (400)
        self.received: list[dict[str, Any]] = []
        self.attempts = 0
        self.headers: list[dict[str, str]] = []
        self._release = threading.Event()
        target = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                target.attempts += 1
                mode = target.mode
                if mode == "hang":
                    target._release.wait(30)
                    return
                status = {"ok": 200, "fail": 500, "reject": 400}[mode]
                if status == 200:
                    target.received.append(json.loads(body))
                    target.headers.append(dict(self.headers))
                answer = b"upstream exploded" if status == 500 else b"ok"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass  # quiet

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> "HttpTarget":
        self._thread.start()
        return self

    def release(self) -> None:
        """End the hanging answers."""
        self._release.set()

    def stop(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
