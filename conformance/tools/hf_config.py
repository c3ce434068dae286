"""Hugging Face config.json -> a model's cache layers, field by field, saying which fields
decided what.

A config.json often omits the per-layer kinds: the model's transformers config class derives
them from a pattern field or a per-family default. kvcert applies those rules explicitly, in
this order, and records which fields it read:

    layer_types                       one kind per layer (checked against a pattern if both)
    full_attention_interval           every n-th layer full, the rest linear attention (GDN)
    attn_layer_period / _offset       Jamba: attention at the offset, Mamba elsewhere
    attention_chunk_size              Llama 4: no_rope_layers (1 = chunked) or every
                                      no_rope_layer_interval-th layer full
    sliding_window (when in use)      sliding_window_pattern: layer i full iff (i+1) % p == 0;
                                      else the family's default pattern (gemma2, gpt_oss: 2;
                                      gemma3: 6; gemma4: 6, last layer full; cohere2: 4);
                                      else max_window_layers (Qwen2 family: layers from it
                                      slide); else mistral/mixtral: every layer slides
    none of them                      every layer full attention

A config that sets a sliding window (or a chunk) without anything saying which layers use it
is refused, as is any field kvcert does not map but that changes what layers cache. Every
mapping carries notes: the rule used, the fields read, and the cache-relevant fields present
but not read, so an unknown model type never silently becomes "all full attention".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.contract.plans import MAX_LAYERS

HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
TYPE_NAMES = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
}
# transformers' defaults when config.json has a sliding window but no layer_types:
# (sliding_window_pattern, whether the last layer is forced to full attention)
FAMILY_PATTERNS = {
    "gemma2": (2, False),
    "gpt_oss": (2, False),
    "gemma3": (6, False),
    "gemma3_text": (6, False),
    "gemma4": (6, True),
    "gemma4_text": (6, True),
    "cohere2": (4, False),
}
ALL_SLIDING = frozenset({"mistral", "mixtral"})
KNOWN_FULL = frozenset(
    {"llama", "gemma", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"}
)
# Fields that change what layers cache but that kvcert does not map: refused by name.
UNMAPPED = (
    "compress_ratios",
    "hybrid_override_pattern",
    "cross_attention_layers",
    "num_kv_shared_layers",
)
# Fields that matter to the cache; those present but never read are reported.
RELEVANT = frozenset(
    {
        *TYPE_NAMES,
        "layer_types",
        "sliding_window",
        "sliding_window_pattern",
        "use_sliding_window",
        "max_window_layers",
        "attention_chunk_size",
        "no_rope_layers",
        "no_rope_layer_interval",
        "full_attention_interval",
        "attn_layer_period",
        "attn_layer_offset",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "num_global_key_value_heads",
        "head_dim",
        "global_head_dim",
        "hidden_size",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "mamba_ssm_dtype",
        "mamba_expand",
        "mamba_d_conv",
        "mamba_d_state",
        "torch_dtype",
        "dtype",
        "max_position_embeddings",
        "interleaved_sliding_window",
    }
)


@dataclass
class _Reader:
    """A config dict that remembers which fields were read."""

    config: dict[str, Any]
    where: str
    read: set[str] = field(default_factory=set)

    def has(self, key: str) -> bool:
        """Whether the field is set (not absent, not null); reading it counts as using it."""
        if key in self.config:
            self.read.add(key)
        return self.config.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.config:
            self.read.add(key)
        return self.config.get(key, default)

    def int(self, key: str, minimum: int = 0) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise InputError(
                f"{self.where}: config field {key!r} must be an integer >= {minimum}, got {value!r}"
            )
        return value

    def refuse(self, message: str) -> InputError:
        return InputError(
            f"{self.where}: {message}; describe the layers in a kvcert model file instead "
            "(format in `kvcert plan --list`'s bundled files)"
        )


@dataclass(frozen=True)
class Mapped:
    """A config.json's layers (plan-input JSON, one per layer) and how they were found."""

    name: str
    dtype: str
    max_model_len: int | None
    layers: tuple[JSON, ...]
    notes: tuple[str, ...]


def _pattern_kinds(count: int, pattern: int, last_full: bool) -> list[str]:
    kinds = ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(count)]
    if last_full and kinds:
        kinds[-1] = "full"
    return kinds


