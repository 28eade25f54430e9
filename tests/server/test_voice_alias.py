"""--voice-alias (issue 41): OpenAI-only clients name a voice by a stock name the server maps to a
registered voice or `default`; an alias of a voice not registered, or a stock name not aliased,
is a 400 naming `voice` (docs/api.md#openai-only-clients)."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
import soundfile as sf
from fake_engine import FakeEngine
from live_server import fake_settings, start_threaded_server

ALIASES = (("alloy", "default"), ("nova", "narrator"), ("onyx", "ghost"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = FakeEngine()
    live = start_threaded_server(
        engine, fake_settings(tmp_path_factory.mktemp("alias"), voice_aliases=ALIASES),
        reference_encoder=lambda audio: np.full((3, 8), 7, np.int64))
    clip = io.BytesIO()
    sf.write(clip, 0.1 * np.ones(24000, np.float32), 24000, format="WAV")
    with httpx.Client(base_url=live.url, timeout=10) as client:
        created = client.post("/v1/audio/voices", data={"name": "narrator", "ref_text": "Hi."},
                              files={"audio_sample": ("v.wav", clip.getvalue(), "audio/wav")})
        assert created.status_code == 200, created.text
    yield live
    live.stop()


def _speak(server, voice: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/speech", timeout=10,
                      json={"input": "Hi.", "voice": voice, "response_format": "pcm"})


def test_an_alias_of_default_is_zero_shot(server):
    assert _speak(server, "alloy").status_code == 200
    assert server.engine.requests[-1].reference is None


def test_an_alias_of_a_registered_voice_clones_it(server):
    assert _speak(server, "nova").status_code == 200
    by_alias = server.engine.requests[-1].reference
    assert _speak(server, "narrator").status_code == 200
    assert by_alias is not None and by_alias.content_key == server.engine.requests[-1].reference.content_key


@pytest.mark.parametrize("voice, words", [
    ("onyx", "stands for 'ghost' (--voice-alias), which is not registered"),
    ("echo", "OpenAI's stock voices do not exist for this model"),
])
def test_unregistered_targets_and_unaliased_stock_names_are_400s(server, voice, words):
    response = _speak(server, voice)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "voice" and words in error["message"]
