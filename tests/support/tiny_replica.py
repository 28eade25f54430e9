"""A stand-in replica process for the supervisor's tests: `python tiny_replica.py SOCKET` serves
the few endpoints the front end's control plane calls (/ready, /metrics, the voice list, upload
and delete) on a Unix socket, in milliseconds of start-up and with no model. Voices are kept in
memory, so a restart forgets them, as a real replica's fresh voices directory does."""

from __future__ import annotations

import json
import socketserver
import sys
from http.server import BaseHTTPRequestHandler

VOICES: set[str] = set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def address_string(self) -> str:
        return "unix"

    def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/ready":
            self._answer(200, b'{"status": "ready"}')
        elif self.path == "/metrics":
            self._answer(200, b"higgs_serve_server_in_flight_requests 0.0\n", "text/plain")
        elif self.path == "/v1/audio/voices":
            data = [{"name": name} for name in sorted(VOICES)]
            self._answer(200, json.dumps({"object": "list", "data": data}).encode())
        else:
            self._answer(404, b"{}")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/v1/audio/voices":
            name = body.split(b'name="name"\r\n\r\n', 1)[1].split(b"\r\n", 1)[0].decode()
            VOICES.add(name)
            self._answer(200, json.dumps({"name": name}).encode())
        else:
            self._answer(404, b"{}")

    def do_DELETE(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        found = name in VOICES
        VOICES.discard(name)
        self._answer(200 if found else 404, b"{}")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


if __name__ == "__main__":
    with Server(sys.argv[1], Handler) as server:
        server.serve_forever()
