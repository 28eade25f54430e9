"""Issue 60: the playground's route without a browser (the page in Chromium:
test_playground_browser.py). The page and every file it loads are served from the package, public
on a keyed server, under a policy that lets the page reach only this server; nothing in them
names another origin; `--no-playground` leaves / unserved, on the single server and the front end."""

from __future__ import annotations

import re

import httpx
import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from live_server import fake_settings, start_threaded_server

from higgs_serve import cli
from higgs_serve.cluster.control import build_control_app
from higgs_serve.cluster.frontend import Frontend, FrontendSettings
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router
from higgs_serve.errors import ConfigError
from higgs_serve.server.auth import UNAUTHORIZED
from higgs_serve.server.routers.playground import PLAYGROUND_DIR, PlaygroundFiles
from higgs_serve.server.settings import ServerSettings

KEY = "k3y"
IMPORT = re.compile(r"""(?:\bimport\b[^"';]*?\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)["']([^"']+)["']""")
SOURCE = re.compile(r"""\b(?:src|href)="([^"]+)\"""")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    live = start_threaded_server(FakeEngine(), fake_settings(tmp_path_factory.mktemp("keyed"), api_key=KEY))
    yield httpx.Client(base_url=live.url)
    live.stop()


def _page_files() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in PLAYGROUND_DIR.iterdir()}


def test_the_page_and_every_file_it_loads_are_public_with_their_types(keyed):
    page = keyed.get("/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    loaded = {url for url in SOURCE.findall(page.text) if url.startswith("/")}
    for name, text in _page_files().items():  # and every module the scripts import
        loaded |= {f"/playground/{target.removeprefix('./')}" for target in IMPORT.findall(text)}
    assert {"/playground/app.js", "/playground/playground.css", "/playground/stall_meter.js"} <= loaded
    for url in loaded:
        answer = keyed.get(url)
        assert answer.status_code == 200, url
        kind = {"js": "text/javascript", "css": "text/css"}[url.rsplit(".", 1)[1]]
        assert answer.headers["content-type"].startswith(kind) and answer.headers["x-content-type-options"] == "nosniff"
    missing = keyed.get("/playground/nothing.js")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    refused = keyed.get("/v1/audio/voices")  # the API behind the page still wants the key
    assert refused.status_code == 401 and refused.json()["error"]["message"] == UNAUTHORIZED


def test_the_policy_lets_the_page_reach_only_this_server(keyed):
    policy = dict(rule.strip().split(" ", 1) for rule in keyed.get("/").headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == policy["style-src"] == policy["connect-src"] == "'self'"
    assert "http" not in keyed.get("/").headers["content-security-policy"]


def test_no_file_of_the_page_names_another_origin():
    for name, text in _page_files().items():
        assert not re.search(r"(https?:)?//[\w.-]+\.\w", re.sub(r"//.*|/\*.*?\*/", "", text)), name
        for target in IMPORT.findall(text):
            assert target.startswith("./") and (PLAYGROUND_DIR / target[2:]).is_file(), (name, target)


def test_no_playground_leaves_the_root_unserved(tmp_path):
    live = start_threaded_server(FakeEngine(), fake_settings(tmp_path, playground=False))
    try:
        for path in ("/", "/playground/app.js"):
            assert httpx.get(live.url + path).status_code == 404, path
    finally:
        live.stop()


def test_the_flag_is_a_setting_checked_once():
    args = cli.build_parser().parse_args(["serve", "m", "--no-playground"])
    assert cli._server_settings(args, 8000, {}).playground is False
    assert cli._server_settings(cli.build_parser().parse_args(["serve", "m"]), 8000, {}).playground is True
    serve = next(action for action in cli.build_parser()._actions if action.dest == "command").choices["serve"]
    assert "--no-playground" in serve.format_help()
    with pytest.raises(ConfigError, match="playground"):
        ServerSettings(playground="no")


def test_an_install_without_the_page_fails_at_start_naming_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--no-playground"):
        PlaygroundFiles.load(tmp_path)


@pytest.mark.parametrize("playground", [True, False])
def test_the_front_end_serves_the_page_unless_told_not_to(tmp_path, playground):
    settings = FrontendSettings.of(ServerSettings(playground=playground, api_key=KEY))
    frontend = Frontend({"0": Replica(id="0", socket_path=tmp_path / "0.sock")}, Router({"0": 1}),
                        tmp_path / "voices", 24000, settings)
    client = TestClient(build_control_app(frontend))  # no lifespan: no replicas are started
    assert client.get("/").status_code == (200 if playground else 404)
    assert client.get("/playground/app.js").status_code == (200 if playground else 404)
