"""A config as a small, versioned, human-readable JSON file (tuned or calibrated configs travel this way).

    save_config(cfg, "tuned.json", note="gates tuned on paper-scale-200x3, fold 0")
    cfg = load_config("tuned.json")            # decide(..., config="tuned.json") also works

The file holds every field of ``MDLConfig`` by name (numeric ones under "numeric": numbers as JSON
numbers, vectors as lists; structural ones under "static"), a format tag and a version. A hand-written
file may leave fields at the paper defaults only by listing them: ``"defaults": ["bias", "qr_seed"]``.
Loading refuses, with a ConfigFileError naming the file and the field: a path that is not a regular
file (a FIFO, a device such as a link to /dev/zero, a directory) or larger than ``MAX_BYTES`` (1 MiB);
bytes that are not UTF-8 JSON or nest deeper than a config does; another format or version; a missing,
unknown or misplaced field (under the wrong object or at the top level); a value of the wrong JSON kind
or length (``"sigma": [0.2]``, a ``bias`` that is neither a number nor D numbers); and, through
``MDLConfig``'s own checks, a broken invariant (finite numbers, σ > 0, 0 ≤ ε_c < min gains,
θ0 ≥ θ1 ≥ θ2 in [0, 1], n_max > n_min, ...). Every file ``save_config`` wrote loads unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np

from mdl_jax.controller.config import NUMERIC_FIELDS, STATIC_FIELDS, MDLConfig, config_shapes, field_specs
from mdl_jax.strict_json import DuplicateKeyError, unique_keys

FORMAT = "mdl-jax-config"
VERSION = 1


class ConfigFileError(ValueError):
    """A config file that cannot be read as a config of this version; the message names the file.

    A ``ValueError``, so ``except ValueError`` catches it with every other bad-input error.
    """


def _plain(v):
    a = np.asarray(v, dtype=np.float64)
    if a.ndim == 0:
        return float(a)
    return [float(x) for x in a.reshape(-1)]


def _json_scalar(v):
    # NumPy's ints and bools (MDLConfig(D=np.int64(16)) is a config) as the JSON kinds they stand for
    return bool(v) if isinstance(v, np.bool_) else int(v) if isinstance(v, np.integer) else v


def config_to_dict(cfg: MDLConfig) -> dict:
    """The config as plain JSON-able values: what ``save_config`` writes.

    Args:
      cfg: a single config (not a batch).

    Returns:
      {"format": FORMAT, "version": VERSION, "numeric": {field: float or list of floats},
        "static": {field: value}} (``dims`` as a list).

    Raises:
      TypeError: ``cfg`` is not an ``MDLConfig``.
      ValueError: ``cfg`` is a batch of configs (naming the first batched field), or has a D over
        ``MAX_D``: nothing is written that ``load_config`` would refuse.
    """
    if not isinstance(cfg, MDLConfig):
        raise TypeError(f"cfg: expected an MDLConfig, got {type(cfg).__name__}")
    numeric = {}
    for f in NUMERIC_FIELDS:
        a = np.asarray(getattr(cfg, f), dtype=np.float64)
        shapes = config_shapes(f, cfg.D)
        if a.ndim > max(len(shape) for shape in shapes):
            raise ValueError(f"{f}: expected a single config, got a batch (shape {a.shape})")
        if a.shape not in shapes:   # e.g. a (2,) bias: a batch of two scalar biases, which no file holds
            raise ValueError(f"{f}: expected a single config's shape, one of {list(shapes)} for D={cfg.D}, "
                             f"got shape {a.shape}")
        numeric[f] = _plain(a)
    if cfg.D > MAX_D:   # what load_config would refuse is not written
        raise ValueError(f"D: a config file holds D ≤ {MAX_D} (config_file.MAX_D), got {cfg.D}")
    static = {f: ([_json_scalar(x) for x in getattr(cfg, f)] if f in _TUPLE_STATIC else _json_scalar(getattr(cfg, f)))
              for f in STATIC_FIELDS}
    return {"format": FORMAT, "version": VERSION, "numeric": numeric, "static": static}


# What each field may hold in a file (one config, never a batch): the JSON kinds are checked here, before
# MDLConfig sees the values, so a list where a number belongs ("sigma": [0.2] would be a batch of one)
# or a vector of the wrong length is an error naming the field instead of a broadcasting error in decide.
_VECTOR_LEN = {f: s.shape[0] for f, s in field_specs().items() if s.leaf and len(s.shape) == 1}
# Static fields whose value is a tuple of ints (dims): a JSON list in the file, a tuple in the config.
_TUPLE_STATIC = {f.name: len(f.default) for f in dataclasses.fields(MDLConfig)
                 if f.name in STATIC_FIELDS and isinstance(f.default, tuple)}
_TOP = ("format", "version", "numeric", "static", "defaults", "note")
# A config file is a few hundred bytes; 1 MiB leaves room for any note and bounds what a path to a
# device (/dev/zero) or a huge file can make us read.
MAX_BYTES = 1 << 20
# Objects and lists nest 3 deep in a config ({"numeric": {"gains": [...]}}); deeper is not a config, and
# Python's json parser would recurse until RecursionError on a few thousand levels.
_MAX_DEPTH = 8
# The largest D a config file may set. The controller's cost grows as D² per record plus a D×D QR and
# (3, D, D) projectors per config, so a few hundred bytes could ask for gigabytes and minutes of work.
# 256 is sixteen times the paper's D = 16 (the kernels run D = 16 only). Over it: ConfigFileError
# naming static.D and the bound. (An MDLConfig built in Python is not bounded.)
MAX_D = 256
# The longest number a config file may write, in characters: any float64 written out exactly (at most
# ~770 significant digits) fits. Over it: ConfigFileError naming the bound (Python's int parser would
# stop at 4,300 digits with its own internal message, and long numbers cost quadratic time).
MAX_NUMBER_CHARS = 800


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numeric_value(f: str, v, D: int, source: str):
    """A numeric field's JSON value as MDLConfig takes it, or ConfigFileError naming the field."""
    if f in _VECTOR_LEN:
        n = _VECTOR_LEN[f]
        if not (isinstance(v, list) and len(v) == n and all(_is_number(x) for x in v)):
            raise ConfigFileError(f"{source}: numeric.{f}: expected a list of {n} numbers, got "
                                  f"{_short_json(v)}")
        return tuple(v)
    if field_specs()[f].or_d_vector:  # a number, or one per coordinate
        if _is_number(v):
            return v
        if isinstance(v, list) and len(v) == D and all(_is_number(x) for x in v):
            return tuple(v)
        raise ConfigFileError(f"{source}: numeric.{f}: expected a number or a list of D={D} numbers, "
                              f"got {_short_json(v)}")
    if not _is_number(v):
        raise ConfigFileError(f"{source}: numeric.{f}: expected a number, got {_short_json(v)}")
    return v


