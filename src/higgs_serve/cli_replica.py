"""`python -m higgs_serve.cli_replica ARGS`: `higgs-serve ARGS` as a data-parallel front end's
replica (cluster/launch.py). The same command line and server, except that the supervisor's
polls (`GET /ready` and `GET /metrics`, twice a second) stay out of the access log unless the log
level is DEBUG: otherwise an idle front end logged about 16 lines a second and buried restarts."""

from __future__ import annotations

import logging
import sys

from higgs_serve.cli import main

POLLED_PATHS = frozenset({"/ready", "/metrics"})


class PollsAtDebug(logging.Filter):
    """Drops uvicorn access records of the polled paths unless DEBUG is on. uvicorn's access
    record args: (client address, method, path with query, HTTP version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and args[1] == "GET" and args[2] in POLLED_PATHS:
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


if __name__ == "__main__":
    logging.getLogger("uvicorn.access").addFilter(PollsAtDebug())
    sys.exit(main(sys.argv[1:]))
