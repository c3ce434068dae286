"""Model layouts for `kvcert plan`: the bundled model files and Hugging Face config.json.

A model file (format kvcert-model/1) names each layer type once, lists the layers as a
sequence of type names and repeated patterns, and cites a source for every number:

    {"format": "kvcert-model/1", "name": "...", "description": "...", "dtype": "bf16",
     "max_model_len": 262144, "speculative": "exact",                   optional
     "layer_types": {"sliding": LAYER, "global": LAYER},                 planning.py LAYER
     "layers": ["global", {"repeat": 5, "pattern": ["sliding", "global"]}],
     "sources": {"hf": "https://...: the facts used"},
     "cite": {"max_model_len": "hf", "layers": "hf", "layer_types.sliding.window": "hf", ...}}

A source whose text starts with "ASSUMPTION" marks numbers nobody has verified yet; `kvcert
plan` prints them. A Hugging Face config.json is mapped field by field (kvcert.conformance.
hf_config); what cannot be mapped is refused with the field's name, and the mapping's notes
(the rule that set the layer kinds, the fields read and those ignored) are printed too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.contract.plans import MAX_LAYERS, layer_from_json
from kvcert.conformance.tools.hf_config import from_hf_config

MODELS = resources.files("kvcert.conformance.tools") / "models"
FORMAT = "kvcert-model/1"
MODEL_FIELDS = (
    "format",
    "name",
    "description",
    "dtype",
    "max_model_len",
    "speculative",
    "layer_types",
    "layers",
    "sources",
    "cite",
)


@dataclass(frozen=True)
class Model:
    """A model as the planner needs it: layers in plan-input JSON, plus provenance."""

    name: str
    description: str
    dtype: str  # the model's dtype, what kv-cache dtype `auto` means
    max_model_len: int | None
    layers: tuple[JSON, ...]
    speculative: str | None = None
    assumptions: tuple[str, ...] = ()  # sources that are assumptions, to print
    notes: tuple[str, ...] = ()  # how a config.json was mapped, to print


def model_names() -> list[str]:
    """Names of the bundled model files."""
    return sorted(
        p.name.removesuffix(".json") for p in MODELS.iterdir() if p.name.endswith(".json")
    )


def numeric_paths(obj: object, prefix: str) -> list[str]:
    """Dotted paths of the numbers in `obj`; a list of numbers counts as one path."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int | float):
        return [prefix]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in numeric_paths(v, f"{prefix}.{k}")]
    if isinstance(obj, list) and any(numeric_paths(v, prefix) for v in obj):
        return [prefix]
    return []


def _expand(items: object, types: dict[str, Any], where: str) -> list[str]:
    if not isinstance(items, list) or not items:
        raise InputError(f"{where}: expected a non-empty list of type names and patterns")
    names: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            names.append(item)
            continue
        if not isinstance(item, dict) or set(item) != {"repeat", "pattern"}:
            raise InputError(
                f'{where}[{i}]: expected a type name or {{"repeat": n, "pattern": [...]}}'
            )
        repeat = item["repeat"]
        if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_LAYERS:
            raise InputError(f"{where}[{i}].repeat: expected an integer in [1, {MAX_LAYERS}]")
        names.extend(_expand(item["pattern"], types, f"{where}[{i}].pattern") * repeat)
        if len(names) > MAX_LAYERS:
            raise InputError(f"{where}: more than {MAX_LAYERS:,} layers")
    unknown = sorted({n for n in names if n not in types})
    if unknown:
        raise InputError(f"{where}: unknown layer type(s) {unknown}; defined: {sorted(types)}")
    return names


def parse_model(obj: object, where: str) -> Model:
    """A model file's JSON -> Model, with every number's citation checked."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object")
    unknown = sorted(set(obj) - set(MODEL_FIELDS))
    if unknown:
        raise InputError(f"{where}: unknown field(s) {unknown}; allowed: {list(MODEL_FIELDS)}")
    if obj.get("format") != FORMAT:
        raise InputError(f"{where}: format must be {FORMAT!r}")
    for required in ("name", "dtype", "layer_types", "layers", "sources", "cite"):
        if required not in obj:
            raise InputError(f"{where}: missing field {required!r}")
    types = obj["layer_types"]
    if not isinstance(types, dict) or not types:
        raise InputError(f"{where}.layer_types: expected an object of named layer types")
    for name, layer in types.items():
        layer_from_json(layer, f"{where}.layer_types.{name}")  # validates each type
    sources, cite = obj["sources"], obj["cite"]
    if not isinstance(sources, dict) or not isinstance(cite, dict):
        raise InputError(f"{where}: sources and cite must be objects")
    needed = [*numeric_paths(types, "layer_types"), "layers"]
    if "max_model_len" in obj:
        needed.append("max_model_len")
    missing = [p for p in needed if p not in cite]
    if missing:
        raise InputError(f"{where}: no source cited for {missing}; add them to cite")
    dangling = sorted({s for s in cite.values() if s not in sources})
    if dangling:
        raise InputError(f"{where}: cite names unknown sources {dangling}")
    names = _expand(obj["layers"], types, f"{where}.layers")
    layers = tuple({**types[n], "name": f"{i}:{n}"} for i, n in enumerate(names))
    assumptions = tuple(
        f"{key}: {text}" for key, text in sources.items() if str(text).startswith("ASSUMPTION")
    )
    return Model(
        name=str(obj["name"]),
        description=str(obj.get("description", "")),
        dtype=str(obj["dtype"]),
        max_model_len=obj.get("max_model_len"),
        layers=layers,
        speculative=obj.get("speculative"),
        assumptions=assumptions,
    )


def load_model(name_or_path: str) -> Model:
    """A bundled model by name, a kvcert model file, or a Hugging Face config.json."""
    if name_or_path in model_names():
        text = (MODELS / f"{name_or_path}.json").read_text(encoding="utf-8")
        return parse_model(json.loads(text), name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise InputError(
            f"{name_or_path!r} is neither a bundled model ({', '.join(model_names())}) nor a "
            "file; give a kvcert model file or a Hugging Face config.json"
        )
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read JSON: {error}") from error
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        return parse_model(obj, str(path))
    mapped = from_hf_config(obj, str(path))
    return Model(
        name=mapped.name,
        description=f"mapped from {path}",
        dtype=mapped.dtype,
        max_model_len=mapped.max_model_len,
        layers=mapped.layers,
        notes=mapped.notes,
    )
