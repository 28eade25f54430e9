"""Launch tapes (kernels/launch_tape.py) on CPU: what a recording keeps, and every reason it is
void. The C launches themselves are checked against eager steps on CUDA (tests/gpu/test_launch_tapes.py)."""

from __future__ import annotations

import gc
import threading

import torch

from higgs_serve.kernels import launch_tape


class FakeKernel:
    """Stands in for a cached Triton launch: adds `x` into `out` (by address, as a C launcher
    would) and puts itself on the tape being recorded, as Launcher does."""

    def __init__(self, calls: list):
        self.calls = calls

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self.launch(x.data_ptr(), out.data_ptr())
        if launch_tape.recording.tape is not None:
            launch_tape.recording.tape.add(self.launch, (x.data_ptr(), out.data_ptr()),
                                          ((x.data_ptr(), "x"), (out.data_ptr(), "out")))

    def launch(self, x_ptr: int, out_ptr: int) -> None:
        self.calls.append((x_ptr, out_ptr))


def test_a_tape_replays_its_launches_on_its_own_inputs_and_temporaries():
    calls: list = []
    kernel = FakeKernel(calls)
    weight = torch.zeros(4)
    graph_replays = []

    def body(x):
        tmp = torch.empty_like(x)  # a temporary: allocated during the recording
        kernel(x, tmp)
        kernel(tmp.view(2, 2), weight)
        launch_tape.call(lambda: graph_replays.append(1))
        return (weight[:2],)

    step_input = torch.ones(4)
    outputs, tape = launch_tape.record(body, [step_input], launch_tape.spans([weight]))
    assert tape.void_reason is None
    assert len(tape.entries) == 3 and graph_replays == [1]
    assert tape.inputs[0].data_ptr() != step_input.data_ptr()  # the tape's own copy
    assert outputs[0].data_ptr() == weight.data_ptr() and tape.outputs == outputs
    recorded = list(calls)
    assert recorded[0][0] == tape.inputs[0].data_ptr()

    launch_tape.load(tape, [torch.full((4,), 7.0)])
    tape.replay()
    assert torch.equal(tape.inputs[0], torch.full((4,), 7.0))
    assert calls[2:] == recorded and graph_replays == [1, 1]  # same launches, same addresses


def test_a_torch_op_that_computes_voids_the_tape():
    def body(x):
        return (x + 1,)  # aten::add: device work no tape entry would repeat

    outputs, tape = launch_tape.record(body, [torch.ones(3)], [])
    assert torch.equal(outputs[0], torch.full((3,), 2.0))  # the recording run itself is a real run
    assert tape.void_reason is not None and "aten::add" in tape.void_reason


def test_a_pointer_outside_known_memory_voids_the_tape():
    calls: list = []
    kernel = FakeKernel(calls)
    stranger = torch.zeros(4)  # neither persistent nor allocated by the recording

    def body(x):
        kernel(x, stranger)
        return (x,)

    _, tape = launch_tape.record(body, [torch.ones(4)], [])
    assert tape.void_reason is not None and "outside" in tape.void_reason
    _, tape = launch_tape.record(body, [torch.ones(4)], launch_tape.spans([stranger]))
    assert tape.void_reason is None


def test_another_threads_launches_stay_off_the_tape():
    """The codec thread launches its own kernels while the engine thread records a step: they run,
    and neither land on the step's tape nor void it."""
    calls: list = []
    kernel = FakeKernel(calls)
    codec_memory = torch.zeros(4)  # not the step's memory

    def body(x):
        kernel(x, x)
        other = threading.Thread(target=kernel, args=(codec_memory, codec_memory))
        other.start()
        other.join()
        return (x,)

    _, tape = launch_tape.record(body, [torch.ones(4)], [])
    assert len(calls) == 2 and tape.void_reason is None and len(tape.entries) == 1


def test_no_garbage_collection_while_recording():
    """A collection inside a recording would run dead objects' finalizers (a dead runner's memory
    pool, whose release torch refuses while any pool routes allocations): none runs there."""
    seen = []
    was_enabled = gc.isenabled()
    gc.enable()
    try:
        launch_tape.record(lambda x: (seen.append(gc.isenabled()), FakeKernel([])(x, x), x)[2:],
                           [torch.ones(1)], [])
        assert seen == [False] and gc.isenabled()
    finally:
        if not was_enabled:
            gc.disable()


def test_views_of_persistent_tensors_count_as_persistent():
    kernel = FakeKernel([])
    cache = torch.zeros(8, 4)

    def body(x):
        kernel(x, cache[5])  # a view deep inside the persistent storage
        return (x,)

    _, tape = launch_tape.record(body, [torch.ones(4)], launch_tape.spans([cache]))
    assert tape.void_reason is None


def test_an_empty_stretch_is_void_and_recording_ends_on_error():
    _, tape = launch_tape.record(lambda x: (x,), [torch.ones(1)], [])
    assert tape.void_reason == "nothing was launched"

    def failing(x):
        raise ValueError("boom")

    try:
        launch_tape.record(failing, [torch.ones(1)], [])
    except ValueError:
        pass
    assert launch_tape.recording.tape is None  # no later launch is taped by mistake
