"""server/last_mile/encode_pool.py and audio/encode_worker.py: responses encoded in encoder processes.

Each test starts its own small pool (1-2 processes, ~0.3 s each) inside its own event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from higgs_serve.audio import encode_wire as wire
from higgs_serve.audio.encode_pipeline import EncodePipeline, EncodeSpec
from higgs_serve.audio.encode_worker import Streams
from higgs_serve.audio.encoders import CPU_HEAVY_FORMATS, apply_patches, open_encoder
from higgs_serve.errors import EncoderFailedError
from higgs_serve.server.last_mile import encode_pool, encoder_process
from higgs_serve.server.last_mile.audio_out import AudioOut
from higgs_serve.server.last_mile.encode_pool import EncodePool

RATE = 24000
CHUNK = 960 * 3


def _audio(seconds: float, freq_hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


def _chunks(audio: np.ndarray) -> list[np.ndarray]:
    return [audio[i:i + CHUNK] for i in range(0, audio.size, CHUNK)]


def _local(spec: EncodeSpec, chunks: list[np.ndarray]) -> tuple[list[bytes], list]:
    """What the same pipeline makes in this process, chunk by chunk: (pieces, patches)."""
    pipeline = EncodePipeline(spec)
    pieces = [pipeline.convert(c, last=False) for c in chunks[:-1]]
    pieces.append(pipeline.convert(chunks[-1], last=True))
    return pieces, pipeline.patches()


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet (it has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(_gone(pid) for pid in pids):
            return True
        time.sleep(0.02)
    return False


async def _stream(pool: EncodePool, spec: EncodeSpec, chunks: list[np.ndarray],
                  pause_s: float = 0.0) -> tuple[list[bytes], list]:
    out = AudioOut(spec.response_format, spec.model_rate_hz, spec.sample_rate_hz, spec.speed, pool,
                   seekable=spec.seekable)
    pieces = []
    for chunk in chunks[:-1]:
        pieces.append(await out.push(chunk))
        await asyncio.sleep(pause_s)  # lets the other streams' calls interleave with this one's
    pieces.append(await out.close(chunks[-1]))
    return pieces, out.patches()


def test_many_streams_at_once_keep_their_state_and_order_chunk_for_chunk():
    """Every heavy format and the time stretch, eight responses interleaved over two processes:
    each chunk's bytes (and a file's patches) equal what the same pipeline makes in-process, so
    a response's codec state stays with it (sticky) and its chunks are encoded in order."""
    specs = [EncodeSpec(fmt, RATE, rate, speed, seekable)
             for fmt, rate, speed, seekable in [("mp3", 24000, 1.0, False), ("mp3", 16000, 1.0, True),
                                                ("aac", 24000, 1.0, False), ("opus", 48000, 1.0, False),
                                                ("flac", 24000, 1.0, True), ("flac", 44100, 1.0, False),
                                                ("wav", 24000, 1.25, True), ("pcm", 24000, 0.8, False)]]
    inputs = [_chunks(_audio(0.9, 150.0 + 40 * i)) for i in range(len(specs))]

    async def run():
        pool = EncodePool(2)
        await pool.start()
        try:
            results = await asyncio.gather(*(_stream(pool, s, c, pause_s=0.001)
                                             for s, c in zip(specs, inputs)))
            assert pool.stats()["encoder_streams"] == 0  # every stream closed
            return results, pool.stats()
        finally:
            await pool.shutdown()

    results, stats = asyncio.run(run())
    assert stats["encoder_processes"] == 2
    for spec, chunks, (pieces, patches) in zip(specs, inputs, results):
        assert (pieces, patches) == _local(spec, chunks), spec


def test_streams_spread_over_the_processes_and_a_dropped_stream_is_forgotten():
    async def run():
        pool = EncodePool(2)
        await pool.start()
        try:
            outs = [AudioOut("mp3", RATE, RATE, 1.0, pool) for _ in range(4)]
            for out in outs:
                await out.push(_audio(0.1))
            per_process = sorted(p.streams for p in pool._processes)
            del outs, out  # four responses gone without close (clients left): their pipelines go
            await asyncio.sleep(0.05)
            return per_process, pool.stats()["encoder_streams"]
        finally:
            await pool.shutdown()

    per_process, left = asyncio.run(run())
    assert per_process == [2, 2] and left == 0