def _sliding_kinds(fields: _Reader, count: int, model_type: str) -> tuple[list[str], str]:
    if fields.has("sliding_window_pattern"):
        pattern = fields.int("sliding_window_pattern", 1)
        last_full = FAMILY_PATTERNS.get(model_type, (0, False))[1]
        rule = f"sliding_window_pattern={pattern}: layer i is full iff (i+1) % {pattern} == 0"
        return _pattern_kinds(count, pattern, last_full), rule + (
            ", the last layer full" if last_full else ""
        )
    if model_type in FAMILY_PATTERNS:
        pattern, last_full = FAMILY_PATTERNS[model_type]
        rule = f"{model_type}'s default pattern {pattern} (transformers)"
        return _pattern_kinds(count, pattern, last_full), rule + (
            ", the last layer full" if last_full else ""
        )
    if fields.has("max_window_layers"):
        first = fields.int("max_window_layers")
        kinds = ["sliding" if i >= first else "full" for i in range(count)]
        return kinds, f"max_window_layers={first}: layers from {first} on slide (Qwen2 family)"
    if model_type in ALL_SLIDING:
        return ["sliding"] * count, f"{model_type}: every layer slides"
    raise fields.refuse(
        f"sliding_window={fields.get('sliding_window')!r} is set, but no field says which "
        f"layers use it (layer_types, sliding_window_pattern, max_window_layers) and "
        f"model_type {model_type!r} has no known default"
    )


def layer_kinds(fields: _Reader, count: int, model_type: str) -> tuple[list[str], str]:
    """One of full / sliding / chunked / linear / mamba per layer, and the rule used."""
    if fields.has("layer_types"):
        types = fields.get("layer_types")
        if not isinstance(types, list) or len(types) != count:
            raise InputError(f"{fields.where}: layer_types must list {count} layer types")
        unknown = sorted({str(t) for t in types if t not in TYPE_NAMES})
        if unknown:
            raise InputError(
                f"{fields.where}: layer_types {unknown} are not mapped; known: {sorted(TYPE_NAMES)}"
            )
        kinds = [TYPE_NAMES[t] for t in types]
        if fields.has("sliding_window_pattern") and fields.has("sliding_window"):
            implied, _ = _sliding_kinds(fields, count, model_type)
            if implied != kinds and set(kinds) <= {"full", "sliding"}:
                raise fields.refuse(
                    "layer_types and sliding_window_pattern disagree on which layers slide"
                )
        return kinds, "layer_types"
    if fields.has("full_attention_interval"):
        every = fields.int("full_attention_interval", 1)
        kinds = ["full" if (i + 1) % every == 0 else "linear" for i in range(count)]
        return kinds, f"full_attention_interval={every}: every {every}th layer full, the rest GDN"
    if fields.has("attn_layer_period"):
        period = fields.int("attn_layer_period", 1)
        offset = fields.int("attn_layer_offset")
        kinds = ["full" if i % period == offset else "mamba" for i in range(count)]
        return kinds, f"attn_layer_period={period}, attn_layer_offset={offset} (Jamba)"
    if fields.has("attention_chunk_size"):
        rope = fields.get("no_rope_layers")
        if isinstance(rope, list) and len(rope) == count:
            return ["chunked" if r else "full" for r in rope], "no_rope_layers (1 = chunked)"
        if fields.has("no_rope_layer_interval"):
            every = fields.int("no_rope_layer_interval", 1)
        elif model_type in ("llama4", "llama4_text"):
            every = 4  # transformers' Llama4TextConfig default
        else:
            raise fields.refuse(
                "attention_chunk_size is set, but neither no_rope_layers nor "
                "no_rope_layer_interval says which layers are chunked"
            )
        kinds = ["full" if (i + 1) % every == 0 else "chunked" for i in range(count)]
        return kinds, f"no_rope_layer_interval={every}: every {every}th layer full, rest chunked"
    if fields.has("sliding_window") and fields.get("use_sliding_window", True) is not False:
        return _sliding_kinds(fields, count, model_type)
    return ["full"] * count, "no field names another kind: every layer full attention"


