"""schemathesis against a live server's own OpenAPI schema (shared by the fake and real tests)."""

from __future__ import annotations

import httpx
import hypothesis
import requests
import schemathesis
# loaded when the tests are collected, not in the middle of one: pytest rewrites schemathesis's
# modules (it is a pytest plugin) as they load, and CPython 3.11's parser has failed that rewrite
# ("AST constructor recursion depth mismatch") when a collection ran finalizers during it
import schemathesis.specs.openapi.schemas  # noqa: F401
from schemathesis.checks import not_a_server_error


def clamp_frame_fields(openapi: dict, maximum: int) -> dict:
    """Fuzz within short utterances: max/min_new_tokens above the profile limit are covered by
    the bad-request table, and long generations would only slow the fuzzing down."""
    fields = openapi["components"]["schemas"]["SpeechRequestBody"]["properties"]
    for name in ("max_new_tokens", "min_new_tokens"):
        for option in fields[name]["anyOf"]:
            if option.get("type") == "integer":
                option["maximum"] = maximum
    return openapi


def fuzz_server(url: str, openapi: dict, max_examples: int, headers: dict | None = None,
                methods: tuple[str, ...] = ("POST", "DELETE")) -> None:
    """Schemathesis cases for every operation of `methods` (positive and negative): never a
    5xx, and the engine stays alive (checked after each case). headers: sent with every case
    (e.g. the API key); the GET endpoints take no input, so they are left out by default."""
    schema = schemathesis.openapi.from_dict(openapi)
    with httpx.Client(base_url=url, timeout=30) as health, requests.Session() as session:
        _fuzz_operations(schema, url, max_examples, health, session, headers, methods)


def _fuzz_operations(schema, url: str, max_examples: int, health: httpx.Client,
                     session: requests.Session, headers: dict | None,
                     methods: tuple[str, ...]) -> None:
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() not in methods:
            continue
        modes = [schemathesis.GenerationMode.POSITIVE]
        if operation.method.upper() == "POST":  # a path-only DELETE has no invalid inputs
            modes.append(schemathesis.GenerationMode.NEGATIVE)
        for mode in modes:
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(max_examples=max_examples, deadline=None, derandomize=True,
                                 database=None, suppress_health_check=list(hypothesis.HealthCheck))
            def run(case) -> None:
                case.call_and_validate(base_url=url, session=session, headers=headers,
                                       checks=[not_a_server_error], timeout=30)
                assert health.get("/health").status_code == 200

            run()
