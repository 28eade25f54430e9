"""The cached Triton launcher (kernels/launcher.py): its call signature must separate every two
calls Triton would compile differently. Checked against Triton's own specializer where Triton is
installed (CI has none and skips those); the launches themselves are checked on CUDA in
tests/gpu/test_launcher_gpu.py."""

from __future__ import annotations

import itertools

import pytest
import torch

from higgs_serve.kernels.launcher import Launcher, next_pow2, signature


def test_next_pow2():
    assert [next_pow2(n) for n in (0, 1, 2, 3, 8, 9, 2560, 4096)] == [1, 1, 2, 4, 8, 16, 4096, 4096]


def _pool() -> list:
    ints = [0, 1, -1, 2, 15, 16, 17, 32, 2560, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -2**31, -2**31 - 1,
            2**32, 2**63 - 16, 2**63, 2**63 + 16, 2**64 - 16]
    base = torch.zeros(64, dtype=torch.float32)
    tensors = [base.view(torch.uint8)[off:off + 32].view(dtype)
               for off in (0, 1, 2, 4, 8, 16, 32) for dtype in (torch.uint8, torch.int8)]
    tensors += [base[i:i + 8] for i in range(5)]  # float32 at byte offsets 0, 4, ... 16
    tensors += [base.to(torch.bfloat16)[i:i + 8] for i in range(9)]  # bfloat16, offsets 0 .. 16
    return ints + [True, False, 0.0, 1.0, 1.5, -2.0, None] + tensors


def test_signature_refines_triton_specialization():
    triton = pytest.importorskip("triton")
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    del triton
    pool = _pool()
    for a, b in itertools.combinations(pool, 2):
        if signature((a,), {}) != signature((b,), {}):
            continue
        for specialize in (True, False):  # do_not_specialize parameters pass False
            assert native_specialize_impl(BaseBackend, a, False, specialize, True) == \
                native_specialize_impl(BaseBackend, b, False, specialize, True), (a, b)


def test_signature_tells_types_apart_that_python_equates():
    assert len({signature((v,), {}) for v in (1, True, 1.0)}) == 3
    assert len({signature((v,), {}) for v in (0, False, 0.0)}) == 3


def test_signature_keeps_keyword_names():
    assert signature((), {"A": 1, "B": 2}) != signature((), {"B": 1, "A": 2})
    assert signature((), {"A": 1}) != signature((), {"A": 2})


class _PlainKernel:
    """Anything that is not a Triton JITFunction (e.g. an interpreted kernel): launched plainly."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **meta: self.calls.append((grid, args, meta))


def test_non_jit_kernels_are_launched_plainly_every_time():
    kernel = _PlainKernel()
    launch = Launcher(kernel)
    for _ in range(3):
        launch((2, 1), 5, BLOCK=4)
    assert kernel.calls == [((2, 1), (5,), {"BLOCK": 4})] * 3


class _Param:
    def __init__(self, name, default=None, has_default=False):
        self.name, self.default, self.has_default = name, default, has_default


class _Runner:
    """Triton's CudaLauncher: its Python wrapper (`__call__`) around the C `launch`."""

    def __init__(self, log, scratch: int):
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.launch = lambda *a: log.append(("c", a))
        self.log = log

    def __call__(self, *a):
        self.log.append(("wrapper", a))


class _Compiled:
    """What Triton returns from a launch: its launcher, function handle and packed metadata."""

    def __init__(self, log, scratch: int | None):
        self.function, self.packed_metadata = "fn-handle", "packed"
        self.run = (lambda *a: log.append(("wrapper", a))) if scratch is None else _Runner(log, scratch)


class _FakeJit:
    """A JITFunction's launch surface: kernel(X, n, BLOCK: constexpr, FLAG: constexpr = 7).
    `scratch`: None for a launcher without a C `launch` attribute, else its scratch bytes."""

    params = [_Param("X"), _Param("n"), _Param("BLOCK"), _Param("FLAG", 7, True)]

    def __init__(self, scratch: int | None = None):
        self.log = []
        self.scratch = scratch

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.log.append(("triton", grid, args, meta))
            return _Compiled(self.log, self.scratch)
        return launch


def _fake_cuda(monkeypatch):
    pytest.importorskip("triton")
    from higgs_serve.kernels import launcher as launcher_module

    monkeypatch.setattr(launcher_module, "JITFunction", _FakeJit)
    monkeypatch.setattr(launcher_module, "_INTERPRETED", False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)


def test_second_launch_of_a_signature_goes_straight_to_the_compiled_kernel(monkeypatch):
    _fake_cuda(monkeypatch)
    kernel = _FakeJit()
    launch = Launcher(kernel)
    x = torch.zeros(16)
    launch((3,), x, 5, BLOCK=64)
    launch((4, 2), x, 5, BLOCK=64)  # same signature, new grid
    launch((3,), x[1:], 5, BLOCK=64)  # 4-byte offset: a new signature
    launch((3,), x, 6, BLOCK=64)  # another int value: a new signature
    launch((3,), x, [5], BLOCK=64)  # unhashable: Triton's own path, not remembered
    kinds = [entry[0] for entry in kernel.log]
    assert kinds == ["triton", "wrapper", "triton", "triton", "triton"]
    fast = kernel.log[1][1]
    assert fast[:9] == (4, 2, 1, 1234, "fn-handle", "packed", None, None, None)
    assert fast[9:] == (x, 5, 64, 7)  # positional args, then constexprs in order, defaults included
    assert len(launch._compiled) == 3

    from triton import knobs

    def hook(*args):
        pass

    knobs.runtime.launch_enter_hook.add(hook)  # a profiler's hook: every launch goes through Triton
    try:
        launch((3,), x, 5, BLOCK=64)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert kernel.log[-1][0] == "triton"


@pytest.mark.parametrize("scratch", [0, 128])
def test_fast_path_calls_the_c_launcher_directly_when_no_scratch_is_needed(monkeypatch, scratch):
    _fake_cuda(monkeypatch)
    kernel = _FakeJit(scratch)
    launch = Launcher(kernel)
    x = torch.zeros(16)
    launch((3,), x, 5, BLOCK=64)
    launch((4, 2), x, 5, BLOCK=64)
    kind, args = kernel.log[1]
    if scratch:  # scratch memory is allocated by Triton's wrapper: keep it
        assert kind == "wrapper"
        assert args == (4, 2, 1, 1234, "fn-handle", "packed", None, None, None, x, 5, 64, 7)
    else:  # what the wrapper would pass on: flags, no scratch, packed metadata, no hooks
        assert kind == "c"
        assert args == (4, 2, 1, 1234, "fn-handle", False, True, None, None, "packed", None, None, None,
                        x, 5, 64, 7)