def test_the_worker_forgets_a_dropped_stream_and_reports_a_bad_one():
    streams = Streams()
    spec = EncodeSpec("flac", RATE, RATE)
    assert streams.handle(1, wire.OPEN, spec.to_json()) is None
    status, data = streams.handle(1, wire.PUSH, _audio(0.1).tobytes())
    assert status == wire.OK and data.startswith(b"fLaC")
    assert streams.handle(1, wire.DROP, b"") is None and len(streams) == 0
    assert streams.handle(2, wire.OPEN, EncodeSpec("opus", RATE, 44100).to_json()) is None
    status, message = streams.handle(2, wire.PUSH, b"")  # libopus cannot encode 44.1 kHz
    assert status == wire.FAILED and message
    status, message = streams.handle(3, wire.CLOSE, b"")
    assert (status, message) == (wire.FAILED, b"no open stream 3 for op 3")


def test_a_killed_process_fails_only_its_own_responses_and_is_replaced(caplog):
    """Two responses on two processes; SIGKILL the first's: its next chunk (and a chunk in
    flight when it died) fail with EncoderFailedError, the other response finishes exactly, a
    replacement takes new responses."""
    spec = EncodeSpec("mp3", RATE, RATE)
    chunks = _chunks(_audio(0.6))

    async def run():
        pool = EncodePool(2)
        await pool.start()
        try:
            doomed, survivor = AudioOut("mp3", RATE, RATE, 1.0, pool), AudioOut("mp3", RATE, RATE, 1.0, pool)
            survivor_pieces = [await survivor.push(chunks[0])]
            await doomed.push(chunks[0])
            victim = doomed._remote._process
            assert victim is not survivor._remote._process
            in_flight = asyncio.ensure_future(doomed.push(np.tile(_audio(1.0), 60)))  # ~0.5 s of work
            await asyncio.sleep(0.05)
            os.kill(victim.pid, signal.SIGKILL)
            with pytest.raises(EncoderFailedError, match="stopped"):
                await in_flight
            with pytest.raises(EncoderFailedError):
                await doomed.push(chunks[1])
            for chunk in chunks[1:-1]:
                survivor_pieces.append(await survivor.push(chunk))
            survivor_pieces.append(await survivor.close(chunks[-1]))
            for _ in range(1500):  # the replacement starts in the background (a loaded host: seconds)
                if pool.restarts:
                    break
                await asyncio.sleep(0.02)
            fresh = [p.pid for p in pool._processes]
            late = await _stream(pool, spec, chunks)
            return victim.pid, survivor_pieces, fresh, pool.stats(), late
        finally:
            await pool.shutdown()

    caplog.set_level("INFO")
    victim, survivor_pieces, fresh, stats, late = asyncio.run(run())
    expected = _local(spec, chunks)
    assert survivor_pieces == expected[0]
    assert late == expected
    assert victim not in fresh and len(fresh) == 2
    assert stats["encoder_restarts"] == 1 and stats["encoder_processes"] == 2
    assert f"encoder process {victim} exited (status -9)" in caplog.text


def test_shutdown_ends_every_process_and_a_closed_pool_refuses_new_responses():
    async def run():
        pool = EncodePool(2)
        await pool.start()
        pids = pool.pids()
        out = AudioOut("opus", RATE, RATE, 1.0, pool)
        await out.push(_audio(0.2))  # a response still open at shutdown
        await pool.shutdown()
        with pytest.raises(EncoderFailedError, match="shutting down"):
            await AudioOut("aac", RATE, RATE, 1.0, pool).push(_audio(0.1))
        return pids

    pids = asyncio.run(run())
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)  # reaped by shutdown itself


