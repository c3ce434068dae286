"""kvcert.reference's rule table pairs every behavioural spec rule with the code that
implements it, and that code says so."""

from __future__ import annotations

import inspect

from kvcert.reference.rules import IMPLEMENTED_BY
from kvcert.spec.rules import all_rules

FAMILIES = ("HIT-", "HASH-", "ALLOC-", "RET-", "EVICT-", "CKPT-", "BRANCH-", "PAGE-", "RADIX-")
KERNELS = ("PAGE-ADDR-", "PAGE-SLOT-")  # byte addresses: implemented by kvcert.kernels
# the spec's names for its own pages and states: an engine's page ids are physical and
# reused, compared as lifetimes (conformance.contract.compare.LifetimeRenaming)
NAMING = ("RADIX-ID-", "RADIX-INV-")


def behavioural_rules() -> set[str]:
    return {
        r.tag
        for r in all_rules()
        if r.tag.startswith(FAMILIES) and not r.tag.startswith(KERNELS + NAMING)
    }


def test_every_behavioural_rule_has_an_implementation():
    assert behavioural_rules() - set(IMPLEMENTED_BY) == set()


def test_the_table_names_only_spec_rules():
    assert set(IMPLEMENTED_BY) - behavioural_rules() == set()


def test_every_listed_function_says_which_rule_it_implements():
    for tag, functions in IMPLEMENTED_BY.items():
        for function in functions:
            assert tag in (inspect.getdoc(function) or ""), (
                f"{function.__qualname__} is listed for {tag} but its docstring does not say so"
            )
