"""The fused Snake kernel's math on CPU through Triton's interpreter. Runs only where Triton is
installed and the run was started with TRITON_INTERPRET=1 (Triton reads it when the kernel is
defined); CI has no Triton and skips. On CUDA, tests/gpu/test_codec_snake_gpu.py runs the same
checks compiled:

    TRITON_INTERPRET=1 PYTHONPATH=src python -m pytest -q tests/unit/test_snake_interpreted.py
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 set before the run")

from support.codec_fixtures import random_codec_tensors  # noqa: E402
from support.snake_checks import SHAPES, check_fused_snake, check_non_contiguous, check_split_snake  # noqa: E402

from higgs_serve.codec.codec_config import CodecConfig  # noqa: E402
from higgs_serve.codec.decoder import CodecDecoder  # noqa: E402
from higgs_serve.codec.snake import snake_triton  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_interpreted_snake_matches_torch(shape, dtype):
    if dtype == torch.bfloat16:
        # the interpreter casts float32 -> bfloat16 by truncation (the GPU rounds to nearest),
        # so the one-ulp bound below does not hold here; the GPU test checks it
        pytest.skip("interpreter bfloat16 casts truncate")
    check_fused_snake(shape, dtype, "cpu")


def test_interpreted_snake_non_contiguous_input():
    check_non_contiguous("cpu")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_interpreted_split_snake_writes_the_bf16x3_operand(shape):
    check_split_snake(shape, "cpu")


def test_decoder_with_interpreted_snake_matches_torch():
    cfg = CodecConfig.tiny()
    dec = CodecDecoder(cfg).eval()
    dec.load_state(random_codec_tensors(cfg, seed=1))
    codes = torch.randint(0, cfg.codebook_size, (2, 6, cfg.num_quantizers), generator=torch.Generator().manual_seed(0))
    reference = dec(codes)
    dec.snake = snake_triton
    torch.testing.assert_close(dec(codes), reference, rtol=1e-5, atol=1e-5)
