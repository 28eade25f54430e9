"""Deploy config layers: find the YAML, read it strictly, stack every source, merge them.

Where values come from, lowest precedence first:
  1. the dataclass defaults in `config.deploy` (a key left out of every layer);
  2. the deploy YAML, after its `base_config:` chain (base first, child over base);
  3. `--stage-overrides '{"0": {...}, "1": {...}}'` (JSON, per stage);
  4. explicit command-line flags (`cli_overrides`, built by the CLI from e.g. `--max-num-seqs`).
Mappings merge key by key (deep); the `stages` list merges entry by entry on `stage_id`; any
other list (e.g. `cudagraph_capture_sizes`) is replaced whole.

Discovery: with no `--deploy-config`, `config/profiles/<model_type>.yaml` shipped in this package is used.
`--deploy-config` takes a path, or a bare name (with or without `.yaml`) of a shipped profile.

The merge also records which source set each key path, so `config.deploy`'s validation errors
name the file (or override) to fix. This module knows nothing of the typed fields: it only
checks what layering itself needs (mappings, stage ids, base_config).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from higgs_serve.config.validators import is_int
from higgs_serve.errors import ConfigError

SHIPPED_DIR = Path(__file__).resolve().parent / "profiles"
TALKER_STAGE_ID = 0
CODEC_STAGE_ID = 1

KeyPath = tuple  # e.g. ("stages", 0, "compilation_config", "cudagraph_mode")


def list_shipped_profiles() -> list[str]:
    """File names of the deploy profiles shipped in the package."""
    return sorted(p.name for p in SHIPPED_DIR.glob("*.yaml"))


def collect_layers(
    deploy_config: str | None,
    model_type: str | None,
    stage_overrides: str | dict | None,
    cli_overrides: dict | None,
) -> tuple[Path, list[tuple[str, dict]]]:
    """The located YAML, and every layer as (source, doc), lowest precedence first; `source`
    names the file or override in error messages. Arguments as in `load_deploy_config`."""
    path = _locate(deploy_config, model_type)
    layers = _yaml_chain(path, ())
    if stage_overrides is not None:
        layers.append(_override_layer(stage_overrides, "--stage-overrides", stages_only=True))
    if cli_overrides:
        layers.append(_override_layer(cli_overrides, "command-line flags", stages_only=False))
    return path, layers


def merge_layers(layers: list[tuple[str, dict]]) -> tuple[dict, dict[KeyPath, str]]:
    """One merged document, and the last source to set (or merge into) each key path."""
    merged: dict = {}
    origins: dict[KeyPath, str] = {}
    for source, doc in layers:
        _merge(merged, doc, (), origins, source)
    return merged, origins


# ---------------------------------------------------------------- locating and reading files


def _locate(deploy_config: str | None, model_type: str | None) -> Path:
    if deploy_config is None:
        if not model_type:
            raise ConfigError("no --deploy-config given and no model_type to discover one from")
        path = SHIPPED_DIR / f"{model_type}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"no shipped deploy profile for model_type {model_type!r} (shipped: "
                f"{', '.join(list_shipped_profiles())}); pass --deploy-config PATH")
        return path
    given = Path(deploy_config).expanduser()
    if given.is_file():
        return given.resolve()
    if given.name == deploy_config:  # a bare name: look in the shipped folder
        for name in (deploy_config, f"{deploy_config}.yaml"):
            if (SHIPPED_DIR / name).is_file():
                return SHIPPED_DIR / name
    raise ConfigError(f"--deploy-config {deploy_config!r}: no such file, and no shipped profile "
                      f"of that name (shipped: {', '.join(list_shipped_profiles())})")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping (PyYAML keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise ConfigError(f"{loader.name}: line {key_node.start_mark.line + 1}: "
                              f"key {key!r} appears twice")
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            loader = _StrictLoader(f)
            loader.name = str(path)
            try:
                doc = loader.get_single_data()
            finally:
                loader.dispose()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(doc).__name__}")
    return doc


def _yaml_chain(path: Path, seen: tuple[Path, ...]) -> list[tuple[str, dict]]:
    """[(source, doc), ...] from the root base to `path`, with `stages` keyed by stage_id."""
    if path in seen:
        cycle = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"{seen[-1]}: base_config: inheritance cycle: {cycle}")
    doc = _read_yaml(path)
    base = doc.pop("base_config", None)
    layers: list[tuple[str, dict]] = []
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{path}: base_config: expected a file name, got {base!r}")
        layers = _yaml_chain(_find_base(base, path), (*seen, path))
    layers.append((str(path), _stages_by_id(doc, str(path))))
    return layers


def _find_base(base: str, child: Path) -> Path:
    for candidate in (child.parent / base, SHIPPED_DIR / base):
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(f"{child}: base_config: {base!r} is neither a file next to it nor a "
                      f"shipped profile")


def _stages_by_id(doc: dict, source: str) -> dict:
    """Turn the YAML `stages` list into {stage_id: entry} so layers merge by stage_id."""
    if "stages" not in doc:
        return doc
    stages = doc["stages"]
    if not isinstance(stages, list):
        raise ConfigError(f"{source}: stages: expected a list of stage mappings, "
                          f"got {type(stages).__name__}")
    by_id: dict[int, dict] = {}
    for index, entry in enumerate(stages):
        if not isinstance(entry, dict) or "stage_id" not in entry:
            raise ConfigError(f"{source}: stages[{index}]: expected a mapping with a stage_id")
        entry = dict(entry)
        stage_id = entry.pop("stage_id")
        _check_stage_id(stage_id, f"{source}: stages[{index}].stage_id")
        if stage_id in by_id:
            raise ConfigError(f"{source}: stages[{index}].stage_id: stage {stage_id} is listed "
                              f"twice")
        by_id[stage_id] = entry
    return {**doc, "stages": by_id}


def _check_stage_id(stage_id: Any, where: str) -> None:
    if not is_int(stage_id) or stage_id not in (TALKER_STAGE_ID, CODEC_STAGE_ID):
        raise ConfigError(f"{where}: {stage_id!r} is not a stage (0 = talker, 1 = codec)")


# ---------------------------------------------------------------- override layers and merging


def _override_layer(overrides: str | dict, source: str, stages_only: bool) -> tuple[str, dict]:
    """`{"0": {...}, "1": {...}[, top-level keys]}` → a layer shaped like a YAML document."""
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{source}: not valid JSON: {err}") from err
    if not isinstance(overrides, dict):
        raise ConfigError(f"{source}: expected a mapping of stage id to settings")
    doc: dict = {}
    stages: dict[int, dict] = {}
    for key, value in overrides.items():
        is_stage_key = isinstance(key, int) or (isinstance(key, str) and key.isdigit())
        if not is_stage_key:
            if stages_only:
                raise ConfigError(f"{source}: {key}: not a stage id (keys are \"0\" and \"1\")")
            if key == "base_config":
                raise ConfigError(f"{source}: base_config: only a YAML file may set it")
            doc[key] = value
            continue
        stage_id = int(key)
        _check_stage_id(stage_id, f"{source}: stages[{stage_id}]")
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: stages[{stage_id}]: expected a mapping of settings")
        value = dict(value)
        if value.pop("stage_id", stage_id) != stage_id:
            raise ConfigError(f"{source}: stages[{stage_id}].stage_id: cannot be changed")
        stages[stage_id] = value
    if stages:
        doc["stages"] = stages
    return source, doc


def _merge(dst: dict, src: dict, path: KeyPath, origins: dict[KeyPath, str], source: str) -> None:
    """Deep-merge `src` into `dst`, recording which source set each key path."""
    for key, value in src.items():
        key_path = (*path, key)
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value, key_path, origins, source)
            origins[key_path] = source
        else:
            dst[key] = copy.deepcopy(value)
            _record(value, key_path, origins, source)


def _record(value: Any, key_path: KeyPath, origins: dict[KeyPath, str], source: str) -> None:
    origins[key_path] = source
    if isinstance(value, dict):
        for key, sub in value.items():
            _record(sub, (*key_path, key), origins, source)
