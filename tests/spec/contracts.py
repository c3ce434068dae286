"""Run the spec's `pre:`/`post:` docstring lines as runtime checks (PEP 316 style).

CrossHair reads the same lines symbolically (model-checking issue); here they are evaluated on
concrete calls so a contract that lies fails a test today.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any


class ContractViolation(AssertionError):
    """A pre- or postcondition evaluated to false."""


def conditions(function: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """The function's `pre:` and `post:` expressions."""
    pre, post = [], []
    for line in (inspect.getdoc(function) or "").splitlines():
        stripped = line.strip()
        if stripped.startswith("pre:"):
            pre.append(stripped.removeprefix("pre:").strip())
        elif stripped.startswith("post:"):
            post.append(stripped.removeprefix("post:").strip())
    return pre, post


def checked(function: Callable[..., Any], seen: set[str]) -> Callable[..., Any]:
    """Wrap `function` so every call evaluates its contracts; record its name in `seen`."""
    pre, post = conditions(function)
    compiled_pre = [(e, compile(e, f"<contract {function.__name__}>", "eval")) for e in pre]
    compiled_post = [(e, compile(e, f"<contract {function.__name__}>", "eval")) for e in post]
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        scope = {**function.__globals__, **bound.arguments}
        for expression, code in compiled_pre:
            if not eval(code, scope):
                raise ContractViolation(f"{function.__name__}: pre `{expression}` with {bound}")
        seen.add(function.__name__)  # before the call: a rule may raise by design (INPUT-1)
        result = function(*args, **kwargs)
        scope["__return__"] = result
        for expression, code in compiled_post:
            if not eval(code, scope):
                raise ContractViolation(
                    f"{function.__name__}: post `{expression}` with {bound} -> {result!r}"
                )
        seen.add(function.__name__)
        return result

    return wrapper


@contextmanager
def contracts_enforced(
    modules: tuple[ModuleType, ...], functions: list[Callable[..., Any]], seen: set[str]
) -> Iterator[None]:
    """Replace each function, wherever a module binds it (directly or as a value of a
    module-level dispatch dict), by its checked wrapper."""
    saved: list[tuple[Any, Any, Any]] = []  # (namespace, key, original)
    wrappers = {id(f): checked(f, seen) for f in functions}
    try:
        for module in modules:
            namespaces = [vars(module)]
            namespaces += [v for v in vars(module).values() if isinstance(v, dict)]
            for namespace in namespaces:
                for key, value in list(namespace.items()):
                    if id(value) in wrappers:
                        saved.append((namespace, key, value))
                        namespace[key] = wrappers[id(value)]
        yield
    finally:
        for namespace, key, value in saved:
            namespace[key] = value
