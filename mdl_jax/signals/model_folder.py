"""What a local sentence-transformers folder declares, read from its files without loading it.

Its own module because three pieces ask the same questions of the folder and must get the same
answers: the exporter (``onnx_export``: is its whole pipeline one the ONNX graph reproduces, and what
is the folder's content hash the graph is kept under), the encoder (``onnx_encoder``: its pooling, and
where its texts are truncated) and the embedder's "auto" backend (``embeddings``: may it run without
torch). Only JSON configs and file bytes are read: no torch, no transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

_MODEL_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model")


def model_files(path: Path) -> list[Path]:
    """The files of a model folder that define its graph and tokenizer, in sorted order: the top
    level's (``.json``, ``.safetensors``, ``.bin``, ``.txt``, ``.model``) and those of the module
    folders its ``modules.json`` names (``1_Pooling``, ...), links followed. Other folders (a trainer's
    ``checkpoint-*``) are not the model's.

    Args:
        path: a local model folder.

    Returns:
        The files' paths under ``path`` (empty when ``path`` is not a folder).

    Raises:
        OSError: the folder or a file cannot be listed or read.
    """
    if not path.is_dir():
        return []
    folders = [path]
    modules = path / "modules.json"
    if modules.is_file():
        try:
            listed = json.loads(modules.read_text(encoding="utf-8"))
            folders += [path / m["path"] for m in listed if isinstance(m, dict) and m.get("path")]
        except (ValueError, TypeError):
            pass   # not the modules' list: sentence-transformers will say so when it loads
    files = {f for d in folders if d.is_dir() for f in d.iterdir()
             if f.suffix in _MODEL_SUFFIXES and f.is_file()}
    return sorted(files)


def folder_hash(path: Path) -> str:
    """The content hash of a model folder, which its exported graphs and its embedding cache id are
    kept under (``<cache_dir>/onnx/<name>-<hash>/``): a changed weight or tokenizer file gets a new one.

    Args:
        path: a local model folder.

    Returns:
        The first 16 hex digits of the sha256 over the names and bytes of ``model_files``, each
        prefixed by its length.

    Raises:
        OSError: a file cannot be read.
    """
    h = hashlib.sha256()
    for p in model_files(path):
        # each name and each file's bytes prefixed by its length: without, a file whose bytes end in
        # the next file's name and bytes would hash like the two of them
        name = str(p.relative_to(path)).encode()
        h.update(len(name).to_bytes(8, "little") + name)
        with open(p, "rb") as f:
            h.update(os.fstat(f.fileno()).st_size.to_bytes(8, "little"))
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


_MODULES_REPRODUCED = ("Transformer", "Pooling", "Normalize")  # what ``OnnxEncoder.encode`` does in NumPy
_POOLING_FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}  # < 6's names


def model_pooling(path: Path) -> str:
    """The model's pooling mode ("mean" or "cls"), after checking that the ONNX path (``onnx_encoder``)
    reproduces the model's whole sentence-transformers pipeline; else a ValueError that says what it
    does not reproduce.

    Reproduced: a Transformer, one Pooling of mean or CLS (the flags of sentence-transformers < 6 or
    its ``pooling_mode`` of 6+), an optional Normalize (``OnnxEncoder.encode`` normalises anyway). Not: any other
    module (Dense, a second pooling, ...), more than one pooling mode at once, a default prompt, or a
    lower-casing the tokenizer does not do itself. Without this check such a model's vectors would come
    out silently different from torch's (a probe found a Dense 384→128 model embedded at 384 dims).
    """
    def refuse(what: str) -> ValueError:
        return ValueError(f"embedder: backend onnx reproduces a Transformer with mean or CLS pooling "
                          f"(and Normalize); {path} {what}")

    st_cfg = path / "config_sentence_transformers.json"
    if st_cfg.is_file() and json.loads(st_cfg.read_text()).get("default_prompt_name"):
        raise refuse("sets a default prompt")
    bert_cfg = path / "sentence_bert_config.json"
    if bert_cfg.is_file() and json.loads(bert_cfg.read_text()).get("do_lower_case"):
        raise refuse("lower-cases its texts (do_lower_case)")
    mods = path / "modules.json"
    if not mods.is_file():
        return "mean"  # a plain transformers folder: sentence-transformers adds mean pooling
    pooling = "mean"
    for m in json.loads(mods.read_text()):
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _MODULES_REPRODUCED:
            raise refuse(f"has a {kind or 'nameless'} module")
        if kind != "Pooling":
            continue
        cfg = json.loads((path / m["path"] / "config.json").read_text())
        mode = cfg.get("pooling_mode")  # sentence-transformers 6+
        modes = [mode] if isinstance(mode, str) else [
            _POOLING_FLAGS.get(k, k.removeprefix("pooling_mode_")) for k, v in cfg.items()
            if k.startswith("pooling_mode_") and v is True]
        if len(modes) != 1 or modes[0] not in ("mean", "cls"):
            raise refuse(f"pools by {modes or 'no mode'}")
        pooling = modes[0]
    return pooling


def max_seq_length(path: Path, tokenizer) -> int:
    """Where sentence-transformers truncates the folder's texts, as its ``Transformer`` module takes it.

    Args:
        path: a local model folder.
        tokenizer: its tokenizer (only ``model_max_length`` is read; 1e30 when a tokenizer states none).

    Returns:
        Its ``sentence_bert_config.json``'s ``max_seq_length``, else the smaller of the tokenizer's
        ``model_max_length`` and the model's ``max_position_embeddings``, else 512 (tokens).

    Raises:
        OSError, ValueError: a config file cannot be read or is not JSON.
    """
    st_cfg = path / "sentence_bert_config.json"
    if st_cfg.is_file():
        n = json.loads(st_cfg.read_text()).get("max_seq_length")
        if n:
            return int(n)
    cfg = path / "config.json"
    pos = json.loads(cfg.read_text()).get("max_position_embeddings") if cfg.is_file() else None
    limits = [int(x) for x in (getattr(tokenizer, "model_max_length", None), pos)
              if isinstance(x, (int, float)) and 0 < x < 1 << 31]
    return min(limits) if limits else 512


# position encodings whose table (``max_position_embeddings`` rows, or twice that for the relative
# distances) a longer text indexes past; rotary, ALiBi and DeBERTa's relative buckets have none
_TABLE_POSITIONS = ("absolute", "relative_key", "relative_key_query")


def position_limit(config: dict) -> int | None:
    """The most tokens a model's position table takes (``config.json``'s ``max_position_embeddings``),
    or None where its positions have no such bound or it states none.

    Args:
        config: the model's ``config.json`` as a dict.

    Returns:
        ``max_position_embeddings``, unless the model encodes positions without a table of them:
        DeBERTa's relative buckets (``position_biased_input`` false), rotary or ALiBi positions
        (``position_embedding_type`` of another kind, or ``rope_*`` / ``rotary_*`` settings), which
        run on texts past that number.
    """
    n = config.get("max_position_embeddings")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return None
    if config.get("position_biased_input") is False:
        return None
    if config.get("position_embedding_type", "absolute") not in _TABLE_POSITIONS:
        return None
    if any(str(k).startswith(("rope", "rotary")) or "_rope_" in str(k) for k in config):
        return None
    return n


def reading_fault(tokens: int | None, vocab_size: int | None) -> str | None:
    """Why a loaded model folder would embed every text alike, or None.

    Args:
        tokens: how many tokens its tokenizer knows (``len(tokenizer)``).
        vocab_size: the rows of the model's token embedding (``config.json``'s ``vocab_size``).

    Returns:
        A phrase naming the fault, a tokenizer that knows under half the model's tokens (its vocab
        file missing: transformers then builds one of its five special tokens, and every word reads
        as unknown, so all texts get nearly one vector); None when not, or a number is unknown.
    """
    if tokens and vocab_size and tokens * 2 < vocab_size:
        return (f"its tokenizer knows {tokens} tokens and its model {vocab_size}: a tokenizer file "
                "(vocab.txt, tokenizer.json) is missing or wrong, and most words would read as unknown")
    return None


def within_positions(max_len: int, config: dict, folder) -> int:
    """Where to truncate the folder's texts: its ``max_seq_length``, or the model's position table
    (``position_limit``) where that is shorter, with a warning naming both.

    A folder may state a ``max_seq_length`` past its model's positions; a text longer than the table
    then fails deep inside the model (torch's index error, ONNX Runtime's broadcast). Truncating at the
    table embeds it, as a text past ``max_seq_length`` is embedded from its first tokens, and leaves
    every shorter text's vector as it was.
    """
    limit = position_limit(config)
    if limit is None or max_len <= limit:
        return max_len
    warnings.warn(f"embedder: the model folder {str(folder)!r} truncates texts at max_seq_length {max_len} "
                  f"tokens, past its model's {limit} positions (config.json's max_position_embeddings); "
                  f"texts are truncated at {limit}", RuntimeWarning, stacklevel=3)
    return limit
