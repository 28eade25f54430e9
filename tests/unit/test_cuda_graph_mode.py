"""The one CUDA-graph mode type: each configured mode as its (decode, mixed) step modes, the
dispatcher that picks a step's mode and padded size from them, and FULL as a step mode only."""

import pytest

from higgs_serve.config.deploy import CudaGraphMode as M
from higgs_serve.config.loader import load_deploy_config
from higgs_serve.errors import ConfigError
from higgs_serve.worker.cuda_graphs import CudaGraphDispatcher


@pytest.mark.parametrize("mode, decode, mixed, piecewise", [
    (M.NONE, M.NONE, M.NONE, False),
    (M.LOCAL_MLP, M.LOCAL_MLP, M.NONE, False),
    (M.FULL_DECODE_ONLY, M.FULL, M.NONE, False),
    (M.PIECEWISE, M.PIECEWISE, M.PIECEWISE, True),
    (M.FULL_AND_PIECEWISE, M.FULL, M.PIECEWISE, True),
    (M.FULL, M.FULL, M.FULL, False),
])
def test_each_mode_is_a_decode_mode_and_a_mixed_mode(mode, decode, mixed, piecewise):
    assert (mode.decode_mode, mode.mixed_mode, mode.piecewise) == (decode, mixed, piecewise)


def test_full_is_a_step_mode_not_a_config_value():
    assert "FULL" not in M.config_values() and len(M.config_values()) == len(M) - 1
    with pytest.raises(ConfigError, match="cudagraph_mode"):
        load_deploy_config(None, "higgs_multimodal_qwen3", cli_overrides={
            "0": {"enforce_eager": False, "compilation_config": {"cudagraph_mode": "FULL"}}})


@pytest.mark.parametrize("mode, decode_sizes, piecewise_sizes, expected", [
    # (num_tokens, pure decode) -> (step mode, padded)
    (M.NONE, (), (), {(3, True): (M.NONE, 3), (3, False): (M.NONE, 3)}),
    (M.LOCAL_MLP, (1, 4), (), {(3, True): (M.LOCAL_MLP, 4), (5, True): (M.NONE, 5), (3, False): (M.NONE, 3)}),
    (M.FULL_DECODE_ONLY, (1, 4), (), {(1, True): (M.FULL, 1), (5, True): (M.NONE, 5), (2, False): (M.NONE, 2)}),
    (M.PIECEWISE, (), (4, 16), {(3, True): (M.PIECEWISE, 4), (9, False): (M.PIECEWISE, 16),
                                (17, False): (M.NONE, 17)}),
    # a decode batch above the largest full graph still finds a piecewise graph
    (M.FULL_AND_PIECEWISE, (1, 4), (1, 4, 16), {(3, True): (M.FULL, 4), (9, True): (M.PIECEWISE, 16),
                                                (3, False): (M.PIECEWISE, 4)}),
])
def test_dispatch_table(mode, decode_sizes, piecewise_sizes, expected):
    dispatcher = CudaGraphDispatcher(mode, decode_sizes, piecewise_sizes)
    assert {step: dispatcher.dispatch(*step) for step in expected} == expected


def test_sizes_must_belong_to_the_mode():
    with pytest.raises(ValueError, match="decode graph sizes"):
        CudaGraphDispatcher(M.PIECEWISE, decode_sizes=(1, 2))
    with pytest.raises(ValueError, match="piecewise graph sizes"):
        CudaGraphDispatcher(M.LOCAL_MLP, decode_sizes=(1,), piecewise_sizes=(8,))


def test_from_config_resolves_once_on_the_machine():
    deploy = load_deploy_config(None, "higgs_multimodal_qwen3", cli_overrides={"0": {
        "max_num_seqs": 8, "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8]}}})
    on_gpu = CudaGraphDispatcher.from_config(deploy.stage0, cuda_available=True)
    assert on_gpu.mode is M.LOCAL_MLP and on_gpu.decode_sizes == (1, 2, 4, 8) and not on_gpu.piecewise_sizes
    assert CudaGraphDispatcher.from_config(deploy.stage0, cuda_available=False) == CudaGraphDispatcher(
        num_warmups=deploy.stage0.compilation_config.cudagraph_num_of_warmups)
