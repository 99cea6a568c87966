"""Wait until a URL answers (any HTTP status), for scripts: ``python -m harness.wait_for URL --seconds 30``.
Exits 0 once it answers, 1 when the time is up."""

import argparse
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
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.seconds
    while not answers(args.url):
        if time.monotonic() > deadline:
            print(f"{args.url} did not answer within {args.seconds:g}s", file=sys.stderr)
            return 1
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