def _short_json(v) -> str:
    text = json.dumps(v)
    return text if len(text) <= 80 else text[:80] + " ..."


def config_from_dict(d: dict, source: str = "config") -> MDLConfig:
    """Inverse of ``config_to_dict``; errors (ConfigFileError) name ``source`` and the field.

    A file states every field of MDLConfig, numeric ones under "numeric" and static ones under
    "static", or lists the fields it leaves at the paper defaults in "defaults" (e.g.
    ``"defaults": ["bias"]``): a missing field that is not listed, a field listed and also stated, a
    field under the wrong object or at the top level, and any unknown key are errors.

    Args:
      d: the parsed JSON object of a config file.
      source: what to call it in error messages (the file's path).

    Returns:
      The ``MDLConfig`` it describes.

    Raises:
      ConfigFileError: (a ValueError) another format or version; a missing, unknown, misplaced or
        doubly stated field; a value of the wrong JSON kind or length; a broken invariant of
        ``MDLConfig`` (its message, prefixed by ``source``).
    """
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ConfigFileError(f"{source}: not an mdl-jax config (expected \"format\": \"{FORMAT}\")")
    if d.get("version") != VERSION or isinstance(d.get("version"), bool):
        raise ConfigFileError(f"{source}: version: expected {VERSION}, got {d.get('version')!r} "
                              "(written by another version of mdl-jax)")
    for k in d:
        if k in NUMERIC_FIELDS or k in STATIC_FIELDS:
            where = "numeric" if k in NUMERIC_FIELDS else "static"
            raise ConfigFileError(f"{source}: {k}: misplaced at the top level; it belongs under "
                                  f"\"{where}\"")
        if k not in _TOP:
            raise ConfigFileError(f"{source}: {k}: not a key of a config file (expected "
                                  f"{', '.join(_TOP)})")
    defaults = d.get("defaults", [])
    if not (isinstance(defaults, list) and all(isinstance(f, str) for f in defaults)):
        raise ConfigFileError(f"{source}: defaults: expected a list of field names, got "
                              f"{_short_json(defaults)}")
    for f in defaults:
        if f not in NUMERIC_FIELDS and f not in STATIC_FIELDS:
            raise ConfigFileError(f"{source}: defaults: {f}: not a field of MDLConfig")
    if "note" in d and not isinstance(d["note"], str):
        raise ConfigFileError(f"{source}: note: expected a string, got {_short_json(d['note'])}")
    objs = {}
    for part, own, other in (("numeric", NUMERIC_FIELDS, STATIC_FIELDS),
                             ("static", STATIC_FIELDS, NUMERIC_FIELDS)):
        obj = d.get(part, {} if all(f in defaults for f in own) else None)
        if not isinstance(obj, dict):
            raise ConfigFileError(f"{source}: {part}: expected an object of the {part} fields, got "
                                  f"{_short_json(obj)}")
        for f in obj:
            if f in other:
                raise ConfigFileError(f"{source}: {part}.{f}: misplaced; {f} belongs under "
                                      f"\"{'static' if part == 'numeric' else 'numeric'}\"")
            if f not in own:
                raise ConfigFileError(f"{source}: {part}.{f}: not a field of MDLConfig")
            if f in defaults:
                raise ConfigFileError(f"{source}: {part}.{f}: stated and also listed in \"defaults\"")
        objs[part] = obj
    for part, own in (("numeric", NUMERIC_FIELDS), ("static", STATIC_FIELDS)):
        for f in own:
            if f not in objs[part] and f not in defaults:
                raise ConfigFileError(f"{source}: {part}.{f}: missing (state it, or list it in "
                                      "\"defaults\" to take the paper's default)")
    kw = {}
    for f, v in objs["static"].items():
        if f in _TUPLE_STATIC:
            n = _TUPLE_STATIC[f]
            if not (isinstance(v, list) and len(v) == n and all(isinstance(x, int) and not isinstance(x, bool)
                                                                for x in v)):
                raise ConfigFileError(f"{source}: static.{f}: expected a list of {n} ints, got {_short_json(v)}")
            v = tuple(v)
        elif isinstance(v, (list, dict)) or v is None:
            raise ConfigFileError(f"{source}: static.{f}: expected a single value, got {_short_json(v)}")
        kw[f] = v
    D = kw.get("D", MDLConfig.D)
    if not (isinstance(D, int) and not isinstance(D, bool) and D > 0):
        raise ConfigFileError(f"{source}: static.D: expected a positive int, got {_short_json(D)}")
    if D > MAX_D:
        raise ConfigFileError(f"{source}: static.D: {D} is over the largest D a config file may set, "
                              f"{MAX_D} (config_file.MAX_D; the paper's is 16)")
    for f, v in objs["numeric"].items():
        kw[f] = _numeric_value(f, v, D, source)
    try:
        return MDLConfig(**kw)
    except (ValueError, TypeError) as e:
        raise ConfigFileError(f"{source}: {e}") from None


