"""An aligner process: forced alignment away from the server's GIL (alignment/pool.py starts
and feeds it).

    python -m higgs_serve.alignment.worker --fd FD --parent-pid PID [--nice N --cpus LIST]

Messages are pickled tuples over one end of a Unix socket pair (multiprocessing's Connection
framing), one request and its answer at a time:

    ("build", name)                          -> ("ok", None) | ("error", message)
    ("align", name, audio, rate_hz, words)   -> ("ok", [WordTiming]) | ("error", message)

The process says ("ready", pid) first. It builds each aligner once and keeps it, except after
an error that is not the text's or the audio's (AlignmentError): that aligner may hold a broken
decoder, so it is dropped and the next alignment builds a fresh one. It ends at EOF (the server
closed the socket or died; on Linux the kernel also sends SIGTERM when the server's thread that
started it ends).
"""

from __future__ import annotations

import os
import socket
import sys
from multiprocessing.connection import Connection

from higgs_serve.alignment.aligner import Aligner
from higgs_serve.alignment.registry import build_aligner
from higgs_serve.config.worker_processes import worker_start
from higgs_serve.errors import AlignmentError


def main(argv: list[str] | None = None) -> int:
    fd = worker_start("higgs_serve.alignment.worker", argv)
    connection = Connection(socket.socket(fileno=fd).detach())
    try:
        return serve(connection)
    finally:
        connection.close()


def serve(connection: Connection) -> int:
    aligners: dict[str, Aligner] = {}
    connection.send(("ready", os.getpid()))
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return 0
        connection.send(answer(aligners, request))


def answer(aligners: dict[str, Aligner], request: tuple) -> tuple[str, object]:
    """One request -> ("ok", result) or ("error", message); never raises."""
    kind, name, *work = request
    try:
        aligner = aligners.get(name)
        if aligner is None:
            aligner = aligners[name] = build_aligner(name)
        if kind == "build":
            return "ok", None
        audio, rate_hz, words = work
        return "ok", aligner.align(audio, rate_hz, words)
    except AlignmentError as error:  # this audio and text: the aligner is fine
        return "error", str(error)
    except Exception as error:  # noqa: BLE001: told to the server; a fresh aligner next time
        aligners.pop(name, None)
        return "error", f"{type(error).__name__}: {error}"


if __name__ == "__main__":
    sys.exit(main())
