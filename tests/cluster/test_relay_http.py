"""The front end's HTTP/1.1 framing (cluster/relay/: llhttp, and the limits and timeouts it leaves
to us) against RFC 9112, as a hostile client would try it (issue 52): each case answered with the
stated status and the connection closed, never a hang, a bare close or a request smuggled past
another. The real front end in a thread over a stand-in replica (uvicorn on a Unix socket),
driven over raw sockets."""

from __future__ import annotations

import asyncio
import json
import resource
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from support.frontend_thread import front_end_over, stand_in_app, wait_until
from support.raw_http import answers, connect, exchange, read_all

from higgs_serve.cluster.relay import connections, listener

SPEECH = b"POST /v1/audio/speech HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
HEALTH = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
CAP = 24  # the capped front end's connection cap
SLOW = b'{"slow": true}'  # a request the stand-in answers slowly


def _replica_app() -> FastAPI:
    app = stand_in_app()

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        body = await request.body()

        async def chunks():  # a streamed (chunked) answer: the body's length, then 3 parts
            yield b"%d;" % len(body)
            while body == SLOW:  # ...or a trickle, until the client leaves
                await asyncio.sleep(0.2)
                yield b"."
            for part in (b"a" * 10, b"b" * 20, b"c" * 30):
                yield part
        return StreamingResponse(chunks(), media_type="audio/pcm")

    return app


