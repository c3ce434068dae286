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
plan` prints them. A Hugging Face config.json is mapped field by field (see `from_hf_config`);
what cannot be mapped is refused with the field's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kvcert.conformance.planning import JSON, layer_from_json
from kvcert.conformance.scenario import ScenarioError

MODELS = resources.files("kvcert.conformance") / "models"
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
HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


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
        raise ScenarioError(f"{where}: expected a non-empty list of type names and patterns")
    names: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            names.append(item)
            continue
        if not isinstance(item, dict) or set(item) != {"repeat", "pattern"}:
            raise ScenarioError(
                f'{where}[{i}]: expected a type name or {{"repeat": n, "pattern": [...]}}'
            )
        repeat = item["repeat"]
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise ScenarioError(f"{where}[{i}].repeat: expected a positive integer")
        names.extend(_expand(item["pattern"], types, f"{where}[{i}].pattern") * repeat)
    unknown = sorted({n for n in names if n not in types})
    if unknown:
        raise ScenarioError(f"{where}: unknown layer type(s) {unknown}; defined: {sorted(types)}")
    return names


def parse_model(obj: object, where: str) -> Model:
    """A model file's JSON -> Model, with every number's citation checked."""
    if not isinstance(obj, dict):
        raise ScenarioError(f"{where}: expected a JSON object")
    unknown = sorted(set(obj) - set(MODEL_FIELDS))
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {unknown}; allowed: {list(MODEL_FIELDS)}")
    if obj.get("format") != FORMAT:
        raise ScenarioError(f"{where}: format must be {FORMAT!r}")
    for required in ("name", "dtype", "layer_types", "layers", "sources", "cite"):
        if required not in obj:
            raise ScenarioError(f"{where}: missing field {required!r}")
    types = obj["layer_types"]
    if not isinstance(types, dict) or not types:
        raise ScenarioError(f"{where}.layer_types: expected an object of named layer types")
    for name, layer in types.items():
        layer_from_json(layer, f"{where}.layer_types.{name}")  # validates each type
    sources, cite = obj["sources"], obj["cite"]
    if not isinstance(sources, dict) or not isinstance(cite, dict):
        raise ScenarioError(f"{where}: sources and cite must be objects")
    needed = [*numeric_paths(types, "layer_types"), "layers"]
    if "max_model_len" in obj:
        needed.append("max_model_len")
    missing = [p for p in needed if p not in cite]
    if missing:
        raise ScenarioError(f"{where}: no source cited for {missing}; add them to cite")
    dangling = sorted({s for s in cite.values() if s not in sources})
    if dangling:
        raise ScenarioError(f"{where}: cite names unknown sources {dangling}")
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
        raise ScenarioError(
            f"{name_or_path!r} is neither a bundled model ({', '.join(model_names())}) nor a "
            "file; give a kvcert model file or a Hugging Face config.json"
        )
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ScenarioError(f"{path}: cannot read JSON: {error}") from error
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        return parse_model(obj, str(path))
    return from_hf_config(obj, str(path))


# --- Hugging Face config.json -------------------------------------------------------------


def _int(config: dict[str, Any], key: str, where: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScenarioError(
            f"{where}: config field {key!r} must be a non-negative integer, got {value!r}"
        )
    return value


def _hf_layer_kinds(config: dict[str, Any], count: int, where: str) -> list[str]:
    """One of full / sliding / chunked / linear / mamba per layer."""
    names = {
        "full_attention": "full",
        "sliding_attention": "sliding",
        "chunked_attention": "chunked",
        "linear_attention": "linear",
    }
    if "layer_types" in config and config["layer_types"] is not None:
        types = config["layer_types"]
        if not isinstance(types, list) or len(types) != count:
            raise ScenarioError(f"{where}: layer_types must list {count} layer types")
        unknown = sorted({t for t in types if t not in names})
        if unknown:
            raise ScenarioError(
                f"{where}: layer_types {unknown} are not mapped; known: {sorted(names)}"
            )
        return [names[t] for t in types]
    if "full_attention_interval" in config:
        every = _int(config, "full_attention_interval", where)
        return ["full" if (i + 1) % every == 0 else "linear" for i in range(count)]
    if "attn_layer_period" in config:
        period = _int(config, "attn_layer_period", where)
        offset = _int(config, "attn_layer_offset", where)
        return ["full" if i % period == offset else "mamba" for i in range(count)]
    if config.get("attention_chunk_size"):
        rope = config.get("no_rope_layers")
        if isinstance(rope, list) and len(rope) == count:
            return ["chunked" if r else "full" for r in rope]
        every = (
            _int(config, "no_rope_layer_interval", where)
            if "no_rope_layer_interval" in config
            else 4
        )
        return ["full" if (i + 1) % every == 0 else "chunked" for i in range(count)]
    if config.get("sliding_window") and config.get("use_sliding_window", True):
        return ["sliding"] * count
    return ["full"] * count


def from_hf_config(obj: object, where: str) -> Model:
    """Map a Hugging Face config.json (or its text_config) to a Model; refuse what is unknown."""
    if not isinstance(obj, dict):
        raise ScenarioError(f"{where}: expected a JSON object")
    config = obj.get("text_config") or obj
    for unsupported in ("compress_ratios", "hybrid_override_pattern", "cross_attention_layers"):
        if unsupported in config:
            raise ScenarioError(
                f"{where}: config field {unsupported!r} is not mapped from config.json; "
                "describe the layers in a kvcert model file (see `kvcert plan --list`)"
            )
    count = _int(config, "num_hidden_layers", where)
    if count < 1:
        raise ScenarioError(f"{where}: num_hidden_layers must be >= 1")
    dtype_name = config.get("torch_dtype") or config.get("dtype") or obj.get("torch_dtype")
    dtype = HF_DTYPES.get(str(dtype_name))
    if dtype is None:
        raise ScenarioError(
            f"{where}: torch_dtype {dtype_name!r} is not one of {sorted(HF_DTYPES)}"
        )
    kinds = _hf_layer_kinds(config, count, where)
    layers: list[JSON] = []
    for i, kind in enumerate(kinds):
        layers.append({**_hf_layer(config, kind, dtype, where), "name": f"{i}:{kind}"})
    return Model(
        name=str(config.get("model_type") or obj.get("model_type") or where),
        description=f"mapped from {where}",
        dtype=dtype,
        max_model_len=config.get("max_position_embeddings"),
        layers=tuple(layers),
    )


def _hf_layer(config: dict[str, Any], kind: str, dtype: str, where: str) -> JSON:
    if "kv_lora_rank" in config and kind in ("full", "sliding"):
        layer: JSON = {
            "kind": "full",
            "latent_size": _int(config, "kv_lora_rank", where),
            "rope_size": _int(config, "qk_rope_head_dim", where),
        }
        if kind == "sliding":
            layer.update(kind="sliding_window", window=_int(config, "sliding_window", where))
        return layer
    if kind in ("full", "sliding", "chunked"):
        heads = _int(config, "num_key_value_heads", where)
        head = config.get("head_dim") or _int(config, "hidden_size", where) // _int(
            config, "num_attention_heads", where
        )
        if kind == "full" and config.get("global_head_dim"):  # Gemma 4 global layers
            head = _int(config, "global_head_dim", where)
            heads = config.get("num_global_key_value_heads") or heads
        layer = {"kind": "full", "num_kv_heads": heads, "head_size_k": head, "head_size_v": head}
        if kind == "sliding":
            layer.update(kind="sliding_window", window=_int(config, "sliding_window", where))
        if kind == "chunked":
            layer.update(kind="chunked_local", chunk=_int(config, "attention_chunk_size", where))
        return layer
    if kind == "linear":  # Gated DeltaNet (Qwen3-Next, Qwen3.5)
        k_heads = _int(config, "linear_num_key_heads", where)
        v_heads = _int(config, "linear_num_value_heads", where)
        k_dim = _int(config, "linear_key_head_dim", where)
        v_dim = _int(config, "linear_value_head_dim", where)
        kernel = _int(config, "linear_conv_kernel_dim", where)
        ssm = HF_DTYPES.get(str(config.get("mamba_ssm_dtype")), dtype)
        conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        return {
            "kind": "mamba",
            "tensors": [
                {"shape": [kernel - 1, conv_dim], "dtype": dtype},
                {"shape": [v_heads, k_dim, v_dim], "dtype": ssm},
            ],
        }
    # Mamba-1 (Jamba)
    inner = _int(config, "mamba_expand", where) * _int(config, "hidden_size", where)
    return {
        "kind": "mamba",
        "tensors": [
            {"shape": [inner, _int(config, "mamba_d_conv", where) - 1], "dtype": dtype},
            {"shape": [inner, _int(config, "mamba_d_state", where)], "dtype": dtype},
        ],
    }
