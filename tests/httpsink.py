"""An HTTP receiver on 127.0.0.1 for tests: records every POST (headers, body) and answers
``status`` with an empty body. Webhooks and the OTLP collector of the tests use it."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class Sink:
    def __init__(self, status: int = 204) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        posts = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                posts.append((dict(self.headers.items()), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Sink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def json_bodies(self) -> list[Any]:
        return [json.loads(body) for _, body in self.posts]
