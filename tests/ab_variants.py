"""Variants for tests/test_bench.py's A/B test: a baseline and one that records when it is on."""

CALLS: list[str] = []


def _on() -> None:
    CALLS.append("on")


def _off() -> None:
    CALLS.append("off")


def _nothing() -> None:
    CALLS.append("baseline")


VARIANTS = {"baseline": (_nothing, lambda: None), "recorded": (_on, _off)}
