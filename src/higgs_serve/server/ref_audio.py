"""`ref_audio` request field -> audio file bytes.

Accepted: plain base64, or a `data:<mime>;base64,<payload>` URI. An http(s) URL is fetched only
when its host is on the server's allow-list (`--allowed-ref-audio-domains`), without following
redirects and with a size cap; every other URL (file:, other hosts) is refused, so the server can
never be made to read its own disk or probe the network on a client's behalf.
"""

from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import urlsplit

import httpx

from higgs_serve.errors import InvalidRequestError

PARAM = "ref_audio"
FETCH_TIMEOUT_S = 10.0
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


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


async def _fetch_allowed(url: str, allowed_domains: tuple[str, ...], max_bytes: int) -> bytes:
    host = (urlsplit(url).hostname or "").lower()
    if host not in allowed_domains:
        raise InvalidRequestError(
            f"ref_audio URL host {host!r} is not allowed: this server fetches URLs only from "
            "hosts listed in --allowed-ref-audio-domains; send the audio as base64 or a data: URI",
            param=PARAM)
    async with httpx.AsyncClient(follow_redirects=False, timeout=FETCH_TIMEOUT_S) as client:
        try:
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise InvalidRequestError(
                        f"ref_audio URL answered HTTP {response.status_code}", param=PARAM)
                data = bytearray()
                async for piece in response.aiter_bytes():
                    data += piece
                    if len(data) > max_bytes:
                        raise InvalidRequestError(
                            f"ref_audio URL body exceeds the limit of {max_bytes} bytes",
                            param=PARAM)
                return bytes(data)
        except httpx.HTTPError as error:
            # the error's class only: its text can carry resolver/socket details of this host
            raise InvalidRequestError(
                f"ref_audio URL could not be fetched ({type(error).__name__})", param=PARAM
            ) from error