def from_hf_config(obj: object, where: str) -> Mapped:
    """Map a Hugging Face config.json (or its text_config); refuse what cannot be mapped."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object")
    config = obj.get("text_config") or obj
    if not isinstance(config, dict):
        raise InputError(f"{where}: text_config must be a JSON object")
    fields = _Reader(config, where)
    for unmapped in UNMAPPED:
        if fields.get(unmapped):
            raise fields.refuse(
                f"config field {unmapped!r} changes what layers cache and is not mapped"
            )
    count = fields.int("num_hidden_layers", 1)
    if count > MAX_LAYERS:
        raise InputError(f"{where}: num_hidden_layers {count:,} is over {MAX_LAYERS:,}")
    dtype_name = fields.get("torch_dtype") or fields.get("dtype") or obj.get("torch_dtype")
    dtype = HF_DTYPES.get(str(dtype_name))
    if dtype is None:
        raise InputError(f"{where}: torch_dtype {dtype_name!r} is not one of {sorted(HF_DTYPES)}")
    model_type = str(config.get("model_type") or obj.get("model_type") or "")
    kinds, rule = layer_kinds(fields, count, model_type)
    layers = tuple(
        {**_layer(fields, kind, dtype), "name": f"{i}:{kind}"} for i, kind in enumerate(kinds)
    )
    max_len = (
        fields.int("max_position_embeddings", 1) if fields.has("max_position_embeddings") else None
    )
    notes = [f"layer kinds: {rule}"]
    if not {"full", "sliding", "chunked"} & set(kinds):
        notes.append(
            "no layer is attention: every layer keeps a recurrent state, so the cache holds "
            "no per-token KV and a token capacity does not apply"
        )
    notes.append(f"fields read: {', '.join(sorted(fields.read))}")
    unread = sorted((set(config) & RELEVANT) - fields.read)
    if unread:
        notes.append(f"cache-relevant fields present but not used: {', '.join(unread)}")
    known = KNOWN_FULL | ALL_SLIDING | set(FAMILY_PATTERNS) | {"jamba", "qwen3_next"}
    if model_type not in known:
        notes.append(
            f"model_type {model_type or '(none)'!r} is not one kvcert has checked; the kinds "
            "above follow only from the fields read"
        )
    return Mapped(
        name=model_type or where,
        dtype=dtype,
        max_model_len=max_len,
        layers=layers,
        notes=tuple(notes),
    )


def _head_size(fields: _Reader) -> int:
    if fields.has("head_dim"):
        return fields.int("head_dim", 1)
    hidden = fields.int("hidden_size", 1)
    heads = fields.int("num_attention_heads", 1)
    if hidden % heads:
        raise InputError(
            f"{fields.where}: hidden_size {hidden} is not a multiple of num_attention_heads "
            f"{heads}, so the head size is not hidden_size / heads; set head_dim"
        )
    return hidden // heads


def _layer(fields: _Reader, kind: str, dtype: str) -> JSON:
    if kind in ("full", "sliding") and fields.has("kv_lora_rank"):
        layer: JSON = {
            "kind": "full",
            "latent_size": fields.int("kv_lora_rank", 1),
            "rope_size": fields.int("qk_rope_head_dim"),
        }
        if kind == "sliding":
            layer.update(kind="sliding_window", window=fields.int("sliding_window", 1))
        return layer
    if kind in ("full", "sliding", "chunked"):
        heads = fields.int("num_key_value_heads", 1)
        if fields.has("num_attention_heads"):
            queries = fields.int("num_attention_heads", 1)
            if heads > queries or queries % heads:
                raise InputError(
                    f"{fields.where}: num_key_value_heads {heads} must divide "
                    f"num_attention_heads {queries} (each KV head serves a whole group of "
                    "query heads); check the config"
                )
        head = _head_size(fields)
        if kind == "full" and fields.has("global_head_dim"):  # Gemma 4 global layers
            head = fields.int("global_head_dim", 1)
            if fields.has("num_global_key_value_heads"):
                heads = fields.int("num_global_key_value_heads", 1)
        layer = {"kind": "full", "num_kv_heads": heads, "head_size_k": head, "head_size_v": head}
        if kind == "sliding":
            layer.update(kind="sliding_window", window=fields.int("sliding_window", 1))
        if kind == "chunked":
            layer.update(kind="chunked_local", chunk=fields.int("attention_chunk_size", 1))
        return layer
    if kind == "linear":  # Gated DeltaNet (Qwen3-Next, Qwen3.5)
        k_heads = fields.int("linear_num_key_heads", 1)
        v_heads = fields.int("linear_num_value_heads", 1)
        k_dim = fields.int("linear_key_head_dim", 1)
        v_dim = fields.int("linear_value_head_dim", 1)
        kernel = fields.int("linear_conv_kernel_dim", 2)
        ssm = HF_DTYPES.get(str(fields.get("mamba_ssm_dtype")), dtype)
        conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        return {
            "kind": "mamba",
            "tensors": [
                {"shape": [kernel - 1, conv_dim], "dtype": dtype},
                {"shape": [v_heads, k_dim, v_dim], "dtype": ssm},
            ],
        }
    inner = fields.int("mamba_expand", 1) * fields.int("hidden_size", 1)  # Mamba-1 (Jamba)
    return {
        "kind": "mamba",
        "tensors": [
            {"shape": [inner, fields.int("mamba_d_conv", 2) - 1], "dtype": dtype},
            {"shape": [inner, fields.int("mamba_d_state", 1)], "dtype": dtype},
        ],
    }