def _serve(work, **settings):
    with front_end_over(_replica_app(), work, capacity=64, graceful_shutdown_s=2,
                        **settings) as (url, _):
        yield url


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    yield from _serve(tmp_path_factory.mktemp("relay_http"))


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A front end that allows CAP open connections."""
    yield from _serve(tmp_path_factory.mktemp("relay_capped"), max_connections=CAP)


def _refused(url: str, data: bytes, status: int, half_close: bool = False) -> dict:
    """`data` gets exactly one answer, `status`, in the OpenAI error shape, then the close."""
    got, closed = exchange(url, data, half_close=half_close)
    assert [a.status for a in got] == [status], [(a.status, a.body) for a in got]
    assert closed, "the connection stayed open"
    assert got[0].headers[b"connection"] == b"close"
    return json.loads(got[0].body)["error"]


def _speech(body: bytes, extra: bytes = b"") -> bytes:
    return SPEECH + extra + b"content-length: %d\r\n\r\n" % len(body) + body


def test_a_plain_request_still_passes(front):
    got, _ = exchange(front, _speech(b'{"input": "x"}') + HEALTH, timeout_s=1)
    assert [a.status for a in got] == [200, 200]  # pipelined, answered in order
    assert got[0].body == b"14;" + b"a" * 10 + b"b" * 20 + b"c" * 30


# ----------------------------------------------------------------------------- smuggling
@pytest.mark.parametrize("headers", [
    b"content-length: 5\r\ntransfer-encoding: chunked\r\n",
    b"transfer-encoding: chunked\r\ncontent-length: 5\r\n",
])
def test_content_length_with_transfer_encoding_is_a_400_and_nothing_behind_it_is_served(front, headers):
    got, closed = exchange(front, SPEECH + headers + b"\r\n0\r\n\r\n" + HEALTH)
    assert [a.status for a in got] == [400] and closed


def test_two_different_content_lengths_are_a_400(front):
    _refused(front, SPEECH + b"content-length: 5\r\ncontent-length: 6\r\n\r\nhello!", 400)


@pytest.mark.parametrize("coding, status", [(b"xchunked", 400), (b"identity", 400),
                                            (b"chunked, chunked", 400), (b"gzip, chunked", 501)])
def test_a_transfer_coding_other_than_chunked_is_refused(front, coding, status):
    _refused(front, SPEECH + b"transfer-encoding: " + coding + b"\r\n\r\n0\r\n\r\n", status)


def test_transfer_encoding_on_http_1_0_is_a_400(front):
    data = b"POST /v1/audio/speech HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
    _refused(front, data, 400)


@pytest.mark.parametrize("head", [
    b"GET /health HTTP/1.1\r\nhost : x\r\n\r\n",          # whitespace before the colon
    b"GET /health HTTP/1.1\r\nx-a: a\r\n b\r\n\r\n",       # obs-fold
    b"GET /health HTTP/1.1\r\nhost x\r\n\r\n",             # no colon
    b"GET /health HTTP/1.1\r\n: x\r\n\r\n",                # an empty name
    b"GET /health HTTP/1.1\r\nx: a\rb\r\n\r\n",            # a bare CR
    b"GET /health HTTP/1.1\nhost: x\n\n",                  # LF-only lines
])
def test_malformed_header_lines_are_a_400(front, head):
    assert _refused(front, head, 400)["code"] == "bad_request"


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/0.9"])
def test_a_version_other_than_1_0_or_1_1_is_a_505(front, version):
    _refused(front, b"GET /health " + version + b"\r\nhost: x\r\n\r\n", 505)


# ----------------------------------------------------------------------------- chunked bodies
@pytest.mark.parametrize("size", [b"-5", b"0x5", b"1_0", b" 5", b"+5", b"5 ", b"ffffffffffffffffff"])
def test_a_malformed_chunk_size_is_a_400(front, size):
    _refused(front, SPEECH + b"transfer-encoding: chunked\r\n\r\n" + size + b"\r\nhello\r\n0\r\n\r\n", 400)


def test_a_70_kb_chunk_extension_is_a_400(front):
    chunked = b"5;" + b"a" * 70_000 + b"\r\nhello\r\n0\r\n\r\n"
    error = _refused(front, SPEECH + b"transfer-encoding: chunked\r\n\r\n" + chunked, 400)
    assert "extensions" in error["message"]


def test_a_70_kb_trailer_is_a_400(front):
    chunked = b"5\r\nhello\r\n0\r\nx-t: " + b"a" * 70_000 + b"\r\n\r\n"
    _refused(front, SPEECH + b"transfer-encoding: chunked\r\n\r\n" + chunked, 400)


def test_lf_only_chunk_lines_are_a_400(front):
    _refused(front, SPEECH + b"transfer-encoding: chunked\r\n\r\n5\nhello\n0\n\n", 400)


def test_a_body_cut_before_its_last_chunk_is_a_400(front):
    data = SPEECH + b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    assert _refused(front, data, 400, half_close=True)["code"] == "incomplete_body"


def test_a_body_that_stops_coming_is_a_408(front, monkeypatch):
    monkeypatch.setattr(listener, "BODY_GRACE_S", 0.5)
    data = SPEECH + b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"  # no last chunk
    assert _refused(front, data, 408)["code"] == "request_timeout"


# ----------------------------------------------------------------------------- sizes
def test_a_70_kb_header_is_a_431(front):
    _refused(front, b"GET /health HTTP/1.1\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n", 431)


def test_many_headers_past_the_limit_are_a_431(front):
    lines = b"".join(b"x-%d: %s\r\n" % (i, b"a" * 100) for i in range(700))
    _refused(front, b"GET /health HTTP/1.1\r\n" + lines + b"\r\n", 431)


def test_a_1_mb_request_line_is_a_414(front):
    _refused(front, b"GET /" + b"a" * 1_000_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n", 414)


# ----------------------------------------------------------------------------- versions
def test_an_http_1_0_client_gets_no_chunked_framing(front):
    with connect(front) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}")
        raw, closed = read_all(sock)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and closed
    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head.lower()
    assert body == b"2;" + b"a" * 10 + b"b" * 20 + b"c" * 30  # the data, unchunked


# ----------------------------------------------------------------------------- slow clients
def test_a_head_that_stops_coming_is_a_408(front, monkeypatch):
    monkeypatch.setattr(listener, "CLIENT_IDLE_S", 0.5)
    assert _refused(front, b"GET /health HTTP/1.1\r\nhost: x\r\n", 408)["code"] == "request_timeout"


def test_bodies_that_stall_are_closed_after_a_bounded_time(front, monkeypatch):
    """200 connections that declared 1,000 bytes and sent 3: each answered 408 and closed."""
    monkeypatch.setattr(listener, "BODY_GRACE_S", 1.0)
    socks = []
    try:
        for _ in range(200):
            sock = connect(front)
            sock.sendall(b"POST /v1/audio/voices HTTP/1.1\r\nhost: x\r\n"
                         b"content-length: 1000\r\n\r\nabc")
            socks.append(sock)
        start = time.monotonic()
        outcomes = [read_all(sock, timeout_s=15) for sock in socks]
        assert time.monotonic() - start < 15
        assert all(closed for _, closed in outcomes)
        assert all([a.status for a in answers(raw)] == [408] for raw, _ in outcomes)
    finally:
        for sock in socks:
            sock.close()


def test_health_is_served_while_many_slow_connections_are_open(capped):
    """Four times the cap of connections sending a head slowly: /health still answers, the
    oldest slow ones are closed to make room."""
    slow = []
    try:
        for _ in range(4 * CAP):
            sock = connect(capped)
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # and nothing more
            slow.append(sock)
        for _ in range(5):
            got, _ = exchange(capped, HEALTH.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"))
            assert [a.status for a in got] == [200]
        evicted = [read_all(sock, timeout_s=0.3) for sock in slow[:CAP]]
        assert all(closed for _, closed in evicted)
        # a 503 where the relay had read the start of a request, else just the close
        assert {a.status for raw, _ in evicted for a in answers(raw)} <= {503}
    finally:
        for sock in slow:
            sock.close()


def test_when_every_connection_is_being_served_a_newcomer_gets_a_503(capped):
    """CAP clients each in the middle of an answer (never made room with) and one more."""
    busy = []
    try:
        for _ in range(CAP):
            sock = connect(capped)
            sock.sendall(_speech(SLOW))
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # its answer has begun
            busy.append(sock)
        error = _refused(capped, HEALTH, 503)
        assert error["code"] == "too_many_connections"
    finally:
        for sock in busy:
            sock.close()
    wait_until(lambda: [a.status for a in exchange(capped, HEALTH, timeout_s=1)[0]] == [200],
               what="room again")


def test_the_default_cap_stays_below_the_open_file_limit(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    cap = connections.default_cap()
    assert 2 * cap + connections.RESERVED_FDS <= 1024 and cap >= 400


# ----------------------------------------------------------------------------- upgrades
def test_an_upgrade_with_a_body_is_a_400_not_a_hang(front):
    data = (b"GET /v1/audio/speech/stream HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\n"
            b"upgrade: websocket\r\nsec-websocket-version: 13\r\n"
            b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\ncontent-length: 50\r\n\r\n" + b"x" * 50)
    start = time.monotonic()
    _refused(front, data, 400)
    assert time.monotonic() - start < 5


def test_an_upgrade_elsewhere_is_a_400(front):
    data = (b"POST /v1/audio/speech HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n"
            b"content-length: 2\r\n\r\n{}")
    assert _refused(front, data, 400)["code"] == "unsupported_upgrade"


def test_the_relay_still_serves_after_every_case(front):
    got, _ = exchange(front, HEALTH, timeout_s=1)
    assert [a.status for a in got] == [200]
