"""The scheduler's per-request steps, as each SGLang release names them.

The alloc suite plays the same request life on every release: the lookup, the lock that
the prefill adder takes, the chunk's range, the result step that publishes a prefill, and
the release. The releases spell these steps differently; nothing else differs here:

    step            0.5.23                          0.5.9 .. 0.5.19
    lock            tree.lock(node) -> handle       tree.inc_lock_ref(node)
    unlock          tree.unlock(handle)             tree.dec_lock_ref(node)
    chunk range     req.extend_end = end            req.set_extend_range(start, end)
                                                    (0.5.9: set_extend_input_len + fill_ids)
    prefill result  checkpoint_kv_cache(req, tree)  cache_unfinished_req(req, chunked=...)
    finish          release_kv_cache(checkpoint=T)  release_kv_cache(is_insert=True)
    retraction      release_kv_cache(checkpoint=F)  release_kv_cache(is_insert=False)
    cache salt      Req(cache_salt=) from 0.5.19    Req(extra_key=) as the OpenAI layer
                                                    composes it

Before 0.5.23 the scheduler caches a middle chunk when it schedules the next step
(`stash_chunked_request`), not in the result step; no operation of the suite falls between
the two, so the suite plays both at the step's end.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RequestSteps:
    """One release's spelling of the steps the alloc suite plays."""

    common: Any  # sglang.srt.mem_cache.common
    checkpoints: bool  # 0.5.23: checkpoint_kv_cache and release_kv_cache(checkpoint=)

    def lock(self, tree: Any, req: Any) -> Any:
        """Protect the request's matched path from eviction: the prefill adder's lock."""
        if self.checkpoints:
            return tree.lock(req.last_node)
        tree.inc_lock_ref(req.last_node)
        return req.last_node

    def unlock(self, tree: Any, handle: Any) -> None:
        if self.checkpoints:
            tree.unlock(handle)
        else:
            tree.dec_lock_ref(handle)

    def keep_lock(self, req: Any, handle: Any) -> None:
        """Hand the lock to the request, where its release will find it."""
        if self.checkpoints:
            req.lock = handle

    def set_range(self, req: Any, start: int, end: int) -> None:
        """This round computes fill ids [start, end): the adder's truncation."""
        if self.checkpoints:
            req.extend_end = end
        elif hasattr(req, "set_extend_range"):
            req.set_extend_range(start, end)
        else:  # 0.5.9
            req.set_extend_input_len(end - start)
            req.fill_ids = req.fill_ids[:end]

    def publish_prefill(self, req: Any, tree: Any, *, prompt_done: bool) -> None:
        """The result step of a prefill chunk: its pages enter the tree."""
        if self.checkpoints:
            self.common.checkpoint_kv_cache(req, tree)
        elif hasattr(self.common, "maybe_cache_unfinished_req"):
            self.common.maybe_cache_unfinished_req(req, tree, chunked=not prompt_done)
        else:  # 0.5.9
            tree.cache_unfinished_req(req, chunked=not prompt_done)

    def release(self, req: Any, tree: Any, *, insert: bool) -> None:
        """A finished request (insert) or a retracted one gives its KV back."""
        keep = "checkpoint" if self.checkpoints else "is_insert"
        self.common.release_kv_cache(req, tree, **{keep: insert})


def committed(req: Any) -> int:
    """The tokens whose KV the request holds (SGLang commits at allocation)."""
    holder = getattr(req, "kv", req)  # 0.5.19 moved the request's KV fields into req.kv
    return int(holder.kv_committed_len)


def pool_row(req: Any) -> int:
    holder = getattr(req, "kv", req)
    return int(holder.req_pool_idx)


@cache
def request_steps() -> RequestSteps:
    common = importlib.import_module("sglang.srt.mem_cache.common")
    release = inspect.signature(common.release_kv_cache).parameters
    return RequestSteps(common, checkpoints="checkpoint" in release)


@dataclass
class RequestKeys:
    """The cache keys the server gives a request: its cache salt and its LoRA adapter.

    A LoRA adapter is loaded as the server loads `--lora-paths` adapters, at a path of its
    own, and named in the tree by the id SGLang's registry gives it (`LoRARef`: the
    name-and-path id from 0.5.15, a fresh id per load before), one id per adapter name for
    the whole session. The salt is a field of the request from 0.5.19 (sglang#30827);
    before, the OpenAI layer folds it into `extra_key` (`_compute_extra_key`).
    """

    lora_ids: dict[str, str] = field(default_factory=dict)

    def for_request(self, cache_salt: str | None, lora: str | None) -> dict[str, Any]:
        """Req's keyword arguments for a request with this salt and adapter."""
        keys: dict[str, Any] = {}
        if lora is not None:
            keys["lora_id"] = self._lora_id(lora)
        if cache_salt is not None:
            if "cache_salt" in inspect.signature(_request_class()).parameters:
                keys["cache_salt"] = cache_salt
            else:
                keys["extra_key"] = serving_extra_key(cache_salt)
        return keys

    def _lora_id(self, name: str) -> str:
        if name not in self.lora_ids:
            ref = importlib.import_module("sglang.srt.lora.lora_registry").LoRARef
            path = f"/lora/{name}"
            if hasattr(ref, "deterministic_id"):
                self.lora_ids[name] = ref.deterministic_id(name, path)
            else:
                self.lora_ids[name] = ref(lora_name=name, lora_path=path).lora_id
        return self.lora_ids[name]


def _request_class() -> Any:
    return importlib.import_module("sglang.srt.managers.schedule_batch").Req


def serving_extra_key(cache_salt: str) -> str | None:
    """The `extra_key` SGLang's OpenAI layer gives a salted request before 0.5.19.

    Its module imports the HTTP server's packages, which the engine venv lacks, so the one
    method is compiled from the release's own source and called as the layer calls it.
    """
    compose = _compute_extra_key()
    request = types.SimpleNamespace(cache_salt=cache_salt, extra_key=None)
    key: str | None = compose(None, request)
    return key


@cache
def _compute_extra_key() -> Any:
    package = Path(str(importlib.import_module("sglang").__file__)).parent
    source = package / "srt" / "entrypoints" / "openai" / "serving_base.py"
    module = ast.parse(source.read_text(encoding="utf-8"))
    method = next(
        node
        for node in ast.walk(module)
        if isinstance(node, ast.FunctionDef) and node.name == "_compute_extra_key"
    )
    method.returns = None  # its annotations name types of the HTTP layer
    for argument in method.args.args:
        argument.annotation = None
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(source), "exec"), namespace)
    return namespace["_compute_extra_key"]
