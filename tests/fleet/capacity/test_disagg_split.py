"""The role split at equal paid replicas (`fleet.capacity.disagg_split`): the targets' proportion, within the stack's
bounds, at least one of each role; and the stack's keys it reads."""

from __future__ import annotations

import pytest

from fleet.capacity.disagg import DEFAULT_THRESHOLD_TOKENS
from fleet.capacity.disagg_split import RoleSplit, SplitContext, prefill_bounds, split_roles, stack_threshold
from tests.support.stacks import pool


@pytest.mark.parametrize(
    ("name", "ctx", "expected"),
    [
        ("the targets' proportion", SplitContext(4, 4, 6), RoleSplit(3, 3, False)),
        ("prefill-heavy, rounded", SplitContext(7, 1, 6), RoleSplit(5, 1, False)),
        ("decode-heavy", SplitContext(1, 9, 10), RoleSplit(1, 9, False)),
        ("at least one decode replica", SplitContext(20, 0, 4), RoleSplit(3, 1, True)),
        ("at least one prefill replica when any is needed", SplitContext(1, 99, 4), RoleSplit(1, 3, True)),
        ("the stack's max caps prefill", SplitContext(7, 1, 8, prefill_max=4), RoleSplit(4, 4, True)),
        ("the stack's min floors prefill", SplitContext(1, 9, 10, prefill_min=3), RoleSplit(3, 7, True)),
        ("no prefill needed and a 0 floor", SplitContext(0, 5, 5, prefill_min=0), RoleSplit(0, 5, False)),
        ("nothing needed: halves", SplitContext(0, 0, 4), RoleSplit(2, 2, False)),
        (
            "a floor above the budget keeps a decode replica",
            SplitContext(1, 3, 4, prefill_min=5),
            RoleSplit(3, 1, True),
        ),
    ],
)
def test_split_roles(name: str, ctx: SplitContext, expected: RoleSplit) -> None:
    assert split_roles(ctx) == expected, name


@pytest.mark.parametrize("budget", range(1, 40))
def test_the_split_spends_the_whole_budget(budget: int) -> None:
    for prefill, decode in [(0, 1), (1, 0), (3, 5), (13, 2)]:
        split = split_roles(SplitContext(prefill, decode, budget, prefill_max=budget // 2 or None))
        assert split.prefill + split.decode == budget
        assert split.decode >= 1 and split.prefill >= 0


def test_a_budget_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="budget of 1 replica or more"):
        split_roles(SplitContext(1, 1, 0))


def test_the_stack_keys_where_set_else_the_defaults() -> None:
    declared = pool(
        "local-pd", **{"disaggregation": {"thresholdTokens": 512, "prefill": {"replicas": {"min": 2, "max": 5}}}}
    )
    assert (stack_threshold(declared), prefill_bounds(declared)) == (512, (2, 5))
    plain = pool("prod")
    assert (stack_threshold(plain), prefill_bounds(plain)) == (DEFAULT_THRESHOLD_TOKENS, (1, None))
