"""Model-check the step / lease protocol (model/reckon.pml) with spin, exhaustively, and print what each run cost.

    python -m model.check                 every configuration of the real model, then every sabotage
    python -m model.check agents people   only those configurations
    python -m model.check --sabotage      only the sabotaged models (each must fail)

Each run: ``spin -a`` with the configuration's bounds (-D…), ``gcc`` the verifier (pan) — ``-DSAFETY`` for the
assertions and invalid end states, without it and with ``pan -a -f`` for the liveness formula under weak fairness —
then ``pan``; its report is parsed for "errors: N", the states stored, the depth, the memory and the seconds. No
bitstate or hash compaction: the search is exhaustive, each state stored whole (``-DCOLLAPSE`` would compress them
losslessly: at these bounds it saved at most 110 MB and took 1.3 to 1.8 times as long).
The model is split into configurations because all the faults and all the people at once are too many states for
CI's two minutes: each configuration states its bounds, and docs/verification.md lists them.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MODEL = Path(__file__).resolve().parent / "reckon.pml"
DEPTH_LIMIT = 200_000  # pan -m: far above any run's depth (a run that reaches it is reported as an error)

# Every property of the model, as pan names it when it is violated.
PROPERTIES: dict[str, tuple[str, ...]] = {
    "P1 one_authority": ("assertion violated (ep==authority)",),
    "P2 intent_first": ("assertion violated (op_st[k]!=0)",),
    "P3 one_effect": ("assertion violated (r_effects[k]<=1)",),
    "P4 no_intent_after_cancel": ("assertion violated !(cancel_req)",),
    "P5 reconcile_first": ("assertion violated  !(((((op_st[0]==2)||(op_st[0]==5))",),
    "P6 settles": ("acceptance cycle", "||(l_epoch>=6))"),
    "P7 not_done_stays_not_done": ("||(r_effects[k]==0))",),
    "deadlock": ("invalid end state",),
}


@dataclass(frozen=True)
class Config:
    name: str
    liveness: bool  # False: assertions + invalid end states (-DSAFETY); True: the LTL formula under weak fairness
    defines: tuple[str, ...]
    bounds: str


# The bounds not named here are the model's defaults: 2 agents, 2 nodes, at most 6 lease grants. The remote fences
# (a tombstone per op key) unless -DREMOTE_CANNOT_FENCE: a remote that cannot fence, where a not found is final only
# past the request's deadline.
CONFIGS: tuple[Config, ...] = (
    Config(
        "agents",
        False,
        ("-DCANCELS=0", "-DTAKEOVERS=0", "-DFORCES=0"),
        "1 crash, 1 lost answer, 1 rejection, 1 lease expiry; no people",
    ),
    Config(
        "cancel",
        False,
        ("-DTAKEOVERS=0", "-DFORCES=0", "-DMAX_REJECTS=0"),
        "a cancel at any moment, 1 crash, 1 lost answer, 1 lease expiry",
    ),
    Config(
        "cancel-deadline",
        False,
        ("-DREMOTE_CANNOT_FENCE", "-DTAKEOVERS=0", "-DFORCES=0", "-DMAX_EXPIRIES=0"),
        "a remote that cannot fence: a cancel at any moment, 1 crash, 1 lost answer, 1 rejection; no live lease"
        " expires (a crashed holder's does)",
    ),
    Config(
        "people",
        False,
        ("-DMAX_CRASHES=0", "-DMAX_LOSSES=0", "-DMAX_REJECTS=0"),
        "a cancel, a takeover (reserve, claim, reconcile, submit) and a forced release at any moment, 1 lease expiry",
    ),
    Config(
        "people-late",
        False,
        ("-DMAX_CRASHES=0", "-DMAX_REJECTS=0", "-DCANCELS=0", "-DFORCES=0"),
        "a takeover, 1 lost answer (its request may land late), 1 lease expiry",
    ),
    Config(
        "people-late-deadline",
        False,
        ("-DREMOTE_CANNOT_FENCE", "-DMAX_CRASHES=0", "-DMAX_REJECTS=0", "-DCANCELS=0", "-DFORCES=0"),
        "a remote that cannot fence: a takeover, 1 lost answer, 1 lease expiry",
    ),
    Config(
        "agents-live",
        True,
        ("-DCANCELS=0", "-DTAKEOVERS=0", "-DFORCES=0", "-DMAX_CRASHES=0"),
        "1 lost answer, 1 rejection, 1 lease expiry; no people (weak fairness)",
    ),
    Config(
        "people-live",
        True,
        ("-DMAX_CRASHES=0", "-DMAX_LOSSES=0", "-DMAX_REJECTS=0", "-DMAX_EXPIRIES=0"),
        "a cancel, a takeover and a forced release at any moment (weak fairness)",
    ),
    Config(
        "deadline-live",
        True,
        ("-DREMOTE_CANNOT_FENCE", "-DMAX_CRASHES=0", "-DMAX_REJECTS=0", "-DMAX_EXPIRIES=0", "-DFORCES=0"),
        "a remote that cannot fence: a cancel and a takeover at any moment, 1 lost answer (weak fairness)",
    ),
)


@dataclass(frozen=True)
class Sabotage:
    define: str
    config: str  # the configuration it is checked in
    violates: str  # the property (a key of PROPERTIES) spin must report


SABOTAGES: tuple[Sabotage, ...] = (
    Sabotage("-DSABOTAGE_NO_FENCING", "agents", "P1 one_authority"),
    Sabotage("-DSABOTAGE_INTENT_AFTER_CALL", "agents", "P2 intent_first"),
    Sabotage("-DSABOTAGE_NO_DEDUP", "agents", "P3 one_effect"),
    Sabotage("-DSABOTAGE_NO_RECONCILE", "agents", "P5 reconcile_first"),
    Sabotage("-DSABOTAGE_NO_RESUME", "people-live", "P6 settles"),
    Sabotage("-DSABOTAGE_IGNORE_FENCE", "cancel", "P7 not_done_stays_not_done"),
    Sabotage("-DSABOTAGE_NOT_FOUND_FINAL", "cancel-deadline", "P7 not_done_stays_not_done"),
    Sabotage("-DSABOTAGE_DEADLINE_AT_COMMIT", "cancel-deadline", "P7 not_done_stays_not_done"),
    Sabotage("-DSABOTAGE_WITHDRAW_SENT_INTENT", "cancel", "P7 not_done_stays_not_done"),
    Sabotage("-DSABOTAGE_REFUSAL_FINAL", "agents", "P7 not_done_stays_not_done"),
    Sabotage("-DSABOTAGE_IGNORE_FENCE", "people-late", "P7 not_done_stays_not_done"),
    Sabotage("-DSABOTAGE_NOT_FOUND_FINAL", "people-late-deadline", "P7 not_done_stays_not_done"),
)


@dataclass(frozen=True)
class Result:
    name: str
    errors: int
    states: int
    depth: int
    memory_mb: float
    seconds: float  # wall time of the whole run: spin, gcc and pan
    violation: str  # pan's first error line ("" when none)
    report: str  # pan's whole report

    def violated(self) -> str:
        """The property the run violated, by name ("" when none or not recognised)."""
        return next((name for name, texts in PROPERTIES.items() if any(t in self.violation for t in texts)), "")


class ModelCheckError(RuntimeError):
    """spin or gcc failed, or pan's report could not be read: the check itself did not run."""


