"""A tiny HTTP proxy in front of moto's S3 server that injects real faults.

``fail_next(n)`` answers the next ``n`` requests with HTTP 500 InternalError (S3's XML), and
``forbid()`` answers every request with 403 AccessDenied; everything else is forwarded to the
real server unchanged. The worker talks HTTP to it exactly as to any S3 endpoint.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
    "<Message>{message}</Message><RequestId>fault</RequestId></Error>"
)


class S3FaultProxy:
    """Forwards to ``upstream``; counts and injects faults."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port
        self.num_to_fail = 0
        self.num_failed = 0
        self.num_forwarded = 0
        self.is_forbidden = False
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                return None

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._take_fault()
                if fault is not None:
                    status, code, message = fault
                    data = (
                        b""
                        if self.command == "HEAD"
                        else _ERROR.format(code=code, message=message).encode()
                    )
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                conn = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=30
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = f"{proxy.upstream_host}:{proxy.upstream_port}"
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def fail_next(self, num_requests: int) -> None:
        with self._lock:
            self.num_to_fail = num_requests

    def forbid(self) -> None:
        self.is_forbidden = True

    def _take_fault(self) -> tuple[int, str, str] | None:
        with self._lock:
            if self.is_forbidden:
                return 403, "AccessDenied", "Access Denied"
            if self.num_to_fail > 0:
                self.num_to_fail -= 1
                self.num_failed += 1
                return 500, "InternalError", "We encountered an internal error. Please try again."
            self.num_forwarded += 1
            return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
