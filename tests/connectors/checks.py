"""Small checks the connectors' tests share."""

import threading
import time
from collections.abc import Callable
from typing import Any

from reckon_client import Committed, Failed, Outcome
from reckon_client.outcomes import FailureClass


def committed(outcome: Outcome) -> Committed:
    assert isinstance(outcome, Committed), outcome
    return outcome


def failed(outcome: Outcome, failure_class: FailureClass) -> Failed:
    assert isinstance(outcome, Failed) and outcome.failure_class == failure_class, outcome
    return outcome


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.002)


def in_thread(work: Callable[[], Outcome]) -> tuple[threading.Thread, list[Outcome]]:
    """Run ``work`` in a thread of its own; its outcome lands in the list once it returns."""
    answers: list[Outcome] = []
    thread = threading.Thread(target=lambda: answers.append(work()), daemon=True)
    thread.start()
    return thread, answers


def race(*works: Callable[[], Outcome], delays: tuple[float, ...] = ()) -> list[Outcome]:
    """Run ``works`` in threads released together (each then waits its delay, none by default); their outcomes."""
    start = threading.Barrier(len(works))

    def released(work: Callable[[], Outcome], delay: float) -> Callable[[], Outcome]:
        def run() -> Outcome:
            start.wait()
            time.sleep(delay)
            return work()

        return run

    runs = [in_thread(released(work, delay)) for work, delay in zip(works, delays or (0.0,) * len(works), strict=True)]
    for thread, _ in runs:
        thread.join(30)
    return [answers[0] for _, answers in runs]


def submit_against_fence(
    writer: Any, fencer: Any, key: str, request: dict[str, Any], delays: tuple[float, ...] = ()
) -> tuple[Outcome, Outcome]:
    """A submit and a fence of one op key through two connectors, released together: (submitted, fenced)."""
    submitted, fenced = race(lambda: writer.submit(key, request), lambda: fencer.fence(key), delays=delays)
    return submitted, fenced
