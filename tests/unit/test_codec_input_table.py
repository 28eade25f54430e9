"""The codec's input table (codec/decoder.py `_fold_input_table`, docs/model.md#codec-geometry):
the codes' lookup, projections, sum and fc2 folded into one table must give what the unfolded
chain gives, follow the weights through a load and a cast, and exist on a bare decoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from support.codec_fixtures import random_codec_tensors

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.decoder import CodecDecoder


def _unfolded(tensors: dict, codes: torch.Tensor, num_quantizers: int) -> torch.Tensor:
    """fc2(Σ_q project_out_q(codebook_q[code_q])), op by op, in float64."""
    out = 0
    for q in range(num_quantizers):
        p = f"quantizer.quantizers.{q}."
        e = F.embedding(codes[..., q], tensors[p + "codebook.embed"].double())
        out = out + F.linear(e, tensors[p + "project_out.weight"].double(), tensors[p + "project_out.bias"].double())
    return F.linear(out, tensors["fc2.weight"].double(), tensors["fc2.bias"].double())


def test_the_folded_lookup_is_the_unfolded_chain():
    cfg = CodecConfig.tiny()
    tensors = random_codec_tensors(cfg, seed=4)
    codes = torch.randint(0, cfg.codebook_size, (3, 7, cfg.num_quantizers), generator=torch.Generator().manual_seed(1))
    expected = _unfolded(tensors, codes, cfg.num_quantizers)
    decoder = CodecDecoder(cfg)
    decoder.load_state(tensors)
    torch.testing.assert_close(decoder.codes_to_input(codes).double(), expected, rtol=1e-6, atol=1e-6)
    decoder64 = CodecDecoder(cfg).double()  # the table follows a cast: built again from the weights
    decoder64.load_state(tensors)
    assert decoder64.codes_to_input(codes).dtype == torch.float64
    torch.testing.assert_close(decoder64.codes_to_input(codes), expected, rtol=1e-12, atol=1e-12)


def test_a_bare_decoder_has_its_table_and_a_load_replaces_it():
    cfg = CodecConfig.tiny()
    decoder = CodecDecoder(cfg)  # zeros: every code maps to fc2's bias, zero too
    codes = torch.zeros(1, 2, cfg.num_quantizers, dtype=torch.int64)
    assert torch.count_nonzero(decoder.codes_to_input(codes)) == 0
    decoder.load_state(random_codec_tensors(cfg, seed=5))
    assert torch.count_nonzero(decoder.codes_to_input(codes)) > 0


def test_the_table_is_built_once_at_first_use_not_at_each_set_up_step(monkeypatch):
    """Start-up constructs, moves, loads and sets the precision of the decoder: each of those
    changes the weights the table comes from, so the table is built at its first use after them,
    once, and again only after the next change."""
    import higgs_serve.codec.decoder as decoder_module

    builds = []
    fold = decoder_module._fold_input_table
    monkeypatch.setattr(decoder_module, "_fold_input_table", lambda *a: builds.append(1) or fold(*a))
    cfg = CodecConfig.tiny()
    decoder = CodecDecoder(cfg).to(dtype=torch.float32)
    decoder.load_state(random_codec_tensors(cfg, seed=6))
    decoder.use_precision("float32")
    assert builds == []
    codes = torch.zeros(1, 2, cfg.num_quantizers, dtype=torch.int64)
    decoder.codes_to_input(codes)
    decoder.codes_to_input(codes)
    assert len(builds) == 1
    decoder.load_state(random_codec_tensors(cfg, seed=7))
    decoder.codes_to_input(codes)
    assert len(builds) == 2
