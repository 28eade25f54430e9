"""Real clients, used unmodified, against a real server on the tiny model (issue 41), started with
docs/api.md's recipe for OpenAI-only clients: served names `tts-1` and `gpt-4o-mini-tts`, stock
voice names aliased (--voice-alias). Each client must hear audio before the clip is complete:
its first audio arrives before half the total time of an input of ~20 s of speech.

- the `openai` SDK: the default `create` (no `stream`: streamed, but wav and flac, whose header
  states the length, as a file) in every format, and `with_streaming_response` (`stream: true`);
- LiveKit Agents' OpenAI TTS (`livekit-plugins-openai`): its own class, its own base_url, its
  defaults (model gpt-4o-mini-tts, voice ash, mp3 over SSE), frames as its emitter decodes them;
- Pipecat's OpenAI TTS service: pipecat-ai cannot be installed beside this project (it pins
  soxr ~= 1.0.0 against our 1.1.0, and brings onnxruntime and numba), so its HTTP client code is
  driven the way `OpenAITTSService.run_tts` (pipecat-ai 1.14.0) drives it: AsyncOpenAI, model
  gpt-4o-mini-tts, voice alloy, response_format pcm, no `stream`, iter_bytes of 0.5 s chunks.
"""

from __future__ import annotations

import asyncio
import io
import time

import openai
import pytest
import soundfile as sf
from live_server import serve_subprocess
from support.decoders import av_decode

from higgs_serve.audio.formats import FORMATS

RATE = 24000
# ~32 text tokens: the tiny model speaks to its text's frame cap, 4 s + 0.5 s a token (~20 s)
SPEECH_20S = "The quick brown fox jumps over the lazy dog again today."
RECIPE = ["--served-model-name", "higgs-audio-v3", "tts-1", "gpt-4o-mini-tts",
          "--voice-alias", "alloy=default", "--voice-alias", "ash=default"]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("agents")
    with serve_subprocess(tiny_model_dir, work, [*RECIPE, "--voices-dir", str(work / "v")]) as s:
        yield s


def _early(first_s: float, total_s: float, audio_s: float) -> None:
    assert audio_s >= 15.0, audio_s  # ~20 s of speech
    assert first_s < total_s / 2, (first_s, total_s)


def test_openai_sdk_streams_its_default_format_when_asked(server):
    """The SDK's with_streaming_response in our default format (wav; OpenAI's is mp3) hears
    audio early with `stream: true`; without it a wav is one file whose header states its
    length (docs/api.md#streaming; test_openai_sdk_default_create_in_every_format)."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    started = time.perf_counter()
    first_s, data = None, bytearray()
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=SPEECH_20S, extra_body={"stream": True}) as response:
        assert response.headers["content-type"] == "audio/wav"  # our default (OpenAI's: mp3)
        for piece in response.iter_bytes():
            first_s = first_s if first_s is not None else time.perf_counter() - started
            data += piece
    total_s = time.perf_counter() - started
    _early(first_s, total_s, av_decode(bytes(data), "wav", RATE).size / RATE)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_openai_sdk_default_create_in_every_format(server, fmt):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    audio = client.audio.speech.create(model="gpt-4o-mini-tts", voice="ash", input="Hello.",
                                       response_format=fmt, extra_body={"max_new_tokens": 30})
    rate = FORMATS[fmt].default_rate_hz or RATE
    assert av_decode(audio.content, fmt, rate).size >= 30 * rate // 25
    if fmt in ("wav", "flac", "mp3", "opus"):  # soundfile reads these (wav, flac: files)
        assert sf.read(io.BytesIO(audio.content))[1] == rate
    is_file = "content-length" in audio.response.headers
    assert is_file == (fmt in ("wav", "flac"))  # their header states the length


def test_livekit_openai_tts_unmodified(server):
    from livekit.plugins import openai as livekit_openai

    async def synthesize() -> tuple[float, float, int]:
        tts = livekit_openai.TTS(base_url=f"{server.url}/v1", api_key="unused")
        started, first_s, samples = time.perf_counter(), None, 0
        try:
            async with tts.synthesize(SPEECH_20S) as stream:
                async for event in stream:
                    first_s = first_s if first_s is not None else time.perf_counter() - started
                    assert event.frame.sample_rate == RATE
                    samples += event.frame.samples_per_channel
        finally:
            await tts.aclose()
        return first_s, time.perf_counter() - started, samples

    first_s, total_s, samples = asyncio.run(synthesize())
    _early(first_s, total_s, samples / RATE)


def test_pipecat_openai_tts_request_as_run_tts_sends_it(server):
    async def run_tts() -> tuple[float, float, int]:
        client = openai.AsyncOpenAI(api_key="unused", base_url=f"{server.url}/v1")
        params = {"input": SPEECH_20S, "model": "gpt-4o-mini-tts", "voice": "alloy",
                  "response_format": "pcm"}
        chunk_size = int(RATE * 0.5 * 2)  # TTSService.chunk_size: 0.5 s of 16-bit audio
        started, first_s, size = time.perf_counter(), None, 0
        async with client.audio.speech.with_streaming_response.create(**params) as r:
            assert r.status_code == 200
            async for chunk in r.iter_bytes(chunk_size):
                first_s = first_s if first_s is not None else time.perf_counter() - started
                size += len(chunk)
        await client.close()
        return first_s, time.perf_counter() - started, size

    first_s, total_s, size = asyncio.run(run_tts())
    _early(first_s, total_s, size / 2 / RATE)


def test_unaliased_stock_names_and_unserved_models_keep_their_clear_errors(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model="tts-1", voice="echo", input="Hi.")
    error = info.value.body
    assert error["param"] == "voice" and "--voice-alias" in error["message"]
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="tts-1-hd", voice="alloy", input="Hi.")