def spin_available() -> bool:
    return shutil.which("spin") is not None and shutil.which("gcc") is not None


def check(config: Config, *extra: str, optimise: bool = False) -> Result:
    """Run ``config`` (with ``extra`` defines, e.g. a sabotage) in a scratch directory; return what pan said.
    ``optimise``: compile the verifier with -O2 — at these bounds compiling it takes longer than it saves (-O2: 7 s
    to compile, then a search about 1.5x as fast as -O0's, which takes 0.6 s to compile), so -O0 unless the
    bounds are raised."""
    started = time.monotonic()
    defines = [*config.defines, *extra]
    with tempfile.TemporaryDirectory(prefix="reckon-model-") as scratch:
        work = Path(scratch)
        shutil.copy(MODEL, work / MODEL.name)
        _run(["spin", "-a", *defines, MODEL.name], work)
        flags = ["-DNFAIR=4"] if config.liveness else ["-DSAFETY", "-DNOCLAIM"]
        _run(["gcc", "-O2" if optimise else "-O0", "-w", *flags, "-o", "pan", "pan.c"], work)
        args = ["./pan", f"-m{DEPTH_LIMIT}"] + (["-a", "-f"] if config.liveness else [])
        report = _run(args, work, check=False)
    name = config.name + "".join(f" {d.removeprefix('-D')}" for d in extra)
    return _parse(name, report, time.monotonic() - started)


