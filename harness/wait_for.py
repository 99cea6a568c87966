"""Wait until a URL answers (any HTTP status), for scripts: ``python -m harness.wait_for URL --seconds 30 --pid N``.
Exits 0 once it answers, 1 when the time is up or process N (the server that should answer) has ended."""

import argparse
import os
import sys
import time
import urllib.error
import urllib.request


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - a local URL given by the caller
            return True
    except urllib.error.HTTPError:
        return True  # it answered, with an error status
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--pid", type=int, default=0, help="give up as soon as this process has ended")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.seconds
    while not answers(args.url):
        if time.monotonic() > deadline:
            print(f"{args.url} did not answer within {args.seconds:g}s", file=sys.stderr)
            return 1
        if args.pid and not alive(args.pid):
            print(f"{args.url} will not answer: its process {args.pid} has ended", file=sys.stderr)
            return 1
        time.sleep(0.2)
    return 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child that ended but was not reaped yet is a zombie: ended all the same.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


if __name__ == "__main__":
    sys.exit(main())
