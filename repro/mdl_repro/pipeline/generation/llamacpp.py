"""``LlamaCppBackend``: the local model's sampled generation through llama.cpp on the GGUF file (the
bundled SmolLM2's Q4_1 weights, run as a cached Q8_0 copy: see "Weights" below), behind
``LocalBackend``'s interface: ``engine="llama.cpp"``, the ``llamacpp`` extra.

    LlamaCppBackend(model="bundled:smollm2", batch_size=32).generate(prompts, seed=..., max_new_tokens=150)

Why: on a CPU without AVX512-BF16 the torch path runs SmolLM2 in float32, and of the engines a user
would pick instead for a small GGUF model on such a CPU, llama.cpp was the fastest peer in both modes
(``experiments/bench_generation_engines.py``; the figures are in docs/benchmarks.md). With its Q8_0
copy (below) it is also the fastest batched at 32, ahead of the llama.cpp peer on the Q4_1 file; on the
pipeline's natural answers,
where prefill weighs most, it only draws level with ctranslate2, so ``auto`` does not pick it
(docs/deviations.md).

How it keeps the backend's promises (docs/deviations.md, "Generation engine"):

  - **prompts** are the torch path's token ids: rendered with the same transformers chat template
    and tokenised by the same tokenizer (the GGUF's vocabulary), then fed to llama.cpp as ids;
  - **paired sampling is the torch path's own**: llama.cpp only computes logits; each row draws
    with ``sampling.sample_rows``, the NumPy twin of ``RowSampler`` (temperature, top-p, the
    exponential race on counter-based noise of (row seed, step, token id)), so a row's draws depend
    on nothing but its own seed, as with ``LocalBackend``. What differs is the logits: Q8_0 weights
    (requantised from the Q4_1 file) with 8-bit activations in llama.cpp's matmuls against the
    dequantised float32 weights in torch, and
    llama.cpp's kernels for another batch shape round differently, so a draw can flip where two
    tokens nearly tie; ``CachedBackend`` replays an answered prompt byte for byte, and its key names
    the engine, so these answers are never replayed as torch's;
  - **batching** is continuous: ``batch_size`` sequences share one llama.cpp context (one KV cell
    range each); a row that ends frees its slot and the next prompt (length-sorted) is prefilled
    into it while the others decode, so no row waits for the longest one;
  - ``score``, ``token_logprobs``, ``top_logprobs`` and ``prompt_logprobs`` are not generation: they
    go to a ``LocalBackend`` on the same model (torch, ``score_dtype``), as ``CT2Backend`` does.

Weights (``weights=``, default ``"auto"``): a GGUF whose weights are narrower than 8 bits (the bundled
file is Q4_1) is requantised once to Q8_0 and the copy cached in ``$MDL_JAX_CACHE_DIR/models``;
llama.cpp then runs the Q8_0 copy. Why: on an AVX2 CPU without AVX-512 llama.cpp's
Q8_0 matmuls decode and prefill a batch faster than its Q4_1 ones (Q4_1's unpacking costs more than
the wider weights' reads; docs/benchmarks.md), and at batch 32 the backend was otherwise level with the llama.cpp peer on the same file. The copy
is near-lossless: Q4_1's 16 levels per block of 32 land on Q8_0's 255, each weight moving by at
most half a Q8_0 step (1/254 of its block's largest magnitude); against the torch path's float32
logits (the dequantised Q4_1 weights) the mean KL at temperature 0.7 went from 0.0037 (Q4_1) to 0.0050
(Q8_0), with top-1 agreement 98.0% → 97.7% (48 prompts × 24 positions; a 4-bit Q4_0 copy was far
worse: KL 0.27, 84%). ``weights="file"`` runs the file as it is; ``"q8_0"`` converts any type.
A file already F32, F16, BF16 or Q8_0 is never converted by ``"auto"`` (docs/deviations.md).

Bounds: the context holds ``batch_size`` sequences of ``longest prompt + cap`` tokens, rounded up to
256, at most the model's training context: for SmolLM2-135M, 23 KB of f16 KV cache per token
(30 layers × 2 × 192), so 32 rows × 1,024 tokens = 0.75 GB. One context per backend, kept between
calls and rebuilt only when a call needs more rows or more tokens per row. Calls run one at a time
per backend (a llama.cpp context is not thread-safe).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import threading
import time
import weakref
from collections import deque
from pathlib import Path

from mdl_repro.pipeline.generation.base import (
    BUNDLED,
    BUNDLED_ID,
    MAX_NEW_TOKENS,
    Generation,
    per_prompt_limits,
)
from mdl_repro.pipeline.generation.local import IdsGeneration, TorchScoring, cpu_threads
from mdl_repro.pipeline.generation.sampling import sample_rows

WEIGHTS = ("auto", "file", "q8_0")
Q8_0 = 7  # LLAMA_FTYPE_MOSTLY_Q8_0: the type the copy is made in, and the one a file needs no copy from
# llama.cpp's llama_ftype values (``general.file_type`` in the GGUF) that "auto" runs as they are: 8 bits or
# wider, where a Q8_0 copy would gain little speed and would round weights the file keeps finer
WIDE = {0: "F32", 1: "F16", Q8_0: "Q8_0", 32: "BF16"}
FTYPE_NAMES = {2: "Q4_0", 3: "Q4_1", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M",
               13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", **WIDE}
N_BATCH = 1024  # tokens per llama_decode call (prefill chunks; a decode step is batch_size tokens)
CTX_ROUND = 256  # a sequence's KV cells are rounded up to this, so nearby calls reuse the context


def llamacpp_available() -> bool:
    """Whether ``llama_cpp`` (llama-cpp-python, the ``llamacpp`` extra) is installed, without importing it."""
    return importlib.util.find_spec("llama_cpp") is not None


def gguf_path(model: str) -> Path | None:
    """The GGUF file ``model`` names (the bundled SmolLM2; ``"bundled:qwen2.5-coder-1.5b"``, the opt-in
    Qwen reader joined from its pinned parts and verified before use, see ``generation/qwen.py``; or a
    path ending in .gguf), else None."""
    if model == BUNDLED:
        from mdl_repro.pipeline.generation.loading import bundled_gguf

        folder, name = bundled_gguf()
        return folder / name
    from mdl_repro.pipeline.generation.qwen import QWEN, qwen_gguf

    if model == QWEN:
        return qwen_gguf()
    return Path(model) if str(model).endswith(".gguf") else None


def _init_llama_cpp():
    import llama_cpp
    from llama_cpp import _logger

    if _logger.logger.level == logging.NOTSET:  # llama.cpp logs every tensor on load: errors only
        _logger.logger.setLevel(logging.ERROR)
    llama_cpp.llama_backend_init()
    return llama_cpp


def file_type(path: Path) -> int:
    """The GGUF's ``general.file_type`` (llama.cpp's ``llama_ftype``: 3 is Q4_1, 7 is Q8_0), read with
    the vocabulary only (no weights are loaded); -1 where the file does not say.

    Raises:
        ValueError: llama.cpp cannot read ``path`` as a GGUF (missing, truncated, not a GGUF).
    """
    llama_cpp = _init_llama_cpp()
    mp = llama_cpp.llama_model_default_params()
    mp.vocab_only = True
    m = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    if not m:
        raise ValueError(f"model: llama.cpp could not read the GGUF {path}")
    try:
        buf = ctypes.create_string_buffer(32)
        n = llama_cpp.llama_model_meta_val_str(m, b"general.file_type", buf, len(buf))
        return int(buf.value) if n > 0 and buf.value.isdigit() else -1
    finally:
        llama_cpp.llama_model_free(m)


def q8_0_target(path: Path) -> Path:
    """Where ``q8_0_copy`` keeps the Q8_0 copy of the GGUF ``path`` (its folder made, and checked ours).

    Raises:
        OSError: ``path`` does not exist.
        ValueError: the cache folder cannot be made or is a symlink or not ours (``own_folder``).
    """
    import hashlib

    import llama_cpp

    from mdl_jax._paths import default_cache_dir, own_folder

    real = path.resolve()  # every link to one file shares one copy
    st = real.stat()
    # ctime and inode too: an in-place edit that keeps size and mtime (cp -p, rsync) still changes the key
    key = hashlib.sha256(f"{real}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}|q8_0|"
                         f"{llama_cpp.__version__}".encode()).hexdigest()[:16]
    folder = own_folder(default_cache_dir() / "models", what="MDL_JAX_CACHE_DIR")
    return folder / f"{real.stem}-q8_0-{key}.gguf"


def q8_0_copy(path: Path) -> Path:
    """The Q8_0 requantisation of the GGUF ``path``, made once and cached in
    ``$MDL_JAX_CACHE_DIR/models`` (keyed by the file's resolved path, size, modification and change
    times and inode, and the llama.cpp version); a cached copy that no longer reads as Q8_0 is made
    again. Written by llama.cpp into a fresh private temp folder, fsynced and renamed into place, so a
    reader never sees half a file and a name planted in the cache is never followed.

    Returns:
        the copy's path.

    Raises:
        RuntimeError: llama.cpp could not write the copy (the message names the folder and its free space).
        ValueError: as ``q8_0_target``.
    """
    import shutil

    import llama_cpp

    from mdl_jax._io import atomic_path

    target = q8_0_target(path)
    folder = target.parent
    if target.is_file() and not target.is_symlink():
        try:  # a copy damaged since (truncated, overwritten) is made again, not trusted forever
            if file_type(target) == Q8_0:
                return target
        except ValueError:
            pass
    _init_llama_cpp()
    with atomic_path(target) as out:  # a private temp folder beside the target; renamed over it
        qp = llama_cpp.llama_model_quantize_default_params()
        qp.ftype, qp.allow_requantize, qp.nthread = Q8_0, True, cpu_threads()
        if llama_cpp.llama_model_quantize(str(path).encode(), str(out).encode(), qp) != 0 or not out.is_file():
            free = shutil.disk_usage(folder).free / 2**20
            raise RuntimeError(f"llama.cpp could not requantise {path} to Q8_0 in {folder} ({free:.0f} MiB free "
                               f"there; the copy is about 1.5× a 4-bit file): free space or set "
                               f"MDL_JAX_CACHE_DIR elsewhere, or weights='file' (--gguf-weights file) runs "
                               f"the file as it is")
    return target


def _tokenizer(model: str, path: Path):
    """The transformers tokenizer (and the end-of-text ids) of the torch path for this GGUF: the
    converted checkpoint's for the bundled model (converted once, shared with ``LocalBackend``),
    else read from the GGUF by transformers."""
    from transformers import AutoTokenizer, GenerationConfig

    if model == BUNDLED:
        from mdl_repro.pipeline.generation.ct2 import checkpoint_source

        src, kw = str(checkpoint_source(BUNDLED)[0]), {}
    else:
        src, kw = str(path.parent), {"gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(src, **kw)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    try:
        e = GenerationConfig.from_pretrained(src, **kw).eos_token_id
    except (OSError, ValueError):
        e = None
    if e is None:
        from mdl_repro.pipeline.generation.ct2 import end_token_ids

        return tok, end_token_ids(tok)
    return tok, {int(t) for t in (e if isinstance(e, (list, tuple)) else [e])}


class _Model:
    """One llama.cpp model and its context, freed when the backend is collected."""

    def __init__(self, path: Path, threads: int):
        llama_cpp = _init_llama_cpp()
        mp = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"model: llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.model)
        self.threads = threads
        self.rows = self.per_row = 0
        # the handles live in a box the finalizer holds (not self: that would keep self alive forever)
        self._box = {"model": self.model, "ctx": None}
        self._finalizer = weakref.finalize(self, _free, llama_cpp, self._box)

    @property
    def ctx(self):
        return self._box["ctx"]

    def context(self, rows: int, per_row: int):
        """A context of at least ``rows`` sequences of ``per_row`` tokens each (kept if it suffices)."""
        import llama_cpp

        if self.ctx is not None and rows <= self.rows and per_row <= self.per_row:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
            return self.ctx
        rows, per_row = max(rows, self.rows), max(per_row, self.per_row)
        if rows > llama_cpp.llama_max_parallel_sequences():
            raise ValueError(f"batch_size: llama.cpp runs at most {llama_cpp.llama_max_parallel_sequences()} "
                             f"sequences at once, got {rows}")
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self._box["ctx"] = None
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = rows * per_row, N_BATCH, 512, rows
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.kv_unified = False  # each sequence its own per_row cells: one long row cannot crowd the rest
        ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {rows} × {per_row} tokens")
        self._box["ctx"], self.rows, self.per_row = ctx, rows, per_row
        return ctx


def _free(llama_cpp, box):
    if box["ctx"] is not None:
        llama_cpp.llama_free(box["ctx"])
    if box["model"]:
        llama_cpp.llama_model_free(box["model"])


class LlamaCppBackend(IdsGeneration, TorchScoring):
    """Sampled generation through llama.cpp on a GGUF file, paired sampling as ``LocalBackend``'s;
    scoring through torch. Same interface as ``LocalBackend`` (and ``CT2Backend``'s
    ``min_new_tokens``: the end of text is suppressed before it)."""

    engine = "llama.cpp"

    def __init__(self, model: str = BUNDLED, *, batch_size: int = 32, device: str = "cpu",
                 dtype: str = "auto", max_new_tokens: int = MAX_NEW_TOKENS, threads: int | None = None,
                 score_dtype: str | None = None, weights: str = "auto"):
        if device != "cpu":
            raise ValueError(f"engine llama.cpp: only device='cpu' is supported here, got {device!r}")
        if weights not in WEIGHTS:
            raise ValueError(f"weights: expected one of {', '.join(WEIGHTS)}, got {weights!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        path = gguf_path(model)
        if path is None or not path.is_file():
            raise ValueError(f"engine llama.cpp: model must be {BUNDLED!r}, 'bundled:qwen2.5-coder-1.5b' or a "
                             f".gguf file, got {model!r}")
        if not llamacpp_available():
            raise ValueError("engine llama.cpp: llama-cpp-python is not installed (pip install 'mdl-jax[llamacpp]')")
        import llama_cpp

        self.model, self.path = model, path
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.device = device
        ft = file_type(path)
        have = FTYPE_NAMES.get(ft, f"type {ft}")
        # a Q8_0 file has nothing to convert; "auto" keeps files of 8 bits or wider, or of no stated type
        convert = ft != Q8_0 and (weights == "q8_0" or (weights == "auto" and ft >= 0 and ft not in WIDE))
        self.weights = "q8_0" if convert else "file"
        self.dtype = have.lower() if self.weights == "file" else "q8_0"  # the weights llama.cpp runs
        self.score_dtype = score_dtype or dtype
        self.threads = threads or cpu_threads()
        # the weights are in the id, so the generation cache never replays one's answers as the other's
        conv = "" if self.weights == "file" else f", Q8_0 from {have}"
        from mdl_repro.pipeline.generation.qwen import QWEN, QWEN_ID

        named = {BUNDLED: BUNDLED_ID, QWEN: QWEN_ID}.get(model, str(path))
        self.model_id = named + f" [llama.cpp {llama_cpp.__version__}{conv}]"
        self.tokens_generated = 0
        self.seconds = 0.0
        self.calls = self.failed_calls = 0
        self._lm: _Model | None = None
        self._tok = None
        self._eos: set[int] = set()
        self._lock = threading.Lock()

    def _load(self):
        if self._lm is None:
            self._tok, self._eos = _tokenizer(self.model, self.path)
            self._lm = _Model(self.path if self.weights == "file" else q8_0_copy(self.path), self.threads)
        return self._tok, self._lm

    def _scoring_model(self) -> str:
        if self.model != BUNDLED:  # a GGUF of the user's: transformers has no checkpoint of it here
            raise ValueError(f"engine llama.cpp: scoring runs the torch model, which only the bundled "
                             f"GGUF has here; for {self.model!r} use --engine torch with its checkpoint")
        return BUNDLED

    # -- generation ---------------------------------------------------------------------------------

    def tokenizer(self):
        return self._load()[0]

    def _generate_rows(self, ids, seeds, max_new_tokens, temperature, top_p, stop, on_token, min_new_tokens):
        n = len(ids)
        caps, stops = per_prompt_limits(max_new_tokens, stop, n, self.max_new_tokens)
        if not n:
            return []
        tok, lm = self._load()
        for i, p in enumerate(ids):
            if not p:
                raise ValueError(f"prompts[{i}]: empty after tokenisation")
            if len(p) + caps[i] > lm.n_ctx_train:
                raise ValueError(f"prompts[{i}]: {len(p)} prompt tokens + {caps[i]} new exceed the model's "
                                 f"context of {lm.n_ctx_train}")
        per_row = max(len(p) + c for p, c in zip(ids, caps)) + 1
        per_row = min(-(-per_row // CTX_ROUND) * CTX_ROUND, lm.n_ctx_train)
        with self._lock:
            t0 = time.perf_counter()
            try:
                return self._run(tok, lm, ids, seeds, caps, stops, temperature, top_p, on_token,
                                 int(min_new_tokens), per_row)
            finally:
                self.seconds += time.perf_counter() - t0

    def _run(self, tok, lm, ids, seeds, caps, stops, temperature, top_p, on_token, min_new, per_row):
        import llama_cpp
        import numpy as np

        from mdl_repro.pipeline.generation.local import first_stop

        n, eos = len(ids), self._eos
        slots = min(self.batch_size, n)
        ctx = lm.context(slots, per_row)
        mem = llama_cpp.llama_get_memory(ctx)
        batch = llama_cpp.llama_batch_init(max(N_BATCH, slots), 0, 1)
        pending = deque(sorted(range(n), key=lambda i: len(ids[i])))  # similar lengths run side by side
        free = list(range(slots))[::-1]
        active: dict[int, int] = {}  # slot (llama.cpp sequence) -> row
        body: list[list[int]] = [[] for _ in range(n)]
        logits: dict[int, np.ndarray] = {}  # row -> logits of its next token
        out: list = [None] * n  # placeholders: every slot is set below
        eos_arr = np.fromiter(sorted(eos), dtype=np.int64)

        def decode(entries):
            """Feed ``entries`` [(token, pos, seq, want_logits)] in calls of at most N_BATCH tokens;
            the logits asked for, in order."""
            got = []
            for a in range(0, len(entries), N_BATCH):
                part = entries[a:a + N_BATCH]
                batch.n_tokens = len(part)
                want = []
                for j, (t, pos, seq, w) in enumerate(part):
                    batch.token[j], batch.pos[j], batch.n_seq_id[j] = t, pos, 1
                    batch.seq_id[j][0] = seq
                    batch.logits[j] = w
                    if w:
                        want.append(j)
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama.cpp: llama_decode failed (the context is too small?)")
                if want:  # the outputs asked for, one row each in batch order: one copy
                    ptr = ctypes.cast(llama_cpp.llama_get_logits(ctx), ctypes.POINTER(ctypes.c_float))
                    got.extend(np.ctypeslib.as_array(ptr, shape=(len(want), lm.vocab)).copy())
            return got

        def finish(i, reason):
            row = body[i]
            cut = next((j for j, t in enumerate(row) if t in eos), None)
            text_ids = row if cut is None else row[:cut]
            k = len(row) if cut is not None and tok.pad_token_id not in eos else len(text_ids)
            self.tokens_generated += k
            text = tok.decode(text_ids, skip_special_tokens=True)
            hit = first_stop(text, stops[i])
            if hit is not None:
                text, reason = text[:hit], "stop"
            out[i] = Generation(text.strip(), k, prompt_tokens=len(ids[i]), finish_reason=reason)

        try:
            while pending or active:
                new = []
                while pending and free:  # prefill the waiting prompts into the free sequences
                    i, s = pending.popleft(), free.pop()
                    llama_cpp.llama_memory_seq_rm(mem, s, -1, -1)
                    active[s] = i
                    new.append((i, s))
                if new:
                    entries = [(t, pos, s, pos == len(ids[i]) - 1) for i, s in new for pos, t in enumerate(ids[i])]
                    for (i, _), lg in zip(new, decode(entries)):
                        logits[i] = lg
                rows = [active[s] for s in sorted(active)]
                z = np.stack([logits.pop(i) for i in rows])
                early = [r for r, i in enumerate(rows) if len(body[i]) < min_new]
                if early and len(eos_arr):
                    z[np.asarray(early)[:, None], eos_arr[None, :]] = -np.inf
                picks = sample_rows(z, [seeds[i] for i in rows], [len(body[i]) for i in rows], temperature, top_p)
                step = []
                for s, pick in zip(sorted(active), picks.tolist()):  # rows were stacked in this order
                    i, t = active[s], int(pick)
                    body[i].append(t)
                    done = None
                    if t in eos:
                        done = "stop"
                    elif on_token is not None and on_token(i, t):
                        done = "stop"
                    elif len(body[i]) >= caps[i]:
                        done = "length"
                    elif stops[i] and first_stop(tok.decode(body[i], skip_special_tokens=True), stops[i]) is not None:
                        done = "stop"
                    if done is not None:
                        finish(i, done)
                        del active[s]
                        free.append(s)
                    else:
                        step.append((t, len(ids[i]) + len(body[i]) - 1, s, True))
                if step:
                    for (_, _, s, _), lg in zip(step, decode(step)):
                        logits[active[s]] = lg
        finally:
            llama_cpp.llama_batch_free(batch)
        return out