def _run(args: list[str], cwd: Path, *, check: bool = True) -> str:
    # Fixed arguments: spin, gcc and the verifier spin generated, in a scratch directory.
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)  # noqa: S603
    if check and done.returncode != 0:
        output = done.stdout[-2000:] + done.stderr[-2000:]
        raise ModelCheckError(f"{' '.join(args)} failed ({done.returncode}): {output}")
    return done.stdout + done.stderr


def _number(pattern: str, report: str, name: str) -> str:
    found = re.search(pattern, report)
    if found is None:
        raise ModelCheckError(f"{name}: no {pattern!r} in pan's report:\n{report[-3000:]}")
    return found.group(1)


def _parse(name: str, report: str, seconds: float) -> Result:
    errors = int(_number(r"errors: (\d+)", report, name))
    if "max search depth too small" in report:
        errors = max(errors, 1)
    violation = next((line.strip() for line in report.splitlines() if line.startswith("pan:1:")), "")
    return Result(
        name=name,
        errors=errors,
        states=int(_number(r"(\d+) states, stored", report, name)),
        depth=int(_number(r"depth reached (\d+)", report, name)),
        memory_mb=float(_number(r"([\d.]+)\s+total actual memory usage", report, name)),
        seconds=seconds,
        violation=violation,
        report=report,
    )


def config_named(name: str) -> Config:
    for config in CONFIGS:
        if config.name == name:
            return config
    raise KeyError(f"no configuration {name!r}: {', '.join(c.name for c in CONFIGS)}")


def _line(result: Result, expect: str) -> str:
    verdict = result.violated() or result.violation or "-"
    return (
        f"{result.name:<48} {result.errors:>6} {result.states:>10} {result.depth:>6} {result.memory_mb:>8.1f}"
        f" {result.seconds:>7.1f}  {expect:<27} {verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", help="configurations to run (default: all)")
    parser.add_argument("--sabotage", action="store_true", help="run only the sabotaged models")
    parser.add_argument("--optimise", action="store_true", help="compile the verifier with -O2 (for larger bounds)")
    options = parser.parse_args(argv)
    if not spin_available():
        print("spin and gcc are needed: apt-get install -y spin gcc", file=sys.stderr)
        return 2
    print(f"{'run':<48} {'errors':>6} {'states':>10} {'depth':>6} {'MB':>8} {'seconds':>7}  {'expected':<27} found")
    failed = False
    if not options.sabotage:
        for config in [config_named(n) for n in options.configs] or CONFIGS:
            result = check(config, optimise=options.optimise)
            failed |= result.errors != 0
            print(_line(result, "0 errors"), flush=True)
    if options.sabotage or not options.configs:
        for sabotage in SABOTAGES:
            result = check(config_named(sabotage.config), sabotage.define)
            failed |= result.violated() != sabotage.violates
            print(_line(result, sabotage.violates), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
