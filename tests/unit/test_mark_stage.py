"""The watermark stage (engine/mark_stage.py) on its own: every chunk marked in its request's
order, shortest windows first across requests, ends and errors passed on in order, a failed
call failing only its batch. The watermark here is a stand-in whose residual says which window
it was computed from; the real one is tested in tests/unit/test_watermark.py and, behind the
engine, in tests/engine/test_watermark_engine.py."""

from __future__ import annotations

import threading

import numpy as np

from higgs_serve.engine.async_engine import CollectingSink
from higgs_serve.engine.mark_stage import MarkStage, _Item, next_batch
from higgs_serve.engine.speech import AudioChunk

CONTEXT = 4


class Recording:
    """A watermark whose residual is the window's mean (so a chunk's change shows its context),
    remembering each call's window lengths; `gate` holds calls until set."""

    name, sample_rate_hz, context_samples = "test", 24_000, CONTEXT

    def __init__(self):
        self.calls: list[list[int]] = []
        self.entered = threading.Event()  # a call has begun
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next = False

    def residuals(self, windows):
        self.entered.set()
        self.gate.wait(10)
        self.calls.append([w.size for w in windows])
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        return [np.full(w.size, w.mean(), np.float32) for w in windows]

    def score(self, audio):
        return 0.0


def chunk(values, final=False, reason=None):
    audio = np.asarray(values, np.float32)
    return AudioChunk(audio, final, 0, reason)


def test_each_chunk_gets_its_own_windows_change_in_order():
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=8)
    stage.start()
    sink = CollectingSink(None, "a")
    wrapped = stage.wrap(sink)
    wrapped.put(chunk([1, 1]))
    wrapped.put(chunk([3, 3, 3, 3]))
    wrapped.put(chunk([], final=True, reason="stop"))
    assert sink.done.wait(10)
    stage.stop()
    # window 1: the chunk alone, [1, 1] -> mean 1; window 2: the 2 samples before it (of up to
    # CONTEXT) and the chunk, [1, 1, 3, 3, 3, 3] -> 7/3
    expected = [[2.0] * 2, [3 + 7 / 3] * 4, []]
    for got, want in zip([c.audio for c in sink.chunks], expected, strict=True):
        np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=1e-6)
    assert sink.chunks[-1].is_final and sink.chunks[-1].finish_reason == "stop"
    assert stage.counters.chunks == 2 and stage.counters.calls == 2
    assert stage.counters.audio_s == 6 / 24_000


def test_the_shortest_windows_go_first_one_per_request():
    sinks = [CollectingSink(None, str(i)) for i in range(3)]
    items = [_Item(sinks[0], chunk([0] * 8), np.zeros(12), stream_id=1),
             _Item(sinks[0], chunk([0]), np.zeros(5), stream_id=1),  # behind its request's first
             _Item(sinks[1], chunk([0] * 2), np.zeros(6), stream_id=2),
             _Item(sinks[2], chunk([0] * 2), np.zeros(6), stream_id=3)]
    assert next_batch(items, 8) == items[2:]
    assert next_batch(items, 1) == [items[2]]
    end = _Item(sinks[1], chunk([], final=True), None, stream_id=2)
    assert next_batch([items[0], end], 8) == [end]  # ends are never held behind audio


def test_the_earliest_deadline_is_marked_first():
    """Issue 53: a chunk carries its stream's deadline when queued (`wrap(sink, deadline)`); the
    most urgent picks the window length, chunks without a deadline wait."""
    sinks = [CollectingSink(None, str(i)) for i in range(4)]
    items = [_Item(sinks[0], chunk([0] * 2), np.zeros(6), stream_id=1, deadline_us=None),
             _Item(sinks[1], chunk([0] * 8), np.zeros(12), stream_id=2, deadline_us=900),
             _Item(sinks[2], chunk([0] * 8), np.zeros(12), stream_id=3, deadline_us=700),
             _Item(sinks[3], chunk([0] * 2), np.zeros(6), stream_id=4, deadline_us=5_000)]
    assert next_batch(items, 8) == [items[2], items[1]]
    assert next_batch(items, 1) == [items[2]]
    assert next_batch([items[0], items[3]], 8) == [items[3], items[0]]  # a deadline, then none


def test_a_first_chunk_overtakes_queued_long_chunks_of_other_requests():
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=8)
    busy, fresh = CollectingSink(None, "busy"), CollectingSink(None, "fresh")
    busy_in, fresh_in = stage.wrap(busy), stage.wrap(fresh)
    wm.gate.clear()
    stage.start()
    busy_in.put(chunk([0.1] * 100))  # taken at once; held in the watermark by the gate
    assert wm.entered.wait(10)
    for _ in range(3):
        busy_in.put(chunk([0.1] * 100))
    fresh_in.put(chunk([0.2] * 2, final=True))
    wm.gate.set()
    assert fresh.done.wait(10)
    busy_in.put(chunk([], final=True))
    assert busy.done.wait(10)
    stage.stop()
    assert wm.calls == [[100], [2], [104], [104], [104]]


def test_a_failed_call_fails_its_requests_only_and_errors_keep_their_place():
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=8)
    stage.start()
    ok, bad = CollectingSink(None, "ok"), CollectingSink(None, "bad")
    ok_in, bad_in = stage.wrap(ok), stage.wrap(bad)
    wm.fail_next = True
    bad_in.put(chunk([1.0] * 4))
    assert bad.done.wait(10) and isinstance(bad.error, RuntimeError)
    ok_in.put(chunk([1.0] * 4))
    ok_in.fail(ValueError("codec died"))
    assert ok.done.wait(10)
    stage.stop()
    assert len(ok.chunks) == 1 and isinstance(ok.error, ValueError)  # the chunk first, then the error


def test_stop_delivers_what_is_queued():
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=8)
    sink = CollectingSink(None, "a")
    wrapped = stage.wrap(sink)
    stage.start()
    for _ in range(5):
        wrapped.put(chunk([0.5] * 10))
    wrapped.put(chunk([], final=True))
    stage.stop()
    assert sink.done.is_set() and len(sink.chunks) == 6
