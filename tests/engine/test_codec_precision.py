"""The Stage 1 precision reaches the codec the engine builds: an engine whose profile asks for
`dtype: bf16x3` decodes with split convolutions (codec/split_conv.py; on CPU the same products as
on CUDA, summed in float32 math) and speaks what the float32 engine speaks, to the split form's
~1e-5 of peak, for the same greedy codes."""

from __future__ import annotations

import numpy as np
from engine_harness import CPU, TEXTS, ManualEngine, engine_deploy, sampling, speech

from higgs_serve.engine.builder import load_model


def test_a_bf16x3_engine_speaks_what_the_float32_engine_speaks(tiny_model_dir, tiny_loaded):
    deploy = engine_deploy(max_num_seqs=4, codec_dtype="bf16x3")
    loaded = load_model(str(tiny_model_dir), CPU, deploy)
    assert loaded.codec.precision == "bf16x3" and loaded.codec.split_units is not None
    assert tiny_loaded.codec.precision == "float32" and tiny_loaded.codec.split_units is None
    outputs = {}
    for name, model, profile in (("f32", tiny_loaded, engine_deploy(max_num_seqs=4)), ("x3", loaded, deploy)):
        engine = ManualEngine(model, profile)
        try:
            outputs[name] = engine.generate([speech(f"{name}{i}", text, sampling(frames=20, min_frames=20), stream=True)
                                             for i, text in enumerate(TEXTS[:2])])
        finally:
            engine.close()
    for got, ref in zip(outputs["x3"], outputs["f32"]):
        assert got.error is None and np.array_equal(got.frames, ref.frames)
        assert got.audio.shape == ref.audio.shape and got.audio.size > 0
        peak = float(np.abs(ref.audio).max())
        assert float(np.abs(got.audio - ref.audio).max()) <= 1e-4 * peak
