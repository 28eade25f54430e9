"""A raw audio stream (the format's bytes, chunked) that fails mid-way ends truncated, with one
log line (docs/api.md#streaming).

HTTP/1.1 has one way to tell a client that a chunked body failed: close the connection before
its last chunk, which clients report as a truncated body. Raising out of the body does that
too, but uvicorn then logs the whole traceback, once per response: an encoder process killed
under 15 responses logged 15 tracebacks. Here a HiggsServeError (an encoder that stopped, a
server-side abort) ends the body with one warning naming the request and the reason; uvicorn
closes the incomplete response with its own one line, no traceback. Anything else is a bug and
still propagates with its traceback.
"""

from __future__ import annotations

import logging

from starlette.types import Send

from higgs_serve.errors import HiggsServeError
from higgs_serve.server.limits.send_timeout import ClosingStreamingResponse

logger = logging.getLogger(__name__)


class RawAudioResponse(ClosingStreamingResponse):
    def __init__(self, *args, request_id: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.request_id = request_id

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except HiggsServeError as error:  # the body stays incomplete: the client sees it cut
            logger.warning("raw audio stream %s ended early: %s", self.request_id, error)
