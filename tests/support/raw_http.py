"""Raw-socket HTTP/1.1 for tests that send what no client library would: send bytes, read every
answer until the server closes (or a timeout), and split them with llhttp."""

from __future__ import annotations

import socket
import time

import httptools


class Answer:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = b""


class _Answers:
    def __init__(self) -> None:
        self.done: list[Answer] = []
        self.current = Answer()
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.current.status = self.parser.get_status_code()

    def on_body(self, data: bytes) -> None:
        self.current.body += data

    def on_message_complete(self) -> None:
        self.done.append(self.current)
        self.current = Answer()


def connect(url: str, timeout_s: float = 10.0) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def read_all(sock: socket.socket, timeout_s: float = 10.0) -> tuple[bytes, bool]:
    """(everything the server sent, whether it closed) within `timeout_s`."""
    sock.settimeout(0.2)
    data, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def answers(raw: bytes) -> list[Answer]:
    """The complete answers in `raw`, in order (a body delimited by the close counts)."""
    split = _Answers()
    try:
        split.parser.feed_data(raw)
    except httptools.HttpParserError:
        pass
    if split.current.status and split.current not in split.done:  # ended by the close
        split.done.append(split.current)
    return split.done


def exchange(url: str, data: bytes, timeout_s: float = 10.0,
             half_close: bool = False) -> tuple[list[Answer], bool]:
    """Send `data` on a new connection (then shut down our side when `half_close`): the
    answers and whether the server closed within `timeout_s`."""
    with connect(url) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        raw, closed = read_all(sock, timeout_s)
    return answers(raw), closed
