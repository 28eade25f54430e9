"""`ref_audio` request field -> audio file bytes.

Accepted: plain base64, or a `data:<mime>;base64,<payload>` URI. An http(s) URL is fetched only
under these rules, so the server can never be made to read its own disk or probe a network on a
client's behalf:

- its host is on the allow-list (`--allowed-ref-audio-domains`), on port 80/443, or the entry
  names the port too (`host:port`); no user info, no whitespace or control characters;
- the host is resolved once and every address must be public, unless the allow-list entry is
  that IP address itself (so `127.0.0.1:8080` may be fetched only when listed as such); the
  fetch then connects to the checked address (no second lookup a DNS rebinding could change);
- no redirects, no proxies from the environment, at most `max_bytes`, and one deadline of
  FETCH_DEADLINE_S for the whole fetch (connect, headers and every byte of the body);
- every failure to fetch reads the same ("could not be fetched"), so a client learns nothing
  about which ports are closed or filtered.

Fetches happen after admission control (routers/speech.py), like every other reference work.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import re
import socket
from urllib.parse import urlsplit, urlunsplit

import httpx

from higgs_serve.errors import InvalidRequestError

PARAM = "ref_audio"
FETCH_DEADLINE_S = 10.0
DEFAULT_PORTS = {"http": 80, "https": 443}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")  # whitespace and control characters, anywhere
_UNREACHABLE = "ref_audio URL could not be fetched"


async def ref_audio_bytes(value: str, allowed_domains: tuple[str, ...], max_bytes: int) -> bytes:
    """Decode or (allow-listed only) fetch the reference clip; raises InvalidRequestError."""
    text = value.strip()
    if text.startswith("data:"):
        data = _decode_data_uri(text)
    elif text.lower().startswith(("http://", "https://")):
        data = await _fetch_allowed(text, allowed_domains, max_bytes)
    elif _SCHEME.match(text) and not _looks_like_base64(text):
        raise InvalidRequestError(
            "ref_audio must be base64 audio or a data: URI (URLs only for allow-listed hosts)",
            param=PARAM)
    else:
        data = _decode_base64(text)
    if not data:
        raise InvalidRequestError("ref_audio is empty", param=PARAM)
    if len(data) > max_bytes:
        raise InvalidRequestError(
            f"ref_audio is {len(data)} bytes; the limit is {max_bytes}", param=PARAM)
    return data


def _looks_like_base64(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9+/=\s]+", text) is not None


def _decode_base64(text: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidRequestError(f"ref_audio is not valid base64: {error}", param=PARAM) from error


def _decode_data_uri(text: str) -> bytes:
    header, comma, payload = text.partition(",")
    if not comma or not header.endswith(";base64"):
        raise InvalidRequestError(
            "ref_audio data URI must look like data:<mime>;base64,<payload>", param=PARAM)
    return _decode_base64(payload)


# ----------------------------------------------------------------------------- URL fetches
def _refuse(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=PARAM)


def _allowed_target(url: str, allowed_domains: tuple[str, ...]) -> tuple[str, int, str]:
    """(host, port, the allow-list entry that admits it), or a 400 saying which rule failed."""
    if _UNSAFE.search(url):
        raise _refuse("ref_audio URL contains whitespace or control characters")
    parts = urlsplit(url)
    try:
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError as error:
        raise _refuse("ref_audio URL has an invalid port") from error
    if parts.username is not None or parts.password is not None:
        raise _refuse("ref_audio URL must not carry user info")
    port = port or DEFAULT_PORTS[parts.scheme.lower()]
    with_port = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if with_port in allowed_domains:
        return host, port, with_port
    if host in allowed_domains:
        if port not in DEFAULT_PORTS.values():
            raise _refuse(f"ref_audio URL port {port} is not allowed: only 80 and 443, unless "
                          f"--allowed-ref-audio-domains lists {with_port!r}")
        return host, port, host
    raise _refuse(
        f"ref_audio URL host {host!r} is not allowed: this server fetches URLs only from "
        "hosts listed in --allowed-ref-audio-domains; send the audio as base64 or a data: URI")


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def _resolve_checked(host: str, port: int) -> str:
    """One public address of `host` (or the host itself when it is a listed IP literal)."""
    literal = _ip_literal(host)
    if literal is not None:
        return host  # listed as this very address: the operator named it
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise _refuse(_UNREACHABLE) from error
    addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
    if not addresses:
        raise _refuse(_UNREACHABLE)
    if not all(address.is_global for address in addresses):
        raise _refuse(f"ref_audio URL host {host!r} resolves to a non-public address; list that "
                      "address itself in --allowed-ref-audio-domains to allow it")
    return str(addresses[0])


async def _fetch_allowed(url: str, allowed_domains: tuple[str, ...], max_bytes: int) -> bytes:
    host, port, _ = _allowed_target(url, allowed_domains)
    try:
        return await asyncio.wait_for(_fetch_pinned(url, host, port, max_bytes),
                                      FETCH_DEADLINE_S)
    except (asyncio.TimeoutError, httpx.HTTPError, httpx.InvalidURL, OSError) as error:
        # one text for every failure: nothing about closed or filtered ports, nor resolver details
        raise _refuse(_UNREACHABLE) from error


async def _fetch_pinned(url: str, host: str, port: int, max_bytes: int) -> bytes:
    address = await _resolve_checked(host, port)
    parts = urlsplit(url)
    ip_host = f"[{address}]" if ":" in address else address
    pinned = urlunsplit((parts.scheme, f"{ip_host}:{port}", parts.path or "/", parts.query, ""))
    headers = {"Host": parts.netloc.rpartition("@")[2]}
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                 timeout=FETCH_DEADLINE_S) as client:
        async with client.stream("GET", pinned, headers=headers,
                                 extensions={"sni_hostname": host}) as response:
            if response.status_code != 200:
                raise _refuse(f"ref_audio URL answered HTTP {response.status_code}")
            data = bytearray()
            async for piece in response.aiter_bytes():
                data += piece
                if len(data) > max_bytes:
                    raise _refuse(f"ref_audio URL body exceeds the limit of {max_bytes} bytes")
            return bytes(data)
