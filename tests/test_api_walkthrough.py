"""docs/api.md's bash walkthrough is run as written: the script between its ``walkthrough`` markers, with bash, curl
and jq, against Reckon as its own process (gunicorn on the test database: tests/test_agent_e2e.py's, one per session)
and the object store as its own (harness/simulator.py), to a completed task — so the page an agent author copies
from is what CI runs. The store's own count says each node's write happened once."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from api.tokens import api_token_issue
from tasks.core.lifecycle import TaskStatus
from tasks.models import Task
from tests.conftest import person
from tests.simulator_fixture import ROOT, Simulator
from tests.test_agent_e2e import server  # noqa: F401 - the web process fixture, shared

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        shutil.which("jq") is None and not os.environ.get("CI"), reason="needs jq (.ci/run installs it)"
    ),
]

KIND = "migrate_project_api"
BASH = shutil.which("bash") or "/bin/bash"


def walkthrough() -> str:
    """The script of docs/api.md, between its markers, without the code fence."""
    page = (ROOT / "docs" / "api.md").read_text()
    block = page.split("<!-- walkthrough:begin -->", 1)[1].split("<!-- walkthrough:end -->", 1)[0]
    match = re.fullmatch(r"\s*```bash\n(.*)```\s*", block, re.DOTALL)
    assert match, "docs/api.md's walkthrough is one ```bash block between its markers"
    return match.group(1)


def test_the_docs_curl_walkthrough_drives_a_task_to_completion(server: tuple[str, Path, int], tmp_path: Path) -> None:  # noqa: F811
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="walker", kinds=[KIND], projects=[])
    store = Simulator(tmp_path / "store.json").start()
    try:
        env = os.environ | {"RECKON": server[0], "TOKEN": token, "KIND": KIND, "STORE": store.url}
        run = subprocess.run(  # noqa: S603
            [BASH, "-c", walkthrough()], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{server[1].read_text()[-2000:]}"
        stats = store.stats()
    finally:
        store.stop()
    [task] = Task.objects.filter(kind=KIND)
    assert task.status == TaskStatus.COMPLETED, run.stdout
    assert run.stdout.rstrip().endswith(f"task {task.pk}: completed"), run.stdout
    assert "store.copy_batch: target, source, batch, limit" in run.stdout  # step 1 read the actions' inputs
    # One write per node, each under its own op key: the store's count, not Reckon's opinion of it.
    assert stats["side_effects"] == 2 and sorted(stats["by_action"]) == ["delete_objects", "prepare_target"], stats
    assert sorted(stats["by_op_key"].values()) == [1, 1], stats
