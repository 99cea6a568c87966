"""The protocol model (model/reckon.pml) checked by spin, exhaustively: every configuration of the real model has 0
errors, and every sabotaged model fails — with the property it breaks, not any error — so the check is shown able
to fail. The model names the code each action mirrors; those names are checked to still exist.

Touches no database: skipped in CI's PostgreSQL pass (it runs once, in the SQLite pass). Needs spin and gcc
(Debian's ``spin`` package): skipped without them on a developer's machine, a failure in CI (``CI`` set).
"""

import os
import re
from pathlib import Path

import pytest

from model import check

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="the model check touches no database: it runs in the SQLite pass only",
    ),
]


@pytest.fixture(scope="module")
def spin() -> None:
    if check.spin_available():
        return
    if os.environ.get("CI"):
        pytest.fail("spin and gcc must be installed in CI (apt-get install -y spin): the model check must run")
    pytest.skip("spin is not installed (apt-get install -y spin): the protocol model is not checked here")


@pytest.mark.parametrize("name", [c.name for c in check.CONFIGS])
def test_the_model_holds_every_property(spin: None, name: str) -> None:
    config = check.config_named(name)
    result = check.check(config)
    print(  # the figures, for docs/verification.md (printed, not asserted)
        f"\n{result.name}: {result.errors} errors, {result.states} states, depth {result.depth},"
        f" {result.memory_mb:.0f} MB, {result.seconds:.1f} s ({config.bounds})"
    )
    assert result.errors == 0, f"{result.violation}\n{result.report[-3000:]}"


@pytest.mark.parametrize(
    "sabotage", check.SABOTAGES, ids=lambda s: f"{s.define.removeprefix('-DSABOTAGE_').lower()}-{s.config}"
)
def test_a_sabotaged_model_fails_the_property_it_breaks(spin: None, sabotage: check.Sabotage) -> None:
    result = check.check(check.config_named(sabotage.config), sabotage.define)
    print(f"\n{result.name}: {result.errors} errors after {result.states} states: {result.violation}")
    assert result.errors >= 1, f"{sabotage.define} passed the check: the model cannot see what it breaks"
    assert result.violated() == sabotage.violates, result.violation


def test_every_property_is_checked_in_every_configuration() -> None:
    """No property sits behind a switch that the passing configurations leave off (as P7 once did, as a known gap
    checked to still fail): the model has no check-only define, and every -D a configuration or a sabotage passes is
    one the model reads."""
    text = check.MODEL.read_text()
    switches = set(re.findall(r"#ifn?def (\w+)", text))
    assert not {s for s in switches if s.startswith("CHECK_")}, switches
    passed = {d.removeprefix("-D").partition("=")[0] for c in check.CONFIGS for d in c.defines}
    passed |= {s.define.removeprefix("-D") for s in check.SABOTAGES}
    assert passed <= switches, passed - switches


def test_p7_holds_where_a_late_request_can_reach_it() -> None:
    """P7 holds in the configurations that exercise it — a cancel, people, a lost answer with a takeover, each
    remote (one that fences, one that cannot: the deadline) — and a sabotage breaks it in each kind: the fence, the
    deadline, the person's not done."""
    names = {c.name for c in check.CONFIGS}
    assert {"cancel", "people", "people-late", "cancel-deadline", "people-late-deadline"} <= names
    breaking = {(s.define, s.config) for s in check.SABOTAGES if s.violates == "P7 not_done_stays_not_done"}
    assert ("-DSABOTAGE_IGNORE_FENCE", "cancel") in breaking
    assert ("-DSABOTAGE_NOT_FOUND_FINAL", "cancel-deadline") in breaking
    assert {config for _, config in breaking} >= {"people-late", "people-late-deadline"}
    deadline = {c.name for c in check.CONFIGS if "-DREMOTE_CANNOT_FENCE" in c.defines}
    assert {"cancel-deadline", "people-late-deadline", "deadline-live"} <= deadline


def test_a_sabotage_checked_in_a_configuration_that_cannot_reach_it_is_not_a_pass() -> None:
    """The runner's verdict is by property: an error of another kind, or none, fails the sabotage."""
    unrelated = check.Result("x", 1, 10, 5, 1.0, 0.1, "pan:1: invalid end state (at depth 3)", "")
    assert unrelated.violated() == "deadlock"
    assert check.Result("x", 0, 10, 5, 1.0, 0.1, "", "").violated() == ""


def test_the_code_the_model_names_still_exists() -> None:
    """Each action's comment names file:function (or file:Class.member); a rename in the code fails here, so the
    model is looked at again when the code it mirrors moves."""
    text = check.MODEL.read_text()
    named = set(re.findall(r"([a-z_]+(?:/[a-z_]+)*\.py):([A-Za-z_][\w.]*)", text))
    assert len(named) >= 15, named
    missing = []
    for path, name in sorted(named):
        source = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        owner, _, member = name.partition(".")
        found = re.search(rf"^\s*(def|class) {owner}\b|^{owner}\s*[:=]", source, re.M)
        if not found or (member and not re.search(rf"\b{member}\b", source)):
            missing.append(f"{path}:{name}")
    assert not missing, f"the model names code that no longer exists: {missing}"
