"""GET / and GET /playground/{name}: the playground, a page to hear the server in a browser.

The page is a few static files shipped inside the package (server/playground/: HTML, CSS and
JavaScript modules the browser loads as they are; no build step, no framework, nothing fetched
from another origin). They are read once, when the app is built, and served from memory with a
Content-Security-Policy that lets the page reach only this server, so a file that tried to load
a script or a font from a CDN would fail in the browser as well as in tests/server/test_playground.py.

The page and its files are public (server/auth.py): they hold no data and are the same for every
caller. Everything the page does goes through the public API with the key the user types in.
`--no-playground` (ServerSettings.playground false) leaves these routes out: / is a 404.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from higgs_serve.errors import ConfigError
from higgs_serve.server.auth import PLAYGROUND_PREFIX
from higgs_serve.server.errors import ApiError

PLAYGROUND_DIR = Path(__file__).resolve().parents[1] / "playground"
INDEX = "index.html"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8"}
# Only this server: scripts, styles and fetches of the page's own origin ('self' covers ws:/wss: to
# the same host in current browsers); audio from blob: URLs (Media Source, the download link).
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "connect-src 'self'; media-src 'self' blob:; img-src 'self' data:; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
           "Cache-Control": "no-cache", "Referrer-Policy": "no-referrer"}


@dataclass(frozen=True)
class PlaygroundFiles:
    """The page's files by name, read once: bytes and media type."""

    files: dict[str, tuple[bytes, str]]

    @classmethod
    def load(cls, directory: Path = PLAYGROUND_DIR) -> PlaygroundFiles:
        """Every file of `directory` with a known suffix; ConfigError when the page is missing
        (an install without the package data), which says how to start without it."""
        files = {path.name: (path.read_bytes(), MEDIA_TYPES[path.suffix])
                 for path in sorted(directory.glob("*")) if path.suffix in MEDIA_TYPES}
        if INDEX not in files:
            raise ConfigError(f"the playground's page is missing from this install ({directory / INDEX}); "
                              "reinstall higgs-serve, or start it with --no-playground")
        return cls(files)

    def response(self, name: str) -> Response:
        if name not in self.files:
            raise ApiError(404, f"the playground has no file {name!r}", code="not_found")
        body, media_type = self.files[name]
        return Response(body, media_type=media_type, headers=HEADERS)


router = APIRouter(include_in_schema=False)


@router.get("/")
async def page(request: Request) -> Response:
    return request.app.state.playground.response(INDEX)


@router.get(PLAYGROUND_PREFIX + "{name}")
async def static_file(name: str, request: Request) -> Response:
    return request.app.state.playground.response(name)


def add_playground(app: FastAPI, enabled: bool) -> None:
    """Serve the page on `app` when `enabled` (the single server and the front end's control
    plane alike)."""
    if enabled:
        app.state.playground = PlaygroundFiles.load()
        app.include_router(router)
