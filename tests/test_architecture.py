"""The architecture's rules, read from the source (docs/architecture.md says why each holds).

Four import rules, no import circle, and no module over 800 lines: each a check of the tree as
committed, with a broken twin that shows the check can fail.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"spec": "kvcert.spec", "reference": "kvcert.reference", "kernels": "kvcert.kernels",
           "conformance": "kvcert.conformance"}  # fmt: skip
# The engines kvcert drives, and the only modules that may import each (their rooms).
ENGINE_ROOMS = {
    "vllm": ("kvcert.conformance.vllm", "kvcert.reference.vllm"),
    "sglang": ("kvcert.conformance.sglang",),
}
LINE_LIMIT = 800
# The allocator state machine reads best whole (one transition per operation), and the C key
# index is one data structure.
OVER_THE_LIMIT = {"spec/alloc.py", "reference/_keyindex.c"}


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    folder, *rest = relative.parts
    if rest and rest[-1] == "__init__":
        rest.pop()
    return ".".join([FOLDERS[folder], *rest])


def sources() -> dict[str, Path]:
    """Every module of the four packages, by its import name."""
    return {
        module_name(path): path
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def _type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def top_level_imports(tree: ast.Module, name: str) -> set[str]:
    """What importing the module runs: imports at module level (inside module-level `if` and
    `try` too), not those inside functions or under TYPE_CHECKING."""
    found: set[str] = set()
    package = name if name.count(".") == 1 else name.rsplit(".", 1)[0]
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the package
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If | ast.Try) and not _type_checking(node):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    pending.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
    return found


def all_imports(tree: ast.Module) -> set[str]:
    """Every module an import statement names, wherever it stands (for `from M import x`:
    M, the package the rules are about)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def import_graph(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the kvcert modules importing it runs (names that are not modules dropped)."""
    return {
        name: {target for target in top_level_imports(tree, name) if target in modules} - {name}
        for name, tree in modules.items()
    }


def parsed() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in sources().items()}


def violations(modules: dict[str, ast.Module]) -> list[str]:
    """Each import that breaks one of the four rules, in words."""
    found = []
    for name, tree in modules.items():
        package = ".".join(name.split(".")[:2])
        for target in sorted(all_imports(tree)):
            top = target.split(".")[0]
            if top == "kvcert":
                target_package = ".".join(target.split(".")[:2])
                allowed = {
                    "kvcert.spec": {"kvcert.spec"},  # rule 1: the spec stands alone
                    "kvcert.reference": {"kvcert.reference"},  # rule 2: never the spec
                    "kvcert.kernels": {"kvcert.kernels", "kvcert.spec"},  # rule 3
                }.get(package)
                if allowed is not None and target_package not in allowed:
                    found.append(f"{name} imports {target}")
            elif top in ENGINE_ROOMS and not name.startswith(ENGINE_ROOMS[top]):  # rule 4
                found.append(f"{name} imports {target} outside {top}'s room")
    return found


def test_the_four_import_rules_hold():
    """1 the spec imports no other kvcert package; 2 the reference none either (never the
    spec: the differential tests would be tautologies); 3 the kernels only the spec (the
    layout they are certified against); 4 an engine is imported only in its room."""
    assert violations(parsed()) == []


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        ("kvcert.spec.twin", "from kvcert.reference import manager", "kvcert.spec.twin imports"),
        ("kvcert.reference.twin", "import kvcert.spec.hybrid", "kvcert.reference.twin imports"),
        ("kvcert.kernels.twin", "from kvcert.reference.pool import BlockPool", "kvcert.kernels"),
        ("kvcert.conformance.twin", "def f():\n    import vllm", "outside vllm's room"),
        ("kvcert.reference.twin", "from sglang.srt import x", "outside sglang's room"),
    ],
)
def test_each_import_rule_has_a_broken_twin(module, source, broken):
    (found,) = violations({module: ast.parse(source)})
    assert found.startswith(broken) or broken in found


def test_no_import_circle():
    """Importing any module never re-enters one that is still being imported."""
    graphlib.TopologicalSorter(import_graph(parsed())).prepare()


def test_an_import_circle_is_found():
    twin = {
        "kvcert.conformance.a": ast.parse("from kvcert.conformance import b"),
        "kvcert.conformance.b": ast.parse("import kvcert.conformance.c"),
        "kvcert.conformance.c": ast.parse("if True:\n    from kvcert.conformance.a import x"),
    }
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(import_graph(twin)).prepare()
    lazy = {**twin, "kvcert.conformance.c": ast.parse("def f():\n    import kvcert.conformance.a")}
    graphlib.TopologicalSorter(import_graph(lazy)).prepare()  # inside a function: no circle


def long_modules() -> list[str]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".py", ".c"} and "__pycache__" not in path.parts:
                lines = path.read_text(encoding="utf-8").count("\n")
                relative = path.relative_to(ROOT).as_posix()
                if lines > LINE_LIMIT and relative not in OVER_THE_LIMIT:
                    found.append(f"{relative}: {lines} lines")
    return found


def test_no_module_is_over_the_line_limit():
    assert long_modules() == []


def test_the_exceptions_to_the_line_limit_are_over_it():
    """An exception that no longer needs to be one is dropped from the list."""
    for relative in OVER_THE_LIMIT:
        assert (ROOT / relative).read_text(encoding="utf-8").count("\n") > LINE_LIMIT, relative
