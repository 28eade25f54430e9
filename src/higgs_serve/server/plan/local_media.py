"""Reference audio named by a local path or a file:// URL, read only under one allowed directory.

Peers' clients (sglang-omni's cookbook and Seed-TTS benchmark, vllm-omni's `file://` form) name
reference clips on the server's disk. This server reads such a file only when it was started with
`--allowed-local-media-path DIR`, and only if the file's real path (every symlink resolved, `..`
collapsed) lies inside DIR's real path: a request can never make the server read anything else.
The file is opened without following a final symlink (so it cannot be swapped for one between the
check and the read) and without blocking (opening a FIFO for reading would otherwise wait for a
writer forever, holding the request and a thread), must be a regular file (checked on the open
descriptor, before any read), and is size-capped like an upload.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from higgs_serve.errors import InvalidRequestError

FLAG = "--allowed-local-media-path"
_BASE64_TEXT = re.compile(r"[A-Za-z0-9+/=\s]+")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,5}$")
_PATH_MAX = 4096


def is_local_reference(value: str) -> bool:
    """True for a file: URL or text that can only be a path (never base64, a data: URI or a URL).

    An absolute path starts with one '/' (base64 of an unframed MP3 starts with '//'); a relative
    one holds a '/' or ends in a file extension, and a '.', '_' or '-' that base64 never holds.
    """
    text = value.strip()
    if text.lower().startswith("file:"):
        return True
    if _SCHEME.match(text) or not text or len(text) > _PATH_MAX:
        return False
    if text.startswith(("./", "../", "~/")) or (text.startswith("/") and not text.startswith("//")):
        return True
    return _BASE64_TEXT.fullmatch(text) is None and (
        "/" in text or _EXTENSION.search(text) is not None)


def read_local_reference(value: str, allowed_dir: Path | None, max_bytes: int,
                         param: str) -> bytes:
    """The file's bytes; InvalidRequestError (naming `param`) for every refusal. Blocking I/O:
    call it from a worker thread."""
    if allowed_dir is None:
        raise InvalidRequestError(
            f"{param} names a local file, but this server reads local files only when started "
            f"with {FLAG} DIR; send the audio as base64 or a data: URI instead", param=param)
    path = _resolve_inside(_path_of(value, param), allowed_dir, param)
    try:
        # O_NONBLOCK: a FIFO or device opens at once (and is refused below); reads of a
        # regular file are not affected by it
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError as error:
        raise InvalidRequestError(f"{param}: no such file under {FLAG}", param=param) from error
    except OSError as error:
        raise InvalidRequestError(f"{param}: the file cannot be opened ({error.strerror})",
                                  param=param) from error
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InvalidRequestError(f"{param}: not a regular file (a FIFO, device, socket or "
                                  "directory is never read)", param=param)
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > max_bytes:
            raise InvalidRequestError(
                f"{param} is {info.st_size} bytes; the limit is {max_bytes}", param=param)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while being read
        raise InvalidRequestError(f"{param} exceeds the limit of {max_bytes} bytes", param=param)
    return data


def _path_of(value: str, param: str) -> Path:
    text = value.strip()
    if text.lower().startswith("file:"):
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise InvalidRequestError(
                f"{param}: file:// URLs must name this host (file:///path), got host "
                f"{parts.netloc!r}", param=param)
        text = unquote(parts.path)
    if "\x00" in text or not text:
        raise InvalidRequestError(f"{param}: not a usable file path", param=param)
    return Path(text).expanduser()


def _resolve_inside(path: Path, allowed_dir: Path, param: str) -> Path:
    """The real path (relative paths from the server's working directory) if inside allowed_dir."""
    real = Path(os.path.realpath(path))
    if real != allowed_dir and allowed_dir not in real.parents:
        raise InvalidRequestError(
            f"{param}: the file is outside the directory this server may read ({FLAG}); "
            "paths are resolved, '..' and symlinks included, before this check", param=param)
    return real
