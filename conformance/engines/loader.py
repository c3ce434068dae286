"""Finding an engine by name: a `kvcert.engines` entry point or `module:factory`."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from kvcert.conformance.contract.protocol import Engine, EngineError


def load_engine(name: str) -> Engine:
    """An engine from an entry-point name (reference, spec, vllm, sglang, ...) or
    `module:factory`; EngineError saying what to do when it cannot be made."""
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            factory: Any = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise EngineError(f"cannot load engine {name!r}: {error}") from error
    else:
        found = entry_points(group="kvcert.engines", name=name)
        if not found:
            known = sorted(e.name for e in entry_points(group="kvcert.engines"))
            raise EngineError(
                f"no engine named {name!r}; installed: {known}, or give module:factory"
            )
        factory = next(iter(found)).load()
    if not callable(factory):
        raise EngineError(f"{name!r} names {factory!r}, which is not a factory to call")
    try:
        engine = factory()
    except EngineError:
        raise
    except Exception as error:
        raise EngineError(
            f"the factory of engine {name!r} raised {type(error).__name__}: {error}"
        ) from error
    if not isinstance(engine, Engine):
        raise EngineError(f"{name!r} made {engine!r}, which has no describe()/run()")
    return engine
