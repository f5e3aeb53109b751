"""Strict JSON (RFC 8259) for text the library reads from outside: one parser for ``mdl-jax gate``'s rows
and risk tables and for the servers' request and upstream bodies.

Python's ``json`` reads NaN, Infinity and -Infinity, reads a number past a double's range as infinity,
and recurses as deep as the text nests; none of that can be written back as JSON, and deep nesting
runs every later walk over the value into the recursion limit. ``loads`` refuses all three, with
one wording wherever the library reads JSON. Lone surrogates (which ``\\ud800`` escapes decode to)
are left to the callers: each names the field in its own terms (a row's field, a request's
parameter). A key stated twice in one object is refused by the readers of files (``unique_keys``,
``loads_unique``: config files, data files), each naming the file.
"""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn


class StrictJSONError(ValueError):
    """Text that is JSON to Python's ``json`` but not strict JSON: the reason, and where when known.

    Args:
      message: what is wrong, one line.
      param: where in the value (a request's parameter path), or None.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def refuse_constant(name: str) -> NoReturn:
    """``json.loads``'s ``parse_constant``: NaN, Infinity and -Infinity are not JSON.

    Args:
      name: the constant as written.

    Raises:
      StrictJSONError: always, naming it.
    """
    raise StrictJSONError(f"{name} is not JSON (strict JSON has no NaN or Infinity)")


def finite_float(text: str) -> float:
    """``json.loads``'s ``parse_float``: a number, finite as a double.

    Args:
      text: the number as written.

    Returns:
      Its value.

    Raises:
      StrictJSONError: the number is past a double's range (it would read as infinity).
    """
    x = float(text)
    if not math.isfinite(x):
        raise StrictJSONError(f"the number {text[:40]} is past a double's range")
    return x


class DuplicateKeyError(ValueError):
    """A key stated twice in one JSON object, which Python's ``json`` would read as its last value,
    silently.

    Args:
      key: the key.
    """

    def __init__(self, key: str):
        # as written where that reads plainly; quoted where it would not (empty, blank-edged, a newline
        # or other control character), and cut where it is long: the message stays one short line
        shown = key if key and key.isprintable() and key.strip() == key and len(key) <= 100 else repr(key[:100])
        super().__init__(f"{shown}{'…' if len(key) > 100 else ''}: stated twice in one object (JSON would "
                         "keep the last silently); state each key once")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, each of its keys stated once.

    Args:
      pairs: the object's (key, value) pairs as written.

    Returns:
      Them as a dict.

    Raises:
      DuplicateKeyError: a key stated twice, naming the first such key.
    """
    d = dict(pairs)
    if len(d) != len(pairs):  # a repeat is rare: the key-by-key search runs only to name it
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise DuplicateKeyError(k)
            seen.add(k)
    return d


# made once: json.loads given a hook builds a new decoder on every call, which costs as much again as the
# parse of a data file's short line
_UNIQUE_KEYS = json.JSONDecoder(object_pairs_hook=unique_keys)


def loads_unique(text: str) -> Any:
    """``text`` as JSON (Python's ``json``, as ``json.loads`` reads it), each object's keys stated once.

    Args:
      text: the JSON text.

    Returns:
      Its value.

    Raises:
      DuplicateKeyError: a key stated twice in one object, naming it.
      json.JSONDecodeError: not JSON (a byte-order mark named as ``json.loads`` names it).
    """
    if isinstance(text, str) and text.startswith("\ufeff"):  # json.loads checks this; its decoder does not
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _UNIQUE_KEYS.decode(text)


def depth_message(max_depth: int, name: str | None = None) -> str:
    """What a value nested past ``max_depth`` is told, naming the bound's constant if ``name`` is given."""
    bound = f"{name} = {max_depth}" if name else f"{max_depth}"
    return f"nested deeper than {bound} levels"


def nested_deeper(value: Any, text: bytes | str, max_depth: int) -> bool:
    """Whether ``value`` (parsed from ``text``) nests more than ``max_depth`` objects and lists.

    The walk, without recursion, runs only where ``text`` has that many opening brackets (strings'
    own included), which most texts do not.

    Args:
      value: a parsed JSON value.
      text: the text it was parsed from (str or UTF-8 bytes).
      max_depth: the levels allowed; the outermost object or list is level 1.

    Returns:
      True if some object or list sits deeper than ``max_depth``.
    """
    n = text.count(b"[") + text.count(b"{") if isinstance(text, bytes) else text.count("[") + text.count("{")
    if n <= max_depth:
        return False
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > max_depth:
            return True
        items = v.values() if isinstance(v, dict) else v
        stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return False


def loads(text: str, *, max_depth: int, depth_name: str | None = None) -> Any:
    """``text`` as strict JSON: no NaN or Infinity, every number finite as a double, nesting at most
    ``max_depth`` levels.

    Args:
      text: the JSON text.
      max_depth: the levels of objects and lists allowed (the outermost is level 1).
      depth_name: the name of the bound's constant, for the message (e.g. ``"MAX_JSON_DEPTH"``).

    Returns:
      Its value.

    Raises:
      StrictJSONError: NaN or Infinity, a number past a double's range, or nesting past ``max_depth``;
        the message says which.
      ValueError: not JSON at all (``json.JSONDecodeError``, with ``json``'s message), or an integer
        past Python's digit limit.
    """
    try:
        value = json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)
    except RecursionError:  # deeper than the parser's stack: past the bound by far
        raise StrictJSONError(depth_message(max_depth, depth_name)) from None
    if nested_deeper(value, text, max_depth):
        raise StrictJSONError(depth_message(max_depth, depth_name))
    return value
