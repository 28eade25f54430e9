"""Every route of the single server is served by the data-parallel front end: the single app's
(method, path) set is compared with the relay's own routes (cluster/relay/listener.py: speech) and the
control plane app's (HTTP from the OpenAPI documents, WebSocket routes from the route tables), so a route added to the single server later fails here until the front end
serves it or it is listed below (and in docs/api.md, "Several replicas behind one endpoint")."""

from __future__ import annotations

from types import SimpleNamespace

from fastapi import FastAPI
from fastapi.routing import APIWebSocketRoute

from higgs_serve.cluster.control import build_control_app
from higgs_serve.cluster.frontend import Frontend, FrontendSettings
from higgs_serve.cluster.relay.listener import ROUTED
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router
from higgs_serve.server.app import build_app
from higgs_serve.server.settings import ServerSettings

NOT_SERVED_BY_THE_FRONT_END: set[tuple[str, str]] = set()  # none today


def _routes(app: FastAPI) -> set[tuple[str, str]]:
    http = {(method.upper(), path) for path, operations in app.openapi()["paths"].items()
            for method in operations}
    return http | {("WS", path) for path in _websocket_paths(app.router.routes)}


def _websocket_paths(routes) -> list[str]:
    """Included routers are nested in this FastAPI version: walk them."""
    paths = []
    for route in routes:
        if isinstance(route, APIWebSocketRoute):
            paths.append(route.path)
        nested = getattr(route, "original_router", None)
        if nested is not None:
            paths += _websocket_paths(nested.routes)
    return paths


def test_the_front_end_serves_every_route_of_the_single_server(tmp_path):
    engine = SimpleNamespace(deploy=SimpleNamespace(stage0=SimpleNamespace(max_num_seqs=2)),
                             sample_rate_hz=24000, stats=lambda: {})  # the app is only built
    single = _routes(build_app(engine, ServerSettings(voices_dir=str(tmp_path / "v1"))))
    frontend = Frontend({"0": Replica(id="0", socket_path=tmp_path / "0.sock")}, Router({"0": 1}),
                        tmp_path / "v2", 24000, FrontendSettings())
    served = _routes(build_control_app(frontend)) | {("POST", path) for path in ROUTED}
    assert {("POST", "/v1/audio/speech/batch"), ("WS", "/v1/audio/speech/stream")} <= single
    assert single - served == NOT_SERVED_BY_THE_FRONT_END, sorted(single - served)
