"""The watermark stage (engine/mark_stage.py) on its own: every chunk marked in its request's
order, every stream's pending window in one call whatever its length, the call's windows chosen
by a pluggable key (shortest first by default), ends and errors passed on in order, and a
failing window or sink failing only its own request. The watermark here is a stand-in whose
residual says which window it was computed from; the real one is tested in
tests/unit/test_watermark.py, test_watermark_batch.py and, behind the engine, in
tests/engine/test_watermark_engine.py."""

from __future__ import annotations

import threading

import numpy as np

from higgs_serve.engine.async_engine import CollectingSink
from higgs_serve.engine.mark_stage import MarkStage, PendingMark, next_batch
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
        if any(np.isnan(w).any() for w in windows):  # a window this watermark cannot mark
            raise ValueError("not finite")
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


def pending(stream_id, window_size, seq, sink=None):
    return PendingMark(sink, chunk([0.0] * window_size), np.zeros(window_size, np.float32),
                       stream_id=stream_id, seq=seq)


def test_every_streams_oldest_window_goes_in_one_call_shortest_first():
    items = [pending(1, 12, 0), pending(1, 5, 1),  # stream 1's second waits behind its first
             pending(2, 6, 2), pending(3, 6, 3), pending(4, 300, 4)]
    assert next_batch(items, 8) == [items[2], items[3], items[0], items[4]]  # every length, one call
    assert next_batch(items, 1) == [items[2]]  # past the cap: the smallest key first
    assert next_batch(items, 2) == [items[2], items[3]]  # equal windows: the oldest first
    end = PendingMark(None, chunk([], final=True), None, stream_id=2, seq=5)
    failed = PendingMark(None, None, error=ValueError("x"), stream_id=5, seq=6)
    assert next_batch([items[0], end, failed], 1) == [end, failed, items[0]]  # never held behind audio


def test_the_order_is_a_key_function_a_deadline_can_replace():
    items = [pending(1, 5, 0), pending(2, 50, 1), pending(3, 500, 2)]
    deadline_s = {1: 9.0, 2: 1.0, 3: 4.0}  # stream -> when its listener runs dry
    by_deadline = lambda item: (deadline_s[item.stream_id], item.seq)  # noqa: E731
    assert next_batch(items, 2, by_deadline) == [items[1], items[2]]
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=1, order=by_deadline)
    sinks = [CollectingSink(None, str(i)) for i in range(3)]
    inputs = [stage.wrap(sink) for sink in sinks]  # stream ids 1, 2, 3
    for wrapped, size in zip(inputs, (5, 50, 500)):
        wrapped.put(chunk([0.1] * size, final=True))
    stage.start()
    assert all(sink.done.wait(10) for sink in sinks)
    stage.stop()
    assert wm.calls == [[50], [500], [5]]


def test_the_earliest_deadline_is_marked_first():
    """Issue 53: a chunk carries its stream's deadline when queued (`wrap(sink, deadline)`); past
    the cap the most urgent go into the call, chunks without a deadline after those with one."""
    items = [PendingMark(None, chunk([0] * 2), np.zeros(6), stream_id=1, seq=0, deadline_us=None),
             PendingMark(None, chunk([0] * 8), np.zeros(12), stream_id=2, seq=1, deadline_us=900),
             PendingMark(None, chunk([0] * 8), np.zeros(12), stream_id=3, seq=2, deadline_us=700),
             PendingMark(None, chunk([0] * 2), np.zeros(6), stream_id=4, seq=3, deadline_us=5_000)]
    assert next_batch(items, 8) == [items[2], items[1], items[3], items[0]]  # every length, one call
    assert next_batch(items, 1) == [items[2]]
    assert next_batch([items[0], items[3]], 8) == [items[3], items[0]]  # a deadline, then none
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=1)
    sinks = [CollectingSink(None, str(i)) for i in range(3)]
    deadlines = (3_000, 1_000, None)
    inputs = [stage.wrap(sink, (lambda d=d: d) if d is not None else None) for sink, d in zip(sinks, deadlines)]
    for wrapped, size in zip(inputs, (5, 50, 500)):
        wrapped.put(chunk([0.1] * size, final=True))
    stage.start()
    assert all(sink.done.wait(10) for sink in sinks)
    stage.stop()
    assert wm.calls == [[50], [5], [500]]


def test_a_first_chunk_overtakes_queued_long_chunks_of_other_requests():
    for max_batch, calls in ((1, [[100], [2], [104], [104], [104]]), (8, [[100], [2, 104], [104], [104]])):
        wm = Recording()
        stage = MarkStage(wm, max_batch_windows=max_batch)
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
        assert wm.calls == calls  # capped: the first chunk alone first; else in the next call


def test_windows_of_every_length_share_one_call():
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=8)
    sinks = [CollectingSink(None, str(i)) for i in range(4)]
    wm.gate.clear()
    stage.start()
    first = stage.wrap(sinks[0])
    first.put(chunk([0.5] * 7))
    assert wm.entered.wait(10)  # held: the others queue meanwhile
    for sink, size in zip(sinks[1:], (3, 40, 1000)):
        stage.wrap(sink).put(chunk([0.5] * size, final=True))
    first.put(chunk([], final=True))
    wm.gate.set()
    assert all(sink.done.wait(10) for sink in sinks)
    stage.stop()
    assert wm.calls == [[7], [3, 40, 1000]]
    assert stage.counters.calls == 2 and stage.counters.chunks == 4


def test_a_window_that_cannot_be_marked_fails_its_own_request_only():
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=8)
    sinks = [CollectingSink(None, str(i)) for i in range(3)]
    inputs = [stage.wrap(sink) for sink in sinks]
    for i, wrapped in enumerate(inputs):
        wrapped.put(chunk([np.nan if i == 1 else 0.25] * 4))
        wrapped.put(chunk([0.25] * 4, final=True))
    stage.start()
    assert all(sink.done.wait(10) for sink in sinks)
    stage.stop()
    assert wm.calls[:4] == [[4, 4, 4], [4], [4], [4]]  # the failed call, then one window at a time
    assert isinstance(sinks[1].error, ValueError) and not sinks[1].chunks
    for good in (sinks[0], sinks[2]):
        assert good.error is None and len(good.chunks) == 2 and good.chunks[-1].is_final
        np.testing.assert_allclose(good.chunks[0].audio, 0.5)


class Raising(CollectingSink):
    """A sink whose `put` raises (a request whose consumer broke)."""

    def put(self, chunk):
        raise RuntimeError("consumer gone")


def test_a_sink_that_raises_fails_its_own_request_only():
    wm = Recording()
    stage = MarkStage(wm, max_batch_windows=8)
    broken, ok = Raising(None, "broken"), CollectingSink(None, "ok")
    broken_in, ok_in = stage.wrap(broken), stage.wrap(ok)
    broken_in.put(chunk([0.1] * 4))
    ok_in.put(chunk([0.1] * 4))
    ok_in.put(chunk([], final=True))
    stage.start()
    assert ok.done.wait(10) and broken.done.wait(10)
    stage.stop()
    assert isinstance(broken.error, RuntimeError) and str(broken.error) == "consumer gone"
    assert ok.error is None and len(ok.chunks) == 2 and stage.dead_error is None


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
