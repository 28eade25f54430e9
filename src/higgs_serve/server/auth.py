"""Who may call what: the API key's one policy, for the single server and the front end.

With `--api-key KEY`, every request needs the key except those to the public paths below; the
single server (`ApiKeyMiddleware`, in front of every route and the WebSocket), the front end's
relay (cluster/relay/listener.py, before it reads a body or routes) and its control plane (the
same middleware) all decide with the functions here (docs/operations.md, "API key").

The decision is made on the path the request names once normalized: an absolute-form target
(`GET http://host/v1/models`) becomes its path, percent-escapes are decoded. A target that could
name two different paths is refused (400 `invalid_request_target`) rather than guessed at, so
the check and the router can never read it differently:
- a dot segment (`/v1/../health`, `/%2e%2e/`): an intermediary would resolve it, our routers
  would not;
- an escaped `/` or `\\` (`/v1%2Fmodels`): one segment to some readers, two to others;
- a malformed escape, an escape of a control character or of bytes that are not UTF-8, a
  fragment, or a target that is neither a path nor an http(s) URL.

The key itself: `Authorization: Bearer KEY` (the scheme in any case), compared as bytes in
constant time, so any header value (non-ASCII included) is a yes or a no, never an error. A
WebSocket session may send it as `?api_key=KEY` instead (browsers cannot set a WebSocket's
headers).
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from urllib.parse import parse_qsl

from higgs_serve.server.errors import ApiError, error_object, error_response

# Open without the key: liveness, readiness and metrics for orchestrators and scrapers (keep
# them off the public network: docs/operations.md), the API's own description (the same for
# every caller; /docs' Authorize button then sends the key to the rest), and the playground's
# page and static files (server/routers/playground.py: the same for every caller, no data; the
# page asks for the key and sends it with every API call it makes).
PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics",
                          "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/"})
PLAYGROUND_PREFIX = "/playground/"  # every path under it is a static file of the page
UNAUTHORIZED = "missing or invalid API key: send 'Authorization: Bearer <key>'"
UNAUTHORIZED_WS = UNAUTHORIZED + " or the api_key query parameter"
CLOSE_POLICY = 1008  # a WebSocket refused for its key (RFC 6455 7.4.1)

_ABSOLUTE = re.compile(rb"https?://[^/?#]*", re.IGNORECASE)
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
_SEPARATORS = frozenset({0x2F, 0x5C})  # '/' and '\' escaped: one segment or two?
_UNSAFE = re.compile(rb"[\x00-\x1f\x7f\\]")


class BadTarget(ValueError):
    """A request target that names no single path (module note)."""


def origin_form(target: bytes) -> bytes:
    """The target as path[?query]: an absolute-form target (`http://host/path?q`) loses its
    scheme and authority. BadTarget for any other form (authority-form, `*`, garbage)."""
    if target.startswith(b"/"):
        return target
    match = _ABSOLUTE.match(target)
    if match is None:
        raise BadTarget("the request target must be a path or an http(s) URL")
    rest = target[match.end():]
    return rest if rest.startswith(b"/") else b"/" + rest


@functools.lru_cache(maxsize=1024)  # a few targets make most requests; a refusal is not kept
def request_path(target: bytes) -> str:
    """The normalized path of a request target (module note); BadTarget when ambiguous."""
    path = origin_form(target).partition(b"?")[0]
    if b"#" in path:
        raise BadTarget("the request target has a fragment")
    if b"%" in path:
        path = _unescape(path)
    if _UNSAFE.search(path):
        raise BadTarget("the request path holds a backslash or a control character")
    try:
        text = path.decode("utf-8")
    except UnicodeDecodeError:
        raise BadTarget("the request path is not UTF-8 once unescaped") from None
    if "/." in text and any(s in (".", "..") for s in text.split("/")):
        raise BadTarget("the request path has a dot segment ('.' or '..')")
    return text


def _unescape(path: bytes) -> bytes:
    if path.count(b"%") != len(_ESCAPE.findall(path)):
        raise BadTarget("the request path has a malformed percent-escape")

    def byte(match: re.Match) -> bytes:
        value = int(match.group(1), 16)
        if value in _SEPARATORS:
            raise BadTarget("the request path has an escaped '/' or '\\'")
        return bytes((value,))
    return _ESCAPE.sub(byte, path)


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PLAYGROUND_PREFIX)


def bearer_ok(authorization: bytes | None, expected: bytes) -> bool:
    """`Authorization: Bearer <key>` (module note)."""
    scheme, _, token = (authorization or b"").partition(b" ")
    return scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), expected)


def query_key_ok(query_string: bytes, expected: bytes) -> bool:
    """`?api_key=<key>` (a WebSocket's alternative; the last one given counts, as Starlette reads
    query parameters)."""
    if b"api_key" not in query_string:
        return False
    given = [v for k, v in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
             if k == "api_key"]
    return bool(given) and bool(given[-1]) and \
        secrets.compare_digest(given[-1].encode("utf-8", "surrogateescape"), expected)


def allowed(path: str, expected: bytes | None, authorization: bytes | None,
            query_string: bytes | None = None) -> bool:
    """May this request reach `path`? `query_string`: a WebSocket's (its `api_key`), else None."""
    if expected is None or is_public(path) or bearer_ok(authorization, expected):
        return True
    return query_string is not None and query_key_ok(query_string, expected)


def unauthorized(websocket: bool = False) -> ApiError:
    return ApiError(401, UNAUTHORIZED_WS if websocket else UNAUTHORIZED, code="invalid_api_key")


def bad_target(error: BadTarget) -> ApiError:
    return ApiError(400, str(error), code="invalid_request_target")


class ApiKeyMiddleware:
    """The policy in front of an ASGI app: every HTTP request and WebSocket session (module
    note). Refused HTTP requests get the OpenAI error shape (401, or 400 for an ambiguous
    target). A WebSocket without the key is accepted, sent an `error` event and closed with
    1008, as a session that fails at its start is (docs/api.md, "WebSocket streaming"); one
    with an ambiguous target gets the 400 as its handshake's answer."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.expected = api_key.encode() if api_key else None  # ASCII (server/settings.py)

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        websocket = kind == "websocket"
        try:
            path = request_path(scope.get("raw_path") or scope["path"].encode())
        except BadTarget as error:
            if websocket:
                await _deny_handshake(bad_target(error), scope, receive, send)
            else:
                await error_response(bad_target(error))(scope, receive, send)
            return
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        query = scope.get("query_string", b"") if websocket else None
        if allowed(path, self.expected, authorization, query):
            await self.app(scope, receive, send)
        elif websocket:
            await _refuse_session(unauthorized(websocket), receive, send)
        else:
            await error_response(unauthorized())(scope, receive, send)


async def _deny_handshake(error: ApiError, scope, receive, send) -> None:
    """No session at all: the error as the handshake's HTTP answer (as the front end's relay
    answers it), or a plain refusal (403) where the server cannot send one."""
    if (await receive())["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await error_response(error)(scope, receive, send)
    else:
        await send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": ""})


async def _refuse_session(error: ApiError, receive, send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    event = {"type": "error", "message": error.message, "code": error.code,
             "error": error_object(error.message, error.type, None, error.code)}
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": json.dumps(event, separators=(",", ":"))})
    await send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": ""})
