"""SamplingParams: validation at construction, profile defaults, seeds."""

import dataclasses

import pytest

from higgs_serve.config.deploy import DefaultSamplingParams
from higgs_serve.config.loader import load_deploy_config
from higgs_serve.config.validators import SEED_MAX
from higgs_serve.errors import InvalidRequestError
from higgs_serve.sampling_params import SamplingParams


def test_defaults_are_the_spec_values():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.seed) == (0.8, 0.8, 30, None)
    assert (p.max_new_tokens, p.min_new_tokens) == (2048, 0)


def test_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 1.0


def test_int_float_knobs_are_stored_as_float():
    p = SamplingParams(temperature=1, top_p=1)
    assert isinstance(p.temperature, float) and isinstance(p.top_p, float)


@pytest.mark.parametrize("fields", [
    {"temperature": 0}, {"temperature": 2}, {"top_p": 1}, {"top_p": 1e-6}, {"top_k": 0},
    {"top_k": 1026}, {"seed": 0}, {"seed": SEED_MAX}, {"max_new_tokens": 1},
    {"max_new_tokens": 5, "min_new_tokens": 5},
])
def test_boundary_values_are_accepted(fields):
    p = SamplingParams(**fields)
    for name, value in fields.items():
        assert getattr(p, name) == value


# (fields, param named by the error, text in the message)
INVALID = [
    ({"temperature": -0.1}, "temperature", "outside [0, 2]"),
    ({"temperature": 2.01}, "temperature", "outside [0, 2]"),
    ({"temperature": float("nan")}, "temperature", "finite number"),
    ({"temperature": "hot"}, "temperature", "finite number"),
    ({"temperature": True}, "temperature", "finite number"),
    ({"top_p": 0}, "top_p", "outside (0, 1]"),
    ({"top_p": 1.5}, "top_p", "outside (0, 1]"),
    ({"top_k": -1}, "top_k", "outside [0, 1026]"),
    ({"top_k": 1027}, "top_k", "outside [0, 1026]"),
    ({"top_k": 2.0}, "top_k", "expected an integer"),
    ({"seed": -1}, "seed", "outside [0, 2**63 - 1]"),
    ({"seed": SEED_MAX + 1}, "seed", "outside [0, 2**63 - 1]"),
    ({"seed": "42"}, "seed", "expected an integer or null"),
    ({"max_new_tokens": 0}, "max_new_tokens", "below the minimum 1"),
    ({"min_new_tokens": -1}, "min_new_tokens", "below the minimum 0"),
    ({"max_new_tokens": 10, "min_new_tokens": 11}, "min_new_tokens", "above max_new_tokens 10"),
]


@pytest.mark.parametrize("fields, param, text", INVALID)
def test_invalid_values_raise_naming_the_param(fields, param, text):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**fields)
    assert info.value.param == param
    assert str(info.value).startswith(f"{param}: ") and text in str(info.value)


def test_greedy_detection():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(top_k=1).is_greedy
    assert not SamplingParams().is_greedy


def test_with_seed_copies_and_validates():
    p = SamplingParams(temperature=0.5)
    q = p.with_seed(7)
    assert (q.seed, q.temperature, p.seed) == (7, 0.5, None)
    with pytest.raises(InvalidRequestError) as info:
        p.with_seed(-5)
    assert info.value.param == "seed"


PROFILE = DefaultSamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_tokens=500, seed=None)


def test_from_defaults_uses_profile_values_when_request_gives_none():
    p = SamplingParams.from_defaults(PROFILE, temperature=None, seed=None)
    assert (p.temperature, p.top_p, p.top_k, p.seed) == (0.7, 0.9, 40, None)
    assert (p.max_new_tokens, p.min_new_tokens) == (500, 0)


def test_from_defaults_request_fields_win():
    p = SamplingParams.from_defaults(PROFILE, temperature=0.0, top_p=1.0, top_k=0, seed=3,
                                     max_new_tokens=100, min_new_tokens=50)
    assert (p.temperature, p.top_p, p.top_k, p.seed) == (0.0, 1.0, 0, 3)
    assert (p.max_new_tokens, p.min_new_tokens) == (100, 50)


def test_from_defaults_rejects_more_frames_than_the_profile_allows():
    assert SamplingParams.from_defaults(PROFILE, max_new_tokens=500).max_new_tokens == 500
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_defaults(PROFILE, max_new_tokens=501)
    assert info.value.param == "max_new_tokens"
    assert "501 is above this server's limit of 500 frames" in str(info.value)


@pytest.mark.parametrize("fields, param", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": "9"}, "max_new_tokens"),
    ({"top_p": 2.0}, "top_p"),
    ({"min_new_tokens": 501}, "min_new_tokens"),  # above the profile's default frame cap
])
def test_from_defaults_validates_the_merged_values(fields, param):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_defaults(PROFILE, **fields)
    assert info.value.param == param


def test_from_defaults_rejects_unknown_fields():
    with pytest.raises(TypeError):
        SamplingParams.from_defaults(PROFILE, repetition_penalty=1.1)


def test_profile_seed_is_used_when_request_has_none():
    profile = dataclasses.replace(PROFILE, seed=11)
    assert SamplingParams.from_defaults(profile).seed == 11
    assert SamplingParams.from_defaults(profile, seed=12).seed == 12


def test_shipped_profile_defaults_build_valid_params():
    deploy = load_deploy_config("higgs_multimodal_qwen3_low_latency")
    p = SamplingParams.from_defaults(deploy.stage0.default_sampling_params)
    assert p == SamplingParams()  # the shipped defaults are those of docs/model.md#sampling
