"""server/auth.py, the API key's one policy: the path a target names once normalized, the
targets refused as ambiguous, the public list, and the key compared as bytes."""

from __future__ import annotations

import pytest

from higgs_serve.server import auth


@pytest.mark.parametrize("target, path", [
    (b"/v1/audio/voices", "/v1/audio/voices"),
    (b"/v1/audio/voices?x=1", "/v1/audio/voices"),
    (b"/%76%31/audio/voices", "/v1/audio/voices"),
    (b"/v1/audio/voices/caf%C3%A9", "/v1/audio/voices/caf\xe9"),
    (b"http://x/v1/audio/voices", "/v1/audio/voices"),
    (b"HTTPS://x:8000/v1/models?y", "/v1/models"),
    (b"http://x", "/"),
    (b"http://x?q", "/"),
    (b"/v1/.well-known/x", "/v1/.well-known/x"),  # a dot that starts a name is no dot segment
    (b"//v1/models", "//v1/models"),
])
def test_the_normalized_path(target, path):
    assert auth.request_path(target) == path


@pytest.mark.parametrize("target", [
    b"/v1%2Faudio/voices", b"/v1%2faudio/voices", b"/v1%5Caudio", b"/v1\\audio",
    b"/v1/../health", b"/health/../v1/models", b"/%2e%2e/v1/models", b"/v1/%2E/models",
    b"/v1/models/.", b"/v1/models/..",
    b"/v1/models%", b"/v1/models%4", b"/v1/%zzmodels", b"/v1/%00models", b"/v1/%0Amodels",
    b"/v1/%FFmodels", b"/v1/models#x", b"*", b"x:443", b"ftp://x/v1/models", b"v1/models",
])
def test_an_ambiguous_target_is_refused(target):
    with pytest.raises(auth.BadTarget):
        auth.request_path(target)


def test_only_the_listed_paths_are_public():
    # the playground's page and its static files (issue 60): the same for every caller; the page
    # sends the key with the API calls it makes
    for path in ("/health", "/ready", "/metrics", "/openapi.json", "/docs", "/", "/playground/app.js"):
        assert auth.allowed(path, b"k", None)
    for path in ("/v1/models", "/health/", "/Health", "/metrics/x", "/index.html", "/playground", "/v1/audio/speech/stream"):
        assert not auth.allowed(path, b"k", None), path
    assert auth.allowed("/v1/models", None, None)  # no key set: everything open


@pytest.mark.parametrize("header, ok", [
    (b"Bearer k3y", True), (b"bearer k3y", True), (b"BEARER  k3y ", True),
    (b"Bearer k3", False), (b"Basic k3y", False), (b"k3y", False), (b"", False), (None, False),
    (b"Bearer k3y\xff", False), ("Bearer kéy".encode("latin-1"), False),
])
def test_the_bearer_rule(header, ok):
    assert auth.bearer_ok(header, b"k3y") is ok
    assert auth.allowed("/v1/models", b"k3y", header) is ok


@pytest.mark.parametrize("query, ok", [
    (b"api_key=k3y", True), (b"a=1&api_key=k3y", True), (b"api_key=no&api_key=k3y", True),
    (b"api_key=k3y&api_key=no", False), (b"api_key=", False), (b"api_key", False),
    (b"api_key=k%33y", True), (b"api_key=%FF", False), (b"", False), (b"x=k3y", False),
])
def test_a_websocket_may_send_the_key_in_its_query(query, ok):
    assert auth.allowed("/v1/audio/speech/stream", b"k3y", None, query) is ok
    assert not auth.allowed("/v1/models", b"k3y", None, None)  # HTTP routes: the header only