def _dumps(d: dict) -> str:
    # Indented objects, but each vector on one line ("gains": [1.0, 0.7, 0.5]): easy to read and diff.
    text = json.dumps(d, indent=2)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]", text)


def save_config(cfg: MDLConfig, path: str | os.PathLike, *, note: str | None = None) -> Path:
    """Write ``cfg`` to ``path`` as JSON, whole or not at all (``mdl_jax._io``: a fresh temporary
    name, fsync, a rename; a symbolic link planted at any name is never written through).

    Examples:
      >>> save_config(cfg, "tuned.json", note="gates tuned on paper-scale-200x3, fold 0")   # doctest: +SKIP
      >>> decide(0.8, 0.7, 0.2, config="tuned.json")                                     # doctest: +SKIP

    Args:
      cfg: a single config (not a batch).
      path: the file to write; missing parent folders are created.
      note: an optional free-text note stored in the file (under "note").

    Returns:
      The path written, as a ``Path``.

    Raises:
      TypeError: ``cfg`` is not an ``MDLConfig``; ``note`` is not a string; ``path`` is not a path.
      ValueError: ``cfg`` is a batch of configs, or anything ``load_config`` would refuse in the
        file (a D over ``MAX_D``, a note past ``MAX_BYTES``, a number past ``MAX_NUMBER_CHARS``):
        nothing is written.
      OutputError: (an ``OSError``) the file or its folder cannot be written (a full disk, a
        read-only mount), or ``path`` is a folder (``""`` and ``"."`` too); the message names ``path``, and a file already there is untouched.
    """
    import errno

    from mdl_jax._fs import OutputError
    from mdl_jax._io import write_text

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a file path, got {type(path).__name__}")
    if Path(path).is_dir():   # "" and "." too: the rename onto a folder failed with EBUSY, unnamed
        raise OutputError(path, OSError(errno.EISDIR, os.strerror(errno.EISDIR)),
                          message=f"cannot write {os.fspath(path)!r}: a folder; expected a file name")
    d = config_to_dict(cfg)
    if note is not None and not isinstance(note, str):
        raise TypeError(f"note: expected a string or None, got {type(note).__name__}")
    if note:
        d["note"] = note
    text = _dumps(d) + "\n"
    data = text.encode("utf-8")
    # The file is read back here before it is written: what load_config would refuse (a note past
    # MAX_BYTES, a static number past MAX_NUMBER_CHARS, ...) is an error now, not a file that fails later.
    try:
        if len(data) > MAX_BYTES:
            raise ConfigFileError(f"{len(data)} bytes; a config file is at most {MAX_BYTES} bytes")
        config_from_bytes(data, source="the file to write")
    except ConfigFileError as e:
        raise ValueError(f"save_config: not written, load_config would refuse it: {e}") from None
    return write_text(Path(path), text)


