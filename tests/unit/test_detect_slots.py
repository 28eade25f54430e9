"""Issue 61: watermark detections wait their turn for a slot, within a bound
(server/limits/detect_slots.py): first come first served, refused at once only when the wait they
face is plainly past the bound (with that wait as Retry-After), refused after the bound otherwise,
and a waiter that leaves gives up its place (or passes on the slot it was just handed)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from higgs_serve.server.limits.detect_slots import DetectorBusyError, DetectSlots


def _blocker() -> tuple[threading.Event, callable]:
    """A detection that runs until the event is set; returns its name when it does."""
    gate = threading.Event()

    def detect(name: str) -> str:
        assert gate.wait(30)
        return name

    return gate, detect


async def _hold_the_slot(slots: DetectSlots):
    """A detection ("held") that takes the one slot until its gate is set: (gate, detect, held)."""
    gate, detect = _blocker()
    held = asyncio.ensure_future(slots.run(detect, "held"))
    await _until(lambda: slots.in_flight == 1)
    return gate, detect, held


async def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.002)


def test_waiters_are_served_in_arrival_order():
    async def run():
        slots = DetectSlots(running=1, wait_s=30)
        gate, detect = _blocker()
        finished = []

        async def one(name):
            finished.append(await slots.run(detect, name))

        tasks = [asyncio.ensure_future(one("d0"))]
        await _until(lambda: slots.in_flight == 1)
        for i in range(1, 5):
            tasks.append(asyncio.ensure_future(one(f"d{i}")))
            await _until(lambda: slots.in_flight == i + 1)
        gate.set()
        await asyncio.gather(*tasks)
        slots.shutdown()
        return finished, slots.in_flight

    finished, in_flight = asyncio.run(run())
    assert finished == ["d0", "d1", "d2", "d3", "d4"] and in_flight == 0


def test_a_wait_past_the_bound_is_a_429_and_the_slot_stays_usable():
    async def run():
        slots = DetectSlots(running=1, wait_s=0.2)
        gate, detect, held = await _hold_the_slot(slots)
        with pytest.raises(DetectorBusyError) as refused:
            await slots.run(detect, "late")
        assert slots.in_flight == 1  # the refused one left the queue
        gate.set()
        assert await held == "held"
        assert await slots.run(detect, "next") == "next"
        slots.shutdown()
        return refused.value

    refused = asyncio.run(run())
    assert refused.retry_after_s >= 1 and "would wait more than 0.2 s" in str(refused)


def test_a_wait_plainly_past_the_bound_is_refused_at_once_with_its_length():
    """Once detections have taken ~0.3 s each, a newcomer behind a running one faces ~0.3 s:
    with a 0.25 s bound it is refused at once (not after waiting), Retry-After 1."""
    async def run():
        slots = DetectSlots(running=1, wait_s=0.25)
        await slots.run(time.sleep, 0.3)  # the measured time: at least 0.3 s
        gate, detect, held = await _hold_the_slot(slots)
        started = time.monotonic()
        with pytest.raises(DetectorBusyError) as refused:
            await slots.run(detect, "late")
        waited_s, mean_s = time.monotonic() - started, slots.mean_s
        gate.set()
        await held
        slots.shutdown()
        return refused.value, waited_s, mean_s

    refused, waited_s, mean_s = asyncio.run(run())
    assert mean_s >= 0.3 and refused.retry_after_s == 1
    assert waited_s < 0.25  # refused before the bound, not at it


def test_a_waiter_that_leaves_gives_up_its_place():
    async def run():
        slots = DetectSlots(running=1, wait_s=30)
        gate, detect, held = await _hold_the_slot(slots)
        leaving = asyncio.ensure_future(slots.run(detect, "leaving"))
        staying = asyncio.ensure_future(slots.run(detect, "staying"))
        await _until(lambda: slots.in_flight == 3)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        assert slots.in_flight == 2
        gate.set()
        results = await asyncio.gather(held, staying)
        slots.shutdown()
        return results, slots.in_flight

    results, in_flight = asyncio.run(run())
    assert results == ["held", "staying"] and in_flight == 0


def test_a_bound_of_zero_refuses_at_once_when_every_slot_is_busy():
    async def run():
        slots = DetectSlots(running=2, wait_s=0)
        gate, detect = _blocker()
        held = [asyncio.ensure_future(slots.run(detect, n)) for n in ("a", "b")]
        await _until(lambda: slots.in_flight == 2)
        with pytest.raises(DetectorBusyError):
            await slots.run(detect, "c")
        gate.set()
        await asyncio.gather(*held)
        slots.shutdown()

    asyncio.run(run())


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        DetectSlots(running=0)
    with pytest.raises(ValueError):
        DetectSlots(wait_s=-1)


def test_the_bound_is_the_servers_and_the_front_ends_setting(tmp_path):
    """--detect-wait-s reaches the single server's slots and the front end's control plane."""
    from higgs_serve.cluster.state import FrontendSettings
    from higgs_serve.server.settings import ServerSettings
    from higgs_serve.server.state import ServerState

    settings = ServerSettings(detect_wait_s=2.5, voices_dir=tmp_path, encode_processes=0,
                              alignment_workers=0)
    state = ServerState(engine=None, settings=settings, voices=None, metrics=None, gate=None,
                        reference_encoder=None)
    try:
        assert state.detect_slots.wait_s == 2.5
    finally:
        state.detect_slots.shutdown()
        state.audio_workers.shutdown()
        state.encode_workers.shutdown()
    assert FrontendSettings.of(settings).detect_wait_s == 2.5
