"""Voices under concurrency and damage (issue 28): deterministic interleavings (events and
barriers, no sleeps) through the real HTTP layer and the fake engine.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fake_engine import FakeEngine, fake_deploy
from hostile import GatedEncoder, tone_wav
from live_server import fake_settings, start_threaded_server

from higgs_serve.voices import registry as registry_module


# ----------------------------------------------------------------------------- voices (fake engine)
@pytest.fixture
def voice_server(tmp_path):
    encoder = GatedEncoder()
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=2, max_tokens=200))
    live = start_threaded_server(engine, fake_settings(tmp_path), reference_encoder=encoder)
    yield live, encoder
    live.stop()


def test_a_voice_replaced_while_encoding_keeps_its_own_codes(voice_server):
    """Deterministic interleaving: a speech request encodes voice v (held in the encoder); v is
    deleted and registered again with another clip; the request finishes. The new v must not
    get the old clip's codes (before: they were written into it and persisted)."""
    live, encoder = voice_server
    registry = live.app.state.server.voices
    with httpx.Client(base_url=live.url, timeout=30) as http:
        assert http.post("/v1/audio/voices", data={"name": "v"},
                         files={"audio_sample": ("a.wav", tone_wav(1.0, 220))}).is_success
        encoder.release.clear()
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(http.post, "/v1/audio/speech", json={"input": "hi", "voice": "v"})
            assert encoder.entered.wait(10)
            assert http.delete("/v1/audio/voices/v").status_code == 200
            assert http.post("/v1/audio/voices", data={"name": "v"},
                             files={"audio_sample": ("b.wav", tone_wav(2.0, 330))}).is_success
            encoder.release.set()
            assert first.result().status_code == 200  # it began before the delete: served
        assert registry.cached_codes("v") is None
        assert not (registry.directory / "v" / "codes.npy").exists()
        assert http.post("/v1/audio/speech", json={"input": "hi", "voice": "v"}).status_code == 200
    assert encoder.calls == [24000, 48000]  # the new voice was encoded from its own clip
    assert registry.cached_codes("v")[0, 0] == 48000 % 1000


def test_concurrent_registrations_of_one_name_are_one_success_and_409s(voice_server):
    live, _ = voice_server
    barrier = threading.Barrier(4)

    def register(freq_hz: float) -> int:
        with httpx.Client(base_url=live.url, timeout=30) as http:
            barrier.wait()
            return http.post("/v1/audio/voices", data={"name": "same"},
                             files={"audio_sample": ("c.wav", tone_wav(1.0, freq_hz))}).status_code

    with ThreadPoolExecutor(4) as pool:
        statuses = sorted(pool.map(register, [200, 300, 400, 500]))
    assert statuses[0] < 300 and statuses[1:] == [409, 409, 409], statuses


def _hold_first_decode(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """The first upload's decode waits for `release` (after setting `entered`); others run."""
    entered, release = threading.Event(), threading.Event()
    decode = registry_module.normalise_reference
    calls = []

    def held(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            assert release.wait(10)
        return decode(*args, **kwargs)

    monkeypatch.setattr(registry_module, "normalise_reference", held)
    return entered, release


@pytest.mark.parametrize("overwrite", [True, False])
def test_an_upload_racing_another_for_a_new_name_reports_what_it_did(voice_server, monkeypatch,
                                                                      overwrite):
    """An upload of a name nobody has is held while it decodes; another upload registers the
    name meanwhile. With overwrite=true the held one replaced that voice and says so (it said
    "replaced": false, from a look taken before its decode); without, its 409 is the same
    `voice_exists` an early refusal gives (it was `conflict`)."""
    live, _ = voice_server
    entered, release = _hold_first_decode(monkeypatch)
    with httpx.Client(base_url=live.url, timeout=30) as http, ThreadPoolExecutor(1) as pool:
        held = pool.submit(http.post, "/v1/audio/voices",
                           data={"name": "w", "overwrite": str(overwrite).lower()},
                           files={"audio_sample": ("a.wav", tone_wav(1.0, 220))})
        assert entered.wait(10)
        other = http.post("/v1/audio/voices", data={"name": "w"},
                          files={"audio_sample": ("b.wav", tone_wav(2.0, 330))})
        assert other.status_code == 200 and other.json()["replaced"] is False
        release.set()
        answer = held.result()
    if overwrite:
        assert answer.status_code == 200 and answer.json()["replaced"] is True, answer.text
        assert live.app.state.server.voices.get("w").duration_s == 1.0
    else:
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "voice_exists"


def test_a_voice_folder_without_audio_is_not_listed_and_never_500s(tmp_path):
    voices = tmp_path / "voices"
    (voices / "ghost").mkdir(parents=True)
    (voices / "ghost" / "voice.json").write_text(json.dumps({
        "name": "ghost", "ref_text": None, "created_at": 0, "duration_s": 1.0,
        "sample_rate_hz": 24000}))
    (voices / "empty").mkdir()
    (voices / "empty" / "voice.json").write_text("")
    live = start_threaded_server(FakeEngine(), fake_settings(tmp_path),
                                 reference_encoder=GatedEncoder())
    try:
        with httpx.Client(base_url=live.url, timeout=30) as http:
            assert http.get("/v1/audio/voices").json()["data"] == []
            response = http.post("/v1/audio/speech", json={"input": "hi", "voice": "ghost"})
            assert response.status_code == 400 and response.json()["error"]["param"] == "voice"
    finally:
        live.stop()
