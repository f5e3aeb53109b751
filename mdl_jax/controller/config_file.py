"""A config as a small, versioned, human-readable JSON file (tuned or calibrated configs travel this way).

    save_config(cfg, "tuned.json", note="gates tuned on paper-scale-200x3, fold 0")
    cfg = load_config("tuned.json")            # decide(..., config="tuned.json") also works

The file holds every field of ``MDLConfig`` by name (numbers as JSON numbers, vectors as lists), a
format tag and a version. Loading checks the tag and the version first, then builds the config, whose
own checks (finite numbers, σ > 0, 0 ≤ ε_c < min gains, θ0 ≥ θ1 ≥ θ2 in [0, 1], n_max > n_min, ...)
reject a broken invariant with a ValueError naming the field; every error also names the file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from mdl_jax.controller.config import MDLConfig, NUMERIC_FIELDS, STATIC_FIELDS

FORMAT = "mdl-jax-config"
VERSION = 1


class ConfigFileError(ValueError):
    """A config file that cannot be read as a config of this version; the message names the file."""


def _plain(v):
    a = np.asarray(v, dtype=np.float64)
    if a.ndim == 0:
        return float(a)
    return [float(x) for x in a.reshape(-1)]


def config_to_dict(cfg: MDLConfig) -> dict:
    """The config as plain JSON-able values (a single config, not a batch)."""
    if not isinstance(cfg, MDLConfig):
        raise TypeError(f"cfg: expected an MDLConfig, got {type(cfg).__name__}")
    numeric = {}
    for f in NUMERIC_FIELDS:
        a = np.asarray(getattr(cfg, f), dtype=np.float64)
        if a.ndim > (1 if f in ("gains", "g_A_coeffs", "gate_coeffs", "thresholds", "bias") else 0):
            raise ValueError(f"{f}: expected a single config, got a batch (shape {a.shape})")
        numeric[f] = _plain(a)
    static = {f: (list(getattr(cfg, f)) if f == "dims" else getattr(cfg, f)) for f in STATIC_FIELDS}
    return {"format": FORMAT, "version": VERSION, "numeric": numeric, "static": static}


def config_from_dict(d: dict, source: str = "config") -> MDLConfig:
    """Inverse of ``config_to_dict``; errors name ``source`` and the field."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ConfigFileError(f"{source}: not an mdl-jax config (expected \"format\": \"{FORMAT}\")")
    if d.get("version") != VERSION:
        raise ConfigFileError(f"{source}: version: expected {VERSION}, got {d.get('version')!r} "
                              "(written by another version of mdl-jax)")
    numeric, static = d.get("numeric"), d.get("static", {})
    if not isinstance(numeric, dict) or not isinstance(static, dict):
        raise ConfigFileError(f"{source}: expected objects \"numeric\" and \"static\"")
    unknown = sorted(set(numeric) - set(NUMERIC_FIELDS)) + sorted(set(static) - set(STATIC_FIELDS))
    if unknown:
        raise ConfigFileError(f"{source}: {unknown[0]}: not a field of MDLConfig")
    kw = {}
    for f, v in numeric.items():
        kw[f] = tuple(v) if isinstance(v, list) else v
    for f, v in static.items():
        kw[f] = tuple(v) if f == "dims" and isinstance(v, list) else v
    try:
        return MDLConfig(**kw)
    except (ValueError, TypeError) as e:
        raise ConfigFileError(f"{source}: {e}") from None


def _dumps(d: dict) -> str:
    # Indented objects, but each vector on one line ("gains": [1.0, 0.7, 0.5]): easy to read and diff.
    text = json.dumps(d, indent=2)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]", text)


def save_config(cfg: MDLConfig, path, *, note: str | None = None) -> Path:
    """Write ``cfg`` to ``path`` as JSON (atomically: a temp file, then a rename)."""
    d = config_to_dict(cfg)
    if note:
        d["note"] = note
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(_dumps(d) + "\n")
    os.replace(tmp, path)
    return path


def load_config(path) -> MDLConfig:
    """Read a config written by ``save_config``; ConfigFileError naming the file and the field."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except OSError as e:
        raise ConfigFileError(f"{path}: cannot read ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"{path}: not valid JSON ({e})") from None
    return config_from_dict(d, str(path))
