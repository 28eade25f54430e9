"""Issue 27 item 3: progress for long phases. A tqdm bar on a terminal, throttled log lines
otherwise; the weight readers (checkpoint and random weights) report every tensor."""

from __future__ import annotations

import io
import logging

import pytest

from higgs_serve import progress
from higgs_serve.model.checkpoint import read_safetensors
from higgs_serve.model.tiny import build_dummy_tensors, write_tiny_model
from higgs_serve.progress import ProgressReporter


class Recorder:
    def __init__(self):
        self.calls: list[tuple[int, int, str]] = []

    def __call__(self, done: int, total: int, label: str) -> None:
        self.calls.append((done, total, label))


def _assert_counts_every_tensor(calls, expected_total: int, label: str) -> None:
    assert calls[0] == (0, expected_total, label)
    assert [done for done, _, _ in calls] == list(range(expected_total + 1))
    assert {(total, lab) for _, total, lab in calls} == {(expected_total, label)}


@pytest.mark.parametrize("shards", [1, 3])
def test_checkpoint_read_reports_every_tensor(tmp_path, shards):
    write_tiny_model(tmp_path, shards=shards)
    recorder = Recorder()
    tensors = read_safetensors(tmp_path, on_progress=recorder)
    _assert_counts_every_tensor(recorder.calls, len(tensors), "loading weights")
    assert read_safetensors(tmp_path).keys() == tensors.keys()  # the same tensors without a callback


def test_dummy_weights_report_every_tensor(tiny_spec):
    recorder = Recorder()
    built = build_dummy_tensors(tiny_spec, on_progress=recorder)
    _assert_counts_every_tensor(recorder.calls, len(built.talker) + len(built.codec), "building random weights")
    again = build_dummy_tensors(tiny_spec)  # the callback changes nothing in the result
    assert all((again.talker[n] == t).all() for n, t in built.talker.items())


def test_without_a_terminal_a_fast_phase_logs_one_line(caplog):
    caplog.set_level(logging.INFO, logger="higgs_serve.progress")
    report = ProgressReporter(stream=io.StringIO(), tty=False)
    for done in range(101):
        report(done, 100, "loading weights")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("loading weights: 100/100 (100%)")


def test_without_a_terminal_a_slow_phase_logs_tenths_and_heartbeats(caplog, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    caplog.set_level(logging.INFO, logger="higgs_serve.progress")
    report = ProgressReporter(stream=io.StringIO(), tty=False)
    for done in range(0, 101):  # 2 s a step
        report(done, 100, "building random weights", detail=f"step {done}")
        clock[0] += 2.0
    lines = [r.getMessage() for r in caplog.records]
    # after the first second, every step crosses the 1 s gap; only a new tenth (or 5 s) logs
    assert 10 <= len(lines) <= 41
    assert lines[-1] == "building random weights: 100/100 (100%), step 100, 200.0 s"
    assert all("(" in line for line in lines)


def test_on_a_terminal_a_bar_per_label():
    stream = io.StringIO()
    report = ProgressReporter(stream=stream, tty=True, unit="tensor")
    for done in range(11):
        report(done, 10, "loading weights")
    report(1, 2, "synthesizing", detail="3.0 s audio, RTF 0.50")
    report(2, 2, "synthesizing", detail="6.0 s audio, RTF 0.40")
    out = stream.getvalue()
    assert "loading weights: 100%" in out and "10/10" in out and "tensor" in out
    assert "synthesizing: 100%" in out and "2/2" in out and "6.0 s audio, RTF 0.40" in out
