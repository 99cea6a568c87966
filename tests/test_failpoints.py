"""Failpoints are inert unless set; a kill is a real SIGKILL; kill_once fires once per (point, task) across
processes that share the marker folder."""

import os
import signal
import subprocess
import sys

import pytest

from tasks.engine import failpoints
from tasks.engine.failpoints import POINTS, FailpointHit, UnknownFailpoint, configure, failpoint, parse
from tests.simulator_fixture import ROOT


def test_an_unset_point_does_nothing_and_unknown_names_or_actions_are_refused(monkeypatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    for name in POINTS:
        failpoint(name, task_id=1)  # inert
    with pytest.raises(UnknownFailpoint, match="no failpoint 'befor_call'"):
        parse("befor_call=kill")
    with pytest.raises(UnknownFailpoint, match="unknown action"):
        parse("before_call=explode")
    with pytest.raises(UnknownFailpoint):
        parse("before_call=sleep(x)")
    assert parse("before_call=kill; after_call=sleep(20)") == {"before_call": "kill", "after_call": "sleep(20)"}


def test_configure_raises_in_process_and_is_undone_after_the_block(monkeypatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    with configure("after_call", "raise"), pytest.raises(FailpointHit, match="after_call"):
        failpoint("after_call")
    failpoint("after_call")  # off again
    monkeypatch.setenv(failpoints.ENV, "after_call=raise")
    with configure("after_call", "off"):
        failpoint("after_call")  # in-process configuration wins over the environment
    with pytest.raises(FailpointHit):
        failpoint("after_call")


def _hit(point: str, task_id: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = f"from tasks.engine.failpoints import failpoint; failpoint({point!r}, task_id={task_id}); print('survived')"
    return subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], cwd=ROOT, env=os.environ | env, capture_output=True, text=True, check=False
    )


def test_kill_once_kills_the_first_process_per_task_and_lets_the_next_one_through(tmp_path) -> None:
    env = {failpoints.ENV: "before_call=kill_once", failpoints.DIR_ENV: str(tmp_path)}
    first = _hit("before_call", 7, env)
    assert first.returncode == -signal.SIGKILL and "survived" not in first.stdout
    again = _hit("before_call", 7, env)
    assert again.returncode == 0 and "survived" in again.stdout
    other_task = _hit("before_call", 8, env)
    assert other_task.returncode == -signal.SIGKILL
    assert failpoints.hits("before_call", tmp_path) == 2
    always = _hit("before_call", 7, {failpoints.ENV: "before_call=kill"})
    assert always.returncode == -signal.SIGKILL
