"""Typed reading of a merged deploy document: every read marks a key as known, every error names
the source that set the value and the key path (`config.deploy` builds its dataclasses with it).

    ctx = ReadContext(origins, default_origin, device_count)
    stage = Section(doc_stage, ("stages", 0), ctx)
    stage.integer("max_num_seqs", 16, 1); stage.finish()   # finish: unknown keys are errors
"""

from __future__ import annotations

from typing import Any

from higgs_serve.config.layers import KeyPath
from higgs_serve.errors import ConfigError
from higgs_serve.config.validators import int_problem


def key_text(path: KeyPath) -> str:
    """("stages", 0, "compilation_config") -> "stages[0].compilation_config"."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class ReadContext:
    """Where each key path was set (for errors), and the facts of this machine."""

    def __init__(self, origins: dict[KeyPath, str], default_origin: str, device_count: int | None):
        self.origins = origins
        self.default_origin = default_origin
        self.device_count = device_count

    def error(self, paths: list[KeyPath], problem: str) -> ConfigError:
        """An error naming the source(s) that set `paths`, then the first key path."""
        sources = dict.fromkeys(self.origins.get(p, self.default_origin) for p in paths)
        return ConfigError(f"{' and '.join(sources)}: {key_text(paths[0])}: {problem}")


class Section:
    """One mapping of the merged document. Reads mark keys as known; `finish` rejects the rest."""

    def __init__(self, data: Any, path: KeyPath, ctx: ReadContext):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ctx.error([path], f"expected a mapping, got {type(data).__name__} {data!r}")
        self.data, self.path, self.ctx = data, path, ctx
        self.known: list = []

    def key(self, name: Any) -> KeyPath:
        return (*self.path, name)

    def error(self, name: Any, problem: str) -> ConfigError:
        return self.ctx.error([self.key(name)], problem)

    def raw(self, name: Any, default: Any) -> Any:
        self.known.append(name)
        return self.data.get(name, default)

    def section(self, name: Any) -> Section:
        return Section(self.raw(name, None), self.key(name), self.ctx)

    def checked(self, name: str, default: Any, problem_of) -> Any:
        value = self.raw(name, default)
        problem = problem_of(value)
        if problem is not None:
            raise self.error(name, problem)
        return value

    def integer(self, name: str, default: int | None, minimum: int, maximum: int | None = None,
                optional: bool = False) -> int | None:
        def problem_of(value: Any) -> str | None:
            if value is None and optional:
                return None
            return int_problem(value, minimum, maximum)
        return self.checked(name, default, problem_of)

    def boolean(self, name: str, default: bool) -> bool:
        return self.checked(name, default, lambda v: None if isinstance(v, bool) else
                            f"expected true or false, got {type(v).__name__} {v!r}")

    def choice(self, name: str, default: str | None, choices: tuple[str, ...]) -> str | None:
        """One of `choices`; null only where the default is null (meaning "automatic")."""
        def problem_of(value: Any) -> str | None:
            if value in choices or (value is None and default is None):
                return None
            return f"{value!r} is not one of {', '.join(choices)}"
        return self.checked(name, default, problem_of)

    def finish(self) -> None:
        unknown = [k for k in self.data if k not in self.known]
        if unknown:
            known = ", ".join(str(k) for k in self.known)
            raise self.error(unknown[0], f"unknown key (known keys here: {known})")
