"""Registered voices across replicas: one canonical registry in front, copied to every replica.

The front end validates and stores an upload once (the same `VoiceRegistry` the single server
uses, in its own --voices-dir), then fans it out to every replica's voice API. Each replica keeps
its own copy, so nothing needs a shared filesystem and a replica on another host works the same.
A replica that was down, restarted or started later is reconciled against the canonical list
before it takes traffic (missing voices added, deleted ones removed). Every replica receives the
same normalised 24 kHz clip, so all of them encode it to the same reference codes.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from higgs_serve.voices.registry import Voice, VoiceRegistry

logger = logging.getLogger(__name__)


async def push_voice(client: httpx.AsyncClient, url: str, registry: VoiceRegistry,
                     voice: Voice) -> None:
    audio = (registry.directory / voice.name / "audio.wav").read_bytes()
    data = {"name": voice.name}
    if voice.ref_text:
        data["ref_text"] = voice.ref_text
    response = await client.post(f"{url}/v1/audio/voices", data=data,
                                 files={"audio_sample": ("audio.wav", audio, "audio/wav")})
    if response.status_code == 409:  # already there (a retried fan-out)
        return
    response.raise_for_status()


async def remove_voice(client: httpx.AsyncClient, url: str, name: str) -> None:
    response = await client.delete(f"{url}/v1/audio/voices/{name}")
    if response.status_code != 404:
        response.raise_for_status()


async def reconcile(client: httpx.AsyncClient, url: str, registry: VoiceRegistry) -> None:
    """Make the replica at `url` hold exactly the canonical voices."""
    listed = await client.get(f"{url}/v1/audio/voices")
    listed.raise_for_status()
    present = {item["name"] for item in listed.json()["data"]}
    wanted = {voice.name: voice for voice in registry.list()}
    for name in sorted(present - wanted.keys()):
        await remove_voice(client, url, name)
    for name in sorted(wanted.keys() - present):
        await push_voice(client, url, registry, wanted[name])


async def fan_out(calls: dict[str, asyncio.Future]) -> list[str]:
    """Run per-replica calls together; the ids of the replicas that failed (logged)."""
    results = await asyncio.gather(*calls.values(), return_exceptions=True)
    failed = []
    for replica_id, result in zip(calls, results):
        if isinstance(result, BaseException):
            logger.warning("voice fan-out to replica %s failed: %r", replica_id, result)
            failed.append(replica_id)
    return failed
