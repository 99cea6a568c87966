"""The TypeScript client (client-ts/) end to end: its tests, compiled with tsc and run by node's own runner
(``node --test``), drive tasks over HTTP against Reckon as its own process (gunicorn on the test database:
tests/test_agent_e2e.py's, one per session) and the object store as its own (harness/simulator.py), whose count of
side effects per op key is the judge of "exactly once".

The node tests are client-ts/test/*.test.ts: a small migration, an agent process SIGKILLed with a write in the
store's hands and started again, a cancel, a stale version (412) and an out-of-order renewal (409), retryable
failures backed off, retained objects. They run side by side (each file a process, each test its own project, and
its own node keys for the store's faults). Needs node and npm: skipped without them on a developer's machine, a
failure in CI (``CI`` set). ``npm ci`` installs the two dev dependencies (typescript, @types/node) from the
committed lock file; the client itself has none.
"""

import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.simulator_fixture import ROOT, Simulator
from tests.test_agent_e2e import Live, live, server  # noqa: F401 - the web process and its token, shared

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT = ROOT / "client-ts"
NODE_TIMEOUT = 120  # seconds: the node tests take about 10 together (side by side)


def _run(command: list[str], what: str, timeout: float) -> None:
    done = subprocess.run(command, cwd=CLIENT, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


@pytest.fixture(scope="module")
def node() -> str:
    """The compiled client and its tests (client-ts/dist/), made once for the module; the path of node."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm must be installed in CI: the TypeScript client must be tested")
        pytest.skip("node is not installed: the TypeScript client (client-ts/) is not tested here")
    _run([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], "npm ci", timeout=180)
    shutil.rmtree(CLIENT / "dist", ignore_errors=True)  # no compiled test of a file since removed
    _run([node, "node_modules/typescript/bin/tsc", "-p", "."], "tsc", timeout=120)
    return node


def test_the_typescript_client_drives_tasks_against_a_live_server(
    node: str,
    live: Live,  # noqa: F811
    store: Simulator,
) -> None:
    tests = sorted(str(p.relative_to(CLIENT)) for p in (CLIENT / "dist" / "test").glob("*.test.js"))
    assert tests, "no compiled node test in client-ts/dist/test"
    env = os.environ | {"RECKON_URL": live.url, "RECKON_TOKEN": live.token, "RECKON_STORE_URL": store.url}
    command = [node, "--test", f"--test-concurrency={len(tests)}", "--test-reporter=spec", *tests]
    started = time.monotonic()
    # Its own process group: on a timeout, node, its test files' processes and the agents they started all end.
    process = subprocess.Popen(  # noqa: S603
        command,
        cwd=CLIENT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=NODE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(f"the node tests did not finish in {NODE_TIMEOUT}s:\n{output}") from None
    print(f"\n[node --test] {len(tests)} files in {time.monotonic() - started:.1f}s\n{output[-3000:]}")
    web_log = live.log.read_text()[-3000:] if live.log.exists() else ""
    assert process.returncode == 0, f"node --test failed ({process.returncode}):\n{output}\n[web log]\n{web_log}"
