"""Input from outside — a header, a path or query parameter, a form field, a JSON body — read here once, for the API
and the console alike, so that no input reaches a column, ``int()`` or a recursion it cannot survive.

- A number is ASCII digits only and fits the column it is for: ``str.isdigit`` is true for ``"²"`` and ``"¹²"``
  (and ``int()`` then raises, or takes ``"١٢"`` for 12), so it is never the test. A header's key is printable ASCII
  only.
- JSON is strict: ``NaN``, ``Infinity`` and ``-Infinity`` are refused (no database stores them as JSON), so is a lone
  surrogate in a key or a string (no database can encode it), and the nesting depth is measured on the text before
  any parse or walk recurses into it.

A refusal is ``UnreadableInput`` (a ValueError): the caller answers it as its own named 4xx, never a 5xx.
"""

import json
import re
from collections.abc import Iterator
from typing import Any

# The largest value of a signed 64-bit column (PostgreSQL bigint, SQLite's INTEGER): the most an id or version may be.
MAX_BIGINT = 2**63 - 1
# How deep a JSON document may nest: far beyond any plan, receipt or form this project reads, far below the recursion
# limit of the parser and of every walk over the parsed value.
MAX_JSON_DEPTH = 64

_DIGITS = re.compile(r"[0-9]{1,19}")
_SURROGATE = re.compile("[\ud800-\udfff]")


class UnreadableInput(ValueError):
    """The input is not what the field takes; the message says what it takes."""


def ascii_int(text: str | None, *, maximum: int = MAX_BIGINT) -> int | None:
    """``text`` as a non-negative integer, if it is 1 to 19 ASCII digits no larger than ``maximum``; else None."""
    if text is None or not _DIGITS.fullmatch(text):
        return None
    value = int(text)
    return value if value <= maximum else None


def ascii_token(text: str | None, *, max_length: int) -> str | None:
    """``text`` if it is 1 to ``max_length`` printable ASCII characters (a key or an id a header carries), else None.
    A WSGI server hands a header on decoded as Latin-1, so a byte past ASCII arrives as a printable letter ("²",
    "ÿ"): ``str.isprintable`` alone would take it."""
    if text is None or not 1 <= len(text) <= max_length or not text.isascii() or not text.isprintable():
        return None
    return text


def json_depth(text: str | bytes) -> int:
    """How deep the arrays and objects of the JSON ``text`` nest, counted on the text itself (brackets inside strings
    are not counted): no recursion, whatever the input."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise UnreadableInput(f"{name} is not a JSON number: send a finite number, or a string")


def strict_json(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON document ``text``, refused (UnreadableInput) when it is not strict JSON: malformed, not UTF-8,
    nested deeper than ``max_depth``, holding NaN or an infinity, or a lone surrogate in a key or a string."""
    if json_depth(text) > max_depth:
        raise UnreadableInput(f"the JSON nests deeper than {max_depth} levels")
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except UnreadableInput:
        raise
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise UnreadableInput(f"not JSON: {error}") from error
    if (found := lone_surrogate(document)) is not None:
        raise UnreadableInput(f"a lone surrogate (\\u{ord(found):04x}) cannot be stored: send valid Unicode")
    return document


def strings_of(value: Any) -> Iterator[str]:
    """Every key and string of ``value`` (parsed JSON), walked without recursion."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in any key or string of ``value`` (parsed JSON)."""
    for text in strings_of(value):
        if found := _SURROGATE.search(text):
            return found.group()
    return None


def holds(value: Any, needle: str) -> bool:
    """Whether any key or string of ``value`` (parsed JSON) contains ``needle``."""
    return any(needle in text for text in strings_of(value))


class IdConverter:
    """A URL's id (Django's path converter ``<id:…>``): ASCII digits that fit a 64-bit column. A longer one matches
    no route (404), where ``<int:…>`` would hand the database a number it cannot bind (a 500 on SQLite)."""

    regex = "[0-9]{1,19}"

    def to_python(self, value: str) -> int:
        number = ascii_int(value)
        if number is None:
            raise ValueError(f"{value} is past a 64-bit id")  # Django: no match
        return number

    def to_url(self, value: int) -> str:
        return str(value)


def id_past_columns(path: str) -> str | None:
    """The first segment of ``path`` that is all ASCII digits (a minus sign before them or not) but past any id a
    column can hold, or None."""
    for segment in path.split("/"):
        digits = segment.removeprefix("-")
        if digits.isascii() and digits.isdigit() and ascii_int(digits) is None:
            return segment
    return None