def test_a_sigkilled_server_leaves_no_encoder_process(tmp_path):
    """The server process dies without a shutdown: its encoder processes end on their own
    (the socket's EOF, and PR_SET_PDEATHSIG)."""
    script = ("import asyncio, sys, time\n"
              "from higgs_serve.server.last_mile.encode_pool import EncodePool\n"
              "async def main():\n"
              "    pool = EncodePool(2)\n"
              "    await pool.start()\n"
              "    print(*pool.pids(), flush=True)\n"
              "    await asyncio.sleep(60)\n"
              "asyncio.run(main())\n")
    server = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in server.stdout.readline().split()]
        assert len(pids) == 2 and not any(_gone(pid) for pid in pids)
        server.kill()
        server.wait()
        assert _wait_gone(pids), [pid for pid in pids if not _gone(pid)]
    finally:
        server.kill()
        server.wait()


def test_a_process_that_fails_its_start_up_check_stops_the_start(tmp_path, monkeypatch):
    (tmp_path / "av.py").write_text("raise ImportError('PyAV is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))

    async def run():
        pool = EncodePool(1)
        try:
            with pytest.raises(EncoderFailedError, match="start-up check: ImportError: PyAV is broken"):
                await pool.start()
            return pool.pids()
        finally:
            await pool.shutdown()

    assert asyncio.run(run()) == []


def test_writers_wait_while_a_process_is_behind_and_lose_nothing(monkeypatch):
    """Backpressure: with a 64 KiB socket buffer bound, 6 responses pushing 4 s chunks (192 KB
    each as int16, 1.2 MB a write: past what the kernel's socket buffer takes) at once wait for
    the process to drain, and every byte still comes back in order."""
    monkeypatch.setattr(encoder_process, "WRITE_HIGH_WATER_BYTES", 64 << 10)
    spec = EncodeSpec("flac", RATE, RATE)
    inputs = [[_audio(4.0, 100.0 + 30 * i + k) for k in range(3)] for i in range(6)]

    async def run():
        pool = EncodePool(1)
        await pool.start()
        paused = []
        connection = pool._processes[0]._connection
        original = connection.pause_writing
        connection.pause_writing = lambda: (paused.append(1), original())
        try:
            return await asyncio.gather(*(_stream(pool, spec, c) for c in inputs)), paused
        finally:
            await pool.shutdown()

    results, paused = asyncio.run(run())
    assert paused  # the bound was reached
    for chunks, result in zip(inputs, results):
        assert result == _local(spec, chunks)


def test_every_heavy_format_is_a_codec_and_the_cheap_ones_are_not():
    for fmt in ("pcm", "wav", "ulaw", "alaw", *CPU_HEAVY_FORMATS):
        assert open_encoder(fmt, 8000 if fmt == "opus" else RATE).cpu_heavy == (fmt in CPU_HEAVY_FORMATS)
    assert EncodeSpec("pcm", RATE, RATE, speed=1.5).cpu_heavy
    assert not EncodeSpec("ulaw", RATE, 8000).cpu_heavy


def test_a_file_from_the_pool_is_the_in_process_file_bit_for_bit():
    """flac and wav files (patches applied) are identical whichever side encodes them."""
    audio = _audio(1.3)

    async def run():
        pool = EncodePool(1)
        try:
            return [await _stream(pool, EncodeSpec(fmt, RATE, RATE, 1.0, True), _chunks(audio))
                    for fmt in ("flac", "mp3")]  # mp3's file has a LAME/Info frame patched in
        finally:
            await pool.shutdown()

    for (pieces, patches), fmt in zip(asyncio.run(run()), ("flac", "mp3")):
        data = bytearray(b"".join(pieces))
        apply_patches(data, patches)
        local_pieces, local_patches = _local(EncodeSpec(fmt, RATE, RATE, 1.0, True), _chunks(audio))
        expected = bytearray(b"".join(local_pieces))
        apply_patches(expected, local_patches)
        assert patches and data == expected


def test_a_released_stream_is_counted_down_once_and_fails_its_later_chunks():
    """release() (a response that ended without a close) counts its stream down once however
    often it is called, and a later chunk fails as an encoder failure; the collector's
    backstop (release_later, from another thread) counts down on the loop."""
    async def run():
        pool = EncodePool(1)
        await pool.start()
        try:
            process = pool._processes[0]
            out = AudioOut("mp3", RATE, RATE, 1.0, pool)
            await out.push(_audio(0.1))
            assert process.streams == 1
            out.release()
            out.release()
            released = process.streams
            with pytest.raises(EncoderFailedError, match="already failed"):
                await out.push(_audio(0.1))
            other = AudioOut("opus", RATE, RATE, 1.0, pool)
            await other.push(_audio(0.1))
            await asyncio.to_thread(other._remote.release_later)
            await asyncio.sleep(0.05)
            return released, process.streams
        finally:
            await pool.shutdown()

    assert asyncio.run(run()) == (0, 0)


def test_encode_processes_flag_reaches_the_settings_and_zero_keeps_the_threads(tiny_model_dir,
                                                                                monkeypatch, capsys):
    """--encode-processes N goes through the settings (validated once: a negative count is a
    one-line error before anything loads); 0 encodes on the encode threads in the server."""
    from higgs_serve import cli
    from higgs_serve.server.last_mile.audio_workers import AudioWorkers
    from higgs_serve.server.settings import ServerSettings
    from higgs_serve.server.state import ServerState

    seen = []
    monkeypatch.setattr("higgs_serve.server.app.run_server",
                        lambda model, settings, *a, **k: seen.append(settings))
    for count in ("0", "3"):
        assert cli.main(["serve", str(tiny_model_dir), "--device", "cpu", "--port", "0",
                         "--encode-processes", count]) == 0
    assert [s.encode_processes for s in seen] == [0, 3]
    assert cli.main(["serve", str(tiny_model_dir), "--device", "cpu", "--port", "0",
                     "--encode-processes", "-1"]) != 0
    err = capsys.readouterr().err
    assert "--encode-processes must be >= 0, got -1" in err and "Traceback" not in err
    assert seen[1].encode_processes == 3 and ServerSettings().encode_processes >= 1
    state = ServerState(engine=None, settings=seen[0], voices=None, metrics=None, gate=None,
                        reference_encoder=None)
    try:
        assert state.encode_pool is None and isinstance(state.encoders, AudioWorkers)
        out = AudioOut("mp3", RATE, RATE, 1.0, state.encoders)
        audio = _chunks(_audio(0.3))
        pieces = [asyncio.run(out.push(c)) for c in audio[:-1]] + [asyncio.run(out.close(audio[-1]))]
        assert out._remote is None and pieces == _local(EncodeSpec("mp3", RATE, RATE), audio)[0]
    finally:
        state.encode_workers.shutdown()
        state.audio_workers.shutdown()


def _nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_a_silent_process_gets_no_new_response_and_one_that_resumes_in_time_is_kept():
    """SIGSTOP a process with a chunk in flight for less than the timeout: while it is silent a
    new response goes to the other process (although that one holds more), and once resumed it
    answers the chunk it owed; nothing is killed."""
    async def run():
        pool = EncodePool(2, timeout_s=8.0)  # assignment skips a process silent for 1 s
        await pool.start()
        try:
            first, second = pool._processes
            held = AudioOut("mp3", RATE, RATE, 1.0, pool)
            await held.push(_audio(0.1))
            kept_open = [AudioOut("mp3", RATE, RATE, 1.0, pool) for _ in range(2)]
            for out in kept_open:
                await out.push(_audio(0.1))
            assert (first.streams, second.streams) == (2, 1)
            os.kill(first.pid, signal.SIGSTOP)
            owed = asyncio.ensure_future(held.push(_audio(0.1)))
            await asyncio.sleep(1.3)
            fresh = AudioOut("mp3", RATE, RATE, 1.0, pool)
            await fresh.push(_audio(0.1))
            assigned = fresh._remote._process
            os.kill(first.pid, signal.SIGCONT)
            await asyncio.wait_for(owed, 5)
            return assigned is second, pool.restarts, first.alive
        finally:
            await pool.shutdown()

    assert asyncio.run(run()) == (True, 0, True)


def test_a_stopped_process_is_killed_after_the_timeout_and_replaced():
    async def run():
        pool = EncodePool(2, timeout_s=0.5)
        await pool.start()
        try:
            stuck, other = AudioOut("aac", RATE, RATE, 1.0, pool), AudioOut("aac", RATE, RATE, 1.0, pool)
            await stuck.push(_audio(0.2))
            await other.push(_audio(0.2))
            victim = stuck._remote._process
            os.kill(victim.pid, signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(EncoderFailedError, match="stopped answering"):
                await stuck.push(_audio(0.2))
            waited = time.monotonic() - started
            await other.close(_audio(0.2))  # the other process never noticed
            for _ in range(500):
                if pool.restarts and len(pool.pids()) == 2:
                    break
                await asyncio.sleep(0.02)
            return waited, victim.pid, pool.pids(), pool.stats()
        finally:
            await pool.shutdown()

    waited, victim, pids, stats = asyncio.run(run())
    assert 0.5 <= waited < 3.0
    assert victim not in pids and _gone(victim)
    assert stats["encoder_restarts"] == 1 and stats["encoder_processes"] == 2


def test_chunks_of_one_loop_turn_go_out_in_one_write_as_int16_where_that_is_exact():
    """Six responses' first chunks, pushed in the same turn of the loop, cost one socket write;
    at the model's rate and speed 1 the samples travel as int16 (half the bytes), resampled or
    stretched ones as float32; the bytes that come back are the in-process pipeline's."""
    specs = [EncodeSpec("mp3", RATE, RATE)] * 4 + [EncodeSpec("mp3", RATE, 16000),
                                                   EncodeSpec("mp3", RATE, RATE, speed=1.25)]
    assert [wire.samples_dtype(s) for s in specs] == ["<i2"] * 4 + ["<f4"] * 2
    chunk = _audio(0.2)

    async def run():
        pool = EncodePool(1)
        await pool.start()
        try:
            transport = pool._processes[0]._connection.transport
            writes = []
            original = transport.writelines
            transport.writelines = lambda parts: (writes.append(sum(len(memoryview(p).cast("B")) for p in parts)),
                                                  original(parts))
            outs = [AudioOut(s.response_format, s.model_rate_hz, s.sample_rate_hz, s.speed, pool) for s in specs]
            pieces = await asyncio.gather(*(out.push(chunk) for out in outs))
            for out in outs:
                out.release()
            return writes, pieces
        finally:
            await pool.shutdown()

    writes, pieces = asyncio.run(run())
    headers = sum(wire.CALL.size * 2 + len(s.to_json()) for s in specs)  # OPEN and PUSH each
    assert writes[0] == headers + 4 * chunk.size * 2 + 2 * chunk.size * 4  # one write, all six
    assert pieces == [EncodePipeline(s).convert(chunk, last=False) for s in specs]


def test_abandoned_streams_leave_the_process_as_big_as_it_was():
    """60 responses abandoned mid-way (mp3, aac, flac: muxed by FFmpeg) grow their process by
    less than 20 MB (66 MB while their muxers were left to the collector; benchmarks/limits/
    bench_abandoned_streams.py runs 1,000)."""
    async def run():
        pool = EncodePool(1)
        await pool.start()
        try:
            pid = pool.pids()[0]
            before = _rss_mb(pid)
            for i in range(60):
                out = AudioOut(("mp3", "aac", "flac")[i % 3], RATE, RATE, 1.0, pool)
                for _ in range(3):
                    await out.push(_audio(0.2))
                out.release()
            # a round trip: the process has handled every drop (calls are answered in order)
            await AudioOut("flac", RATE, RATE, 1.0, pool).close(_audio(0.1))
            return _rss_mb(pid) - before
        finally:
            await pool.shutdown()

    assert asyncio.run(run()) < 20


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_processes_run_at_the_placement_niceness_and_cores():
    from higgs_serve.config.worker_processes import WorkerPlacement, server_cpus

    core = max(server_cpus())
    placement = WorkerPlacement(frozenset({core}), 7)

    async def run():
        pool = EncodePool(1, placement=placement)
        await pool.start()
        try:
            pid = pool.pids()[0]
            return _nice_of(pid), os.sched_getaffinity(pid)
        finally:
            await pool.shutdown()

    nice, cpus = asyncio.run(run())
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7) and cpus == {core}
