import io

import numpy as np
import pytest
import soundfile as sf

from higgs_serve.errors import InvalidRequestError
from higgs_serve.voices.registry import MAX_UPLOAD_BYTES, VoiceRegistry, normalise_reference


def _wav_bytes(seconds: float = 1.0, rate: int = 24000, channels: int = 1) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    audio = (0.4 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    if channels > 1:
        audio = np.stack([audio] * channels, axis=1)
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_add_list_get_and_survive_a_restart(tmp_path):
    registry = VoiceRegistry(tmp_path)
    voice = registry.add("alice", _wav_bytes(1.0), ref_text="Hello there.")
    assert (voice.name, voice.ref_text, voice.duration_s, voice.sample_rate_hz) == \
        ("alice", "Hello there.", 1.0, 24000)
    registry.add("bob_2", _wav_bytes(0.5, rate=16000, channels=2))
    reopened = VoiceRegistry(tmp_path)  # a restart: everything comes back from disk
    assert [v.name for v in reopened.list()] == ["alice", "bob_2"]
    assert reopened.get("alice") == voice
    bob = reopened.load_audio("bob_2")
    assert bob.dtype == np.float32 and bob.ndim == 1 and abs(bob.shape[0] - 12000) <= 1


def test_codes_cache_and_delete(tmp_path):
    registry = VoiceRegistry(tmp_path)
    registry.add("carol", _wav_bytes())
    assert registry.cached_codes("carol") is None
    codes = np.arange(40, dtype=np.int64).reshape(5, 8)
    registry.store_codes("carol", codes)
    assert np.array_equal(VoiceRegistry(tmp_path).cached_codes("carol"), codes)
    assert registry.delete("carol") is True
    assert registry.delete("carol") is False
    assert registry.get("carol") is None and not (tmp_path / "carol").exists()
    assert VoiceRegistry(tmp_path).list() == []


@pytest.mark.parametrize("name, match", [
    ("", "voice name must be"), ("../evil", "voice name must be"), (".hidden", "voice name"),
    ("a" * 65, "voice name must be"), ("default", "reserved"),
])
def test_bad_names_are_refused(tmp_path, name, match):
    with pytest.raises(InvalidRequestError, match=match) as info:
        VoiceRegistry(tmp_path).add(name, _wav_bytes())
    assert info.value.param == "name"


def test_duplicates_bad_audio_and_durations_are_refused(tmp_path):
    registry = VoiceRegistry(tmp_path)
    registry.add("dave", _wav_bytes())
    with pytest.raises(InvalidRequestError, match="already exists"):
        registry.add("dave", _wav_bytes())
    with pytest.raises(InvalidRequestError, match="not a supported audio file") as info:
        registry.add("eve", b"not audio at all")
    assert info.value.param == "audio_sample"
    with pytest.raises(InvalidRequestError, match="must last"):
        registry.add("eve", _wav_bytes(0.05))
    with pytest.raises(InvalidRequestError, match="limit"):
        registry.add("eve", b"\0" * (MAX_UPLOAD_BYTES + 1))
    assert [v.name for v in registry.list()] == ["dave"]


def test_interrupted_upload_is_cleaned_on_start(tmp_path):
    staging = tmp_path / ".staging-abc"
    staging.mkdir()
    (staging / "voice.json").write_text("{}")
    assert VoiceRegistry(tmp_path).list() == []
    assert not staging.exists()


def test_normalise_reference_resamples_to_the_model_rate():
    audio = normalise_reference(_wav_bytes(1.0, rate=48000), 24000, param="ref_audio")
    assert audio.shape[0] == 24000 and audio.dtype == np.float32