def read_config_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of the config file at ``path``: a regular file (after following links) of at most
    ``MAX_BYTES``, else ConfigFileError naming the file.

    Opened non-blocking, so a FIFO cannot block; the checks run on the opened descriptor, so the
    file cannot be swapped between check and read. A link to /dev/zero, a FIFO, a socket or a
    directory is refused, and at most MAX_BYTES + 1 bytes are ever read.

    Args:
      path: the config file.

    Returns:
      Its bytes (at most ``MAX_BYTES``).

    Raises:
      ConfigFileError: (a ValueError) the file cannot be opened or read, is not a regular file, or
        is larger than ``MAX_BYTES``.
    """
    from mdl_jax._fs import SmallFileError, file_kind, read_small

    path = os.fspath(path)
    try:
        return read_small(path, MAX_BYTES)
    except SmallFileError as e:
        if e.kind == "unreadable":
            raise ConfigFileError(f"{path}: cannot read ({e.reason})") from None
        if e.kind == "not regular":
            raise ConfigFileError(f"{path}: not a regular file ({file_kind(e.mode)}); expected a JSON "
                                  "config file") from None
        if e.size is not None:
            raise ConfigFileError(f"{path}: {e.size} bytes; a config file is at most {MAX_BYTES} bytes") from None
        raise ConfigFileError(f"{path}: more than {MAX_BYTES} bytes; a config file is at most {MAX_BYTES} "
                              "bytes") from None


def _depth_path(text: str, limit: int) -> str | None:
    """Where ``text`` nests objects/lists deeper than ``limit`` (a dotted key path), else None.

    A linear scan that skips string contents; only run before parsing, so json never recurses deep.
    """
    keys: list = [None]
    depth, i, n = 0, 0, len(text)
    last_string = None
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            last_string = text[i + 1:j]
            i = j + 1
            continue
        if c == ":":
            keys[-1] = last_string
        elif c in "{[":
            depth += 1
            if depth > limit:
                return ".".join(k for k in keys if k is not None) or "(top level)"
            keys.append(None)
        elif c in "}]":
            depth -= 1
            keys.pop() if len(keys) > 1 else None
        i += 1
    return None


def config_from_bytes(data: bytes, source: str = "config") -> MDLConfig:
    """Parse a config file's bytes (UTF-8 JSON); ConfigFileError naming ``source`` and the field.

    Args:
      data: the file's bytes (``read_config_bytes``).
      source: what to call them in error messages (the file's path).

    Returns:
      The ``MDLConfig`` they describe.

    Raises:
      ConfigFileError: (a ValueError) bytes that are not UTF-8, not JSON, or nest deeper than a
        config does; and everything ``config_from_dict`` refuses.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigFileError(f"{source}: not UTF-8 text ({e})") from None
    where = _depth_path(text, _MAX_DEPTH)
    if where is not None:
        raise ConfigFileError(f"{source}: {where}: nested deeper than {_MAX_DEPTH} levels; not a config")
    def number(kind):
        def parse(literal: str):
            if len(literal) > MAX_NUMBER_CHARS:
                raise ConfigFileError(f"{source}: a number of {len(literal):,} characters "
                                      f"({literal[:20]}...); a config file's numbers have at most "
                                      f"{MAX_NUMBER_CHARS} (config_file.MAX_NUMBER_CHARS)")
            return kind(literal)
        return parse

    try:
        d = json.loads(text, object_pairs_hook=unique_keys, parse_int=number(int), parse_float=number(float))
    except DuplicateKeyError as e:
        raise ConfigFileError(f"{source}: {e}") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise ConfigFileError(f"{source}: not valid JSON ({e})") from None
    return config_from_dict(d, source)


def load_config(path: str | os.PathLike) -> MDLConfig:
    """Read a config written by ``save_config`` (or by hand, in the same format).

    Examples:
      >>> cfg = load_config("tuned.json")       # doctest: +SKIP

    Args:
      path: the config file.

    Returns:
      The ``MDLConfig`` it holds.

    Raises:
      ConfigFileError: (a ValueError, naming the file and the field) a path that is not a regular
        file or is larger than ``MAX_BYTES``; bytes that are not UTF-8 JSON or nest too deep;
        another format or version; a missing, unknown or misplaced field; a value of the wrong
        JSON kind or length; a broken ``MDLConfig`` invariant.
      TypeError: ``path`` is not a path (a str, bytes or ``os.PathLike``).
    """
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path: expected a config file path, got {type(path).__name__}")
    return config_from_bytes(read_config_bytes(path), os.fspath(path))
