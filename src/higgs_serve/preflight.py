"""Checks the CLI runs before it loads anything: every problem a user can make with a flag is
reported in seconds, naming the flag, instead of after a minute of loading (or as a traceback).

Each check raises `ConfigError` (a `HiggsServeError`) with the message the user sees.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from pathlib import Path

from higgs_serve.errors import ConfigError

_DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def check_device(device: str | None) -> None:
    """--device is cpu, cuda or cuda:N, and a CUDA device exists on this machine."""
    if device is None:
        return
    if not _DEVICE_RE.fullmatch(device):
        raise ConfigError(f"--device {device!r} is not a device: use cpu, cuda or cuda:N (e.g. cuda:0)")
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        built = f"torch {torch.__version__} has no CUDA support" if torch.version.cuda is None \
            else "no CUDA device is visible"
        raise ConfigError(f"--device {device}: CUDA is not available on this machine ({built}); "
                          "use --device cpu, or install a CUDA build of torch on a GPU machine")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                          f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")


def check_model_dir(model_dir: Path, load_format: str) -> None:
    """A model directory holds config.json, and weights unless they are to be made up (dummy)."""
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"model directory {model_dir} has no config.json")
    if load_format == "dummy" or any((model_dir / name).is_file() for name in WEIGHT_FILES):
        return
    raise ConfigError(f"model directory {model_dir} has a config.json but no weights ({' or '.join(WEIGHT_FILES)}); "
                      "for a config-only directory (make-tiny-model --config-only) add --load-format dummy")


def check_texts(texts: list[str], flag: str = "--text") -> None:
    for i, text in enumerate(texts):
        if not text.strip():
            raise ConfigError(f"{flag} number {i + 1}: text must not be empty")


def check_alignable(texts: list[str]) -> None:
    """--word-timestamps: every text in a language the aligner reads (alignment/registry.py)."""
    from higgs_serve.alignment import aligner_for, supported_languages
    from higgs_serve.errors import InvalidRequestError

    for i, text in enumerate(texts):
        try:
            aligner_for("auto", text)
        except InvalidRequestError:
            raise ConfigError(f"--word-timestamps: text {i:04d} is not in Latin script; word timestamps are "
                              f"available for {', '.join(supported_languages())} only") from None


def check_input_file(path: str, flag: str) -> Path:
    """An existing, readable regular file."""
    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(f"{flag} {path}: no such file")
    if not file.is_file():
        raise ConfigError(f"{flag} {path}: not a file")
    if not os.access(file, os.R_OK):
        raise ConfigError(f"{flag} {path}: not readable (permission denied)")
    return file


def check_output_dir(path: str, flag: str) -> Path:
    """A directory that exists (created if missing) and can be written to."""
    directory = Path(path).expanduser()
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{flag} {path}: exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot create the directory: {e.strerror or e}") from e
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: the directory is not writable (permission denied)")
    return directory


def check_new_dir(path: str, flag: str, force: bool) -> Path:
    """check_output_dir, refusing a directory that already holds files unless `force`."""
    directory = Path(path).expanduser()
    if directory.is_dir() and not force:
        entries = sum(1 for _ in directory.iterdir())
        if entries:
            raise ConfigError(f"{flag} {path} is not empty ({entries} entries): choose a new "
                              "directory, or add --force to write the model files into it")
    return check_output_dir(path, flag)


def check_output_file(path: str, flag: str) -> Path:
    """A path a file can be written to: not a directory, in an existing writable directory."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    parent = file.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable (permission denied)")
    return file


def read_reference_clip(path: str, flag: str):
    """A reference clip decoded and duration-checked before any model loads: (samples, rate)."""
    from higgs_serve.voices.reference_encoder import ReferenceEncoder, ReferenceLimits

    file = check_input_file(path, flag)
    samples, rate = ReferenceEncoder.decode_audio_bytes(file.read_bytes(), param=f"{flag} {path}")
    seconds, limits = len(samples) / rate, ReferenceLimits()
    if not limits.min_seconds <= seconds <= limits.max_seconds:
        raise ConfigError(f"{flag} {path} is {seconds:.2f} s long; a reference clip must be "
                          f"{limits.min_seconds:g} to {limits.max_seconds:g} s")
    return samples, rate


def check_watermark(enabled: bool) -> None:
    """With the watermark on, its model must be there (audio/perth/network.py): refuse to start rather
    than serve unmarked audio. With it off, nothing to check (the builder logs that it is off)."""
    if not enabled:
        return
    from higgs_serve.audio.watermark import check_available

    check_available()


def load_provenance(settings):
    """The C2PA signer of the server settings' c2pa_cert/c2pa_key (--c2pa-cert, --c2pa-key),
    checked by signing once; None without them."""
    if settings.c2pa_cert is None:
        return None
    from higgs_serve import __version__
    from higgs_serve.audio.provenance import Provenance, SigningIdentity

    identity = SigningIdentity.from_files(settings.c2pa_cert, settings.c2pa_key, settings.c2pa_tsa_url)
    provenance = Provenance(identity, __version__)
    provenance.check()
    provenance.warn_if_expiring()
    return provenance


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one), bound before anything loads."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: cannot resolve this address ({e.strerror})") from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart over TIME_WAIT
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ConfigError(_bind_message(host, port, e)) from e
    return sock


def bind_unix_socket(path: str) -> socket.socket:
    """A listening Unix socket at `path` (a stale socket there is replaced), bound before
    anything loads."""
    target = Path(path)
    if target.exists() and not target.is_socket():
        raise ConfigError(f"--uds {path}: exists and is not a socket")
    target.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ConfigError(f"--uds {path}: cannot listen there ({e.strerror or e})") from e
    return sock


def _bind_message(host: str, port: int, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use (another higgs-serve or other server?): "
                "stop it or choose another --port")
    if error.errno == errno.EACCES:
        return f"port {port} on {host}: permission denied (ports below 1024 need privileges): choose another --port"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine"
    return f"cannot listen on {host}:{port}: {error.strerror or error}"


def read_voice_aliases(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """--voice-alias values (NAME=VOICE, or @FILE holding such lines; '#' starts a comment) ->
    (alias, voice) pairs in order. Names are checked by ServerSettings."""
    pairs: list[tuple[str, str]] = []
    for value in values or ():
        if value.startswith("@"):
            lines = _read_alias_file(value[1:])
        else:
            lines = [(value, "")]
        for line, where in lines:
            name, sep, voice = (part.strip() for part in line.partition("="))
            if not sep or not name or not voice:
                raise ConfigError(f"--voice-alias {line!r}{where}: expected NAME=VOICE, e.g. "
                                  "alloy=default")
            pairs.append((name, voice))
    return tuple(pairs)


def _read_alias_file(path: str) -> list[tuple[str, str]]:
    file = check_input_file(path, "--voice-alias @FILE")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--voice-alias @{path}: cannot be read as UTF-8 text: {e}") from e
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append((line, f" (line {number} of {path})"))
    return lines
