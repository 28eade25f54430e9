"""Registered voices across replicas: one canonical registry in front, copied to every replica.

The front end validates and stores an upload once (the same `VoiceRegistry` the single server
uses, in its own --voices-dir), then fans it out to every replica's voice API. Each replica keeps
its own copy, so nothing needs a shared filesystem and a replica on another host works the same.
A replica that was down, restarted or started later is reconciled against the canonical list
before it takes traffic (missing voices added, deleted ones removed). Every replica receives the
same normalised 24 kHz clip, so all of them encode it to the same reference codes.

Which replica holds what is one number: the registry's `version` moves on every change, and a
replica's `synced_version` says which version it holds. A change is applied at once to the
replicas that hold the version before it (they then hold the new one); any other replica (not
ready, restarting, being resynced, or one the change failed on) lags, and the supervisor resyncs
it before it takes traffic again. So a change made while a replica is being resynced is never
lost: the resync ends behind the registry's version and runs again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING

import httpx

from higgs_serve.voices.registry import Voice, VoiceRegistry

if TYPE_CHECKING:
    from higgs_serve.cluster.replicas import Replica

logger = logging.getLogger(__name__)


def upload_fields(voice: Voice) -> dict[str, str]:
    """The form fields that recreate `voice` on a replica (replacing one of the same name)."""
    data = {"name": voice.name, "overwrite": "true"}
    for key in ("ref_text", "consent", "speaker_description"):
        value = getattr(voice, key, None)
        if value:
            data[key] = value
    return data


async def push_voice(client: httpx.AsyncClient, url: str, voice: Voice, audio: bytes) -> None:
    """Register `voice` (its normalised clip `audio`, wav bytes) on the replica at `url`."""
    response = await client.post(f"{url}/v1/audio/voices", data=upload_fields(voice),
                                 files={"audio_sample": ("audio.wav", audio, "audio/wav")})
    response.raise_for_status()


class FanOutRegistry(VoiceRegistry):
    """The front end's canonical registry: every successful add or delete is then applied to the
    replicas that are in step (module note), in the same worker thread, before the upload or
    delete request is answered. `mark_down(replica)`: route around a replica the change failed on."""

    def __init__(self, directory, sample_rate_hz: int, replicas: Mapping[str, Replica],
                 mark_down: Callable[[Replica], None]):
        super().__init__(directory, sample_rate_hz)
        self.replicas = replicas
        self.mark_down = mark_down
        self.version = 0
        self._changing = threading.Lock()  # one change reaches the replicas at a time

    def register(self, name: str, audio_bytes: bytes, ref_text: str | None = None,
                 **options) -> tuple[Voice, bool]:  # `add` comes here too
        voice, replaced = super().register(name, audio_bytes, ref_text, **options)
        self._fan_out("add", voice)
        return voice, replaced

    def delete(self, name: str) -> bool:
        deleted = super().delete(name)
        if deleted:
            self._fan_out("delete", name)
        return deleted

    def _fan_out(self, kind: str, subject) -> None:
        with self._changing:
            before, after = self.version, self.version + 1
            audio = stored_audio_or_none(self, subject.name) if kind == "add" else None
            for replica in self.replicas.values():
                if not replica.serving or replica.synced_version != before:
                    continue  # it lags: the supervisor resyncs it before it serves again
                try:
                    with replica.sync_client(timeout=120) as client:
                        if kind == "delete":
                            _raise_unless_missing(client.delete(f"/v1/audio/voices/{subject}"))
                        elif audio is not None:  # None: deleted meanwhile, its delete follows
                            client.post("/v1/audio/voices", data=upload_fields(subject), files={
                                "audio_sample": ("audio.wav", audio, "audio/wav")}).raise_for_status()
                    replica.synced_version = after
                except httpx.HTTPError as error:
                    logger.warning("replica %s: voice %s failed (%s); it resyncs before serving "
                                   "again", replica.id, kind, error)
                    replica.synced_version = -1
                    self.mark_down(replica)
            self.version = after


def _raise_unless_missing(response: httpx.Response) -> None:
    if response.status_code != 404:
        response.raise_for_status()


def stored_audio_or_none(registry: VoiceRegistry, name: str) -> bytes | None:
    """The clip, or None when the voice was deleted meanwhile."""
    try:
        return stored_audio(registry, name)
    except FileNotFoundError:
        return None


def stored_audio(registry: VoiceRegistry, name: str) -> bytes:
    """The canonical normalised clip of a registered voice (wav bytes)."""
    return (registry.directory / name / "audio.wav").read_bytes()


async def remove_voice(client: httpx.AsyncClient, url: str, name: str) -> None:
    _raise_unless_missing(await client.delete(f"{url}/v1/audio/voices/{name}"))


async def reconcile(client: httpx.AsyncClient, url: str, wanted: Mapping[str, Voice],
                    audio: Callable[[str], Awaitable[bytes | None]], *, push_all: bool = False,
                    again: Collection[str] = ()) -> None:
    """Make the replica at `url` hold exactly the voices `wanted` (name -> Voice); `audio(name)`
    fetches a clip (None: deleted meanwhile, skipped). push_all: send every wanted voice again (overwriting), for a replica that may
    have missed a replacement; else the ones it lacks and those named in `again` (replaced since
    it last got them)."""
    listed = await client.get(f"{url}/v1/audio/voices")
    listed.raise_for_status()
    present = {item["name"] for item in listed.json()["data"]}
    for name in sorted(present - wanted.keys()):
        await remove_voice(client, url, name)
    pushed = wanted.keys() if push_all else (wanted.keys() - present) | (wanted.keys() & set(again))
    for name in sorted(pushed):
        clip = await audio(name)
        if clip is not None:
            await push_voice(client, url, wanted[name], clip)


def voice_json(voice: Voice) -> dict:
    return {"object": "voice", "name": voice.name, "ref_text": voice.ref_text,
            "created_at": voice.created_at, "duration_s": voice.duration_s,
            "sample_rate_hz": voice.sample_rate_hz, "consent": voice.consent,
            "speaker_description": voice.speaker_description}
