"""``CT2Backend``: the local model's sampled generation through CTranslate2 with int8 weights, for CPUs
without AVX512-BF16 (where the torch path runs in float32), behind ``LocalBackend``'s interface.

    CT2Backend(model="bundled:smollm2", batch_size=32).generate(prompts, seed=..., max_new_tokens=150)

The model is converted once, offline, from the same weights ``LocalBackend`` loads (the bundled GGUF,
dequantised by transformers) and cached on disk beside the converted torch checkpoint, keyed by the
GGUF file, the int8 quantisation and the ctranslate2 and transformers versions (``ct2_model``).

What changes against ``LocalBackend`` (docs/deviations.md, "Generation engine"):

  - the weights are int8 (quantised from the dequantised Q4_1 weights) and the matmuls run in int8:
    answers differ from the torch path's, and the cache keeps them apart (``engine`` and ``model_id``);
  - sampling is CTranslate2's own (temperature, top-p over the whole vocabulary), seeded per call:
    ctranslate2 has one random generator per worker thread, seeded when the thread first samples and
    advanced row after row through a batch, so a row's draws depend on the rows sampled before it.
    Each ``generate`` call therefore runs on a fresh ``ctranslate2.Generator`` (built from the weights
    held in memory, which costs CPU time per call) seeded from its rows' seeds in order: the same
    prompts, seeds and batch size give the same texts, run after run, but a row's text is not a
    function of (prompt, record) alone as with ``LocalBackend``. The paired-sampling guarantee the
    experiment relies on, the same answer wherever two systems send the same prompt for the same
    record, is kept by the generation cache (``CachedBackend``), which replays it;
  - ``score``, ``token_logprobs``, ``top_logprobs`` and ``prompt_logprobs`` are not generation:
    they are delegated to a ``LocalBackend`` on the same model (torch, ``score_dtype``), so label
    scoring and teacher-forced log-probabilities are those of the paper setup;
  - ``stop`` and ``on_token`` are applied to the finished rows (the text ends before the first stop
    string / at the token ``on_token`` returns true for), not inside the decoding loop.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from mdl_jax._paths import default_cache_dir
from mdl_repro.pipeline.generation.base import (
    BUNDLED,
    BUNDLED_ID,
    MAX_NEW_TOKENS,
    Generation,
    per_prompt_limits,
)
from mdl_repro.pipeline.generation.local import IdsGeneration, TorchScoring, cpu_threads

ENGINES = ("torch", "ctranslate2", "llama.cpp", "auto")
_SEED_LOCK = threading.Lock()


def ct2_available() -> bool:
    """Whether the ``ctranslate2`` package is installed (the ``ct2`` extra), without importing it."""
    import importlib.util

    return importlib.util.find_spec("ctranslate2") is not None


def resolve_engine(engine: str, device: str = "cpu", dtype: str = "auto") -> str:
    """The engine a local backend runs: ``torch`` (transformers, the paper setup), ``ctranslate2``,
    ``llama.cpp`` (``LlamaCppBackend``: the fastest single-stream on a CPU without bf16), or
    ``auto``: ctranslate2 where it pays, i.e. on a CPU without bf16 (``auto_dtype`` gives float32),
    with no dtype asked for, and the ``ct2`` extra installed; else torch."""
    from mdl_repro.pipeline.generation.loading import auto_dtype

    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    if device == "cpu" and dtype == "auto" and auto_dtype("cpu") == "float32" and ct2_available():
        return "ctranslate2"
    return "torch"


def checkpoint_source(model: str) -> tuple[Path, str]:
    """(a transformers checkpoint folder holding the model's weights, a key naming them)."""
    from mdl_repro.pipeline.generation.loading import bundled_gguf, converted_dir, load_local

    if model == BUNDLED:
        folder, gguf = bundled_gguf()
        src = converted_dir(folder, gguf, "float32")
        if not (src / "config.json").is_file():
            load_local(BUNDLED, "float32")  # converts the GGUF once and caches the checkpoint there
        if not (src / "config.json").is_file():
            raise RuntimeError(f"engine ctranslate2: could not write the converted checkpoint {src}")
        st = (folder / gguf).stat()
        return src, f"{gguf}|{st.st_size}|{st.st_mtime_ns}"
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ValueError(f"engine ctranslate2: model must be {BUNDLED!r} or a local transformers "
                         f"checkpoint folder (it is converted offline), got {model!r}")
    st = (path / "config.json").stat()
    return path, f"{path.resolve()}|{st.st_mtime_ns}"


def _ct2_dir(model: str, quantization: str) -> tuple[Path, Path]:
    import ctranslate2
    import transformers

    src, name = checkpoint_source(model)
    key = hashlib.sha256(f"{name}|ct2-{quantization}|{ctranslate2.__version__}|"
                         f"{transformers.__version__}".encode()).hexdigest()[:16]
    stem = Path(name.split("|", 1)[0]).stem if model == BUNDLED else Path(model).name
    return src, default_cache_dir() / "models" / f"{stem}-ct2-{quantization}-{key}"


def ct2_model(model: str = BUNDLED, quantization: str = "int8"):
    """(folder of the CTranslate2 model, its tokenizer): converted once from the transformers
    checkpoint of ``model`` (for the bundled one, the float32 checkpoint converted from the GGUF) and
    cached; written into a temporary folder and renamed into place, so a reader never sees half."""
    from transformers import AutoTokenizer

    src, target = _ct2_dir(model, quantization)
    if not (target / "model.bin").is_file():
        from ctranslate2.converters import TransformersConverter

        from mdl_jax._io import publish_dir

        # a fresh private folder published whole (over a damaged copy without model.bin, too)
        with publish_dir(target) as tmp:
            TransformersConverter(str(src), low_cpu_mem_usage=True).convert(
                str(tmp), quantization=quantization, force=True)
            AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(tmp))
    tok = AutoTokenizer.from_pretrained(str(target))
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return target, tok


def _call_seed(row_seeds: Sequence[int]) -> int:
    """One 31-bit seed for a call from its rows' seeds in order (ctranslate2 takes an unsigned int)."""
    h = hashlib.sha256(",".join(str(int(s)) for s in row_seeds).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


class CT2Backend(IdsGeneration, TorchScoring):
    """Sampled generation through CTranslate2 (int8 weights) on this CPU; scoring through torch.

    Same interface as ``LocalBackend``: ``generate``, ``score``, ``token_logprobs``, ``top_logprobs``,
    ``prompt_logprobs`` and the counters ``tokens_generated``, ``seconds``, ``score_seconds``,
    ``calls``, ``failed_calls``. ``generate`` also takes ``min_new_tokens`` (the end of text is
    suppressed before it: the benchmark decodes every row to the same length)."""

    engine = "ctranslate2"

    def __init__(self, model: str = BUNDLED, *, batch_size: int = 32, device: str = "cpu",
                 dtype: str = "auto", max_new_tokens: int = MAX_NEW_TOKENS, compute_type: str = "int8",
                 threads: int | None = None, score_dtype: str | None = None):
        if device != "cpu":
            raise ValueError(f"engine ctranslate2: only device='cpu' is supported here, got {device!r}")
        if compute_type not in ("int8", "int8_float32", "float32", "int16"):
            raise ValueError(f"compute_type: expected int8, int8_float32, int16 or float32, got {compute_type!r}")
        self.max_new_tokens = max_new_tokens
        self.model = model
        self.batch_size = batch_size
        self.device = device
        self.dtype = compute_type
        self.compute_type = compute_type
        self.threads = threads or cpu_threads()
        # scoring goes through torch: in the dtype asked for (``dtype``), else what the CPU computes natively
        self.score_dtype = score_dtype or dtype
        import ctranslate2

        self.model_id = (BUNDLED_ID if model == BUNDLED else model) + \
            f" [ctranslate2 {ctranslate2.__version__} {compute_type}]"
        self.tokens_generated = 0
        self.seconds = 0.0
        self.calls = self.failed_calls = 0
        self._files: dict[str, bytes] | None = None
        self._tok = None

    # -- the model ----------------------------------------------------------------------------------

    def _load(self):
        if self._files is None:
            path, tok = ct2_model(self.model, "int8" if self.compute_type.startswith("int8") else self.compute_type)
            self._files = {f: (path / f).read_bytes() for f in ("config.json", "model.bin", "vocabulary.json")
                           if (path / f).is_file()}
            self._tok = tok
        return self._tok

    def _generator(self, seed: int):
        """A fresh ``ctranslate2.Generator`` whose worker thread samples from ``seed`` (ctranslate2
        seeds a thread's generator from the global seed when that thread first samples)."""
        import ctranslate2

        self._load()
        ctranslate2.set_random_seed(int(seed))
        return ctranslate2.Generator("mdl-ct2", files=self._files, device="cpu", compute_type=self.compute_type,
                                     inter_threads=1, intra_threads=self.threads)


    # -- generation ---------------------------------------------------------------------------------

    def tokenizer(self):
        return self._load()

    def _generate_rows(self, ids, seeds, max_new_tokens, temperature, top_p, stop, on_token, min_new_tokens):
        tok = self._load()
        n = len(ids)
        caps, stops = per_prompt_limits(max_new_tokens, stop, n, self.max_new_tokens)
        eos_ids = end_token_ids(tok)
        order = sorted(range(n), key=lambda i: len(ids[i]))  # similar lengths share a batch (stable)
        sampling = (dict(sampling_topk=0, sampling_topp=float(top_p), sampling_temperature=float(temperature))
                    if temperature > 0 else dict(sampling_topk=1))
        if not n:
            return []
        # ctranslate2's seed is global and read when the worker first samples (in the first batch), so
        # no other call may set it in between: calls through this engine run one at a time per process.
        with _SEED_LOCK:
            return self._run(ids, seeds, order, caps, stops, eos_ids, sampling, min_new_tokens, on_token)

    def _run(self, ids, seeds, order, caps, stops, eos_ids, sampling, min_new_tokens, on_token):
        from mdl_repro.pipeline.generation.local import first_stop

        tok = self._tok
        out: list = [None] * len(ids)  # placeholders: every slot is set below
        t0 = time.perf_counter()
        gen = self._generator(_call_seed([seeds[i] for i in order]))
        self.seconds += time.perf_counter() - t0
        for idx in _plan_batches([len(ids[i]) for i in order], max(caps), self.batch_size, order):
            cap = max(caps[i] for i in idx)
            t0 = time.perf_counter()
            res = gen.generate_batch([tok.convert_ids_to_tokens(ids[i]) for i in idx], max_length=cap,
                                     min_length=min(int(min_new_tokens), cap), include_prompt_in_result=False,
                                     return_end_token=True, end_token=sorted(eos_ids), **sampling)
            self.seconds += time.perf_counter() - t0
            for r, i in zip(res, idx):
                row = [int(t) for t in r.sequences_ids[0]][:caps[i]]
                cancelled = False
                if on_token is not None:
                    for j, t in enumerate(row):
                        if t in eos_ids:
                            break
                        if on_token(i, t):
                            row, cancelled = row[:j + 1], True
                            break
                cut = next((j for j, t in enumerate(row) if t in eos_ids), None)
                body = row if cut is None else row[:cut]
                k = len(body) if cut is None else len(body) + 1  # the end-of-text token counts (as LocalBackend)
                if tok.pad_token_id in eos_ids:
                    k = len(body)
                self.tokens_generated += k
                text = tok.decode(body, skip_special_tokens=True)
                hit = first_stop(text, stops[i])
                reason = "stop" if (cut is not None or hit is not None or cancelled) else \
                    ("length" if len(body) >= caps[i] else "stop")
                if hit is not None:
                    text = text[:hit]
                out[i] = Generation(text.strip(), k, prompt_tokens=len(ids[i]), finish_reason=reason)
        return out


STEP_OVERHEAD = 4.0  # one decoding step's cost at batch b ~ STEP_OVERHEAD + b (in one row's cost)


def _plan_batches(lengths: Sequence[int], new: int, batch_size: int, order: Sequence[int]) -> list[list[int]]:
    """Batches of consecutive rows of ``order`` (sorted by prompt length, ``lengths`` in that order)
    that minimise the estimated decoding time.

    ctranslate2 forwards a batch's prompts at once only up to the shortest one; the rest of each
    longer prompt is fed one token per decoding step, so a batch runs ``new + (longest - shortest)``
    steps. A step at batch b costs about ``STEP_OVERHEAD + b`` rows' worth (reading the weights is
    shared, so a step's fixed cost is a few rows' worth: ``STEP_OVERHEAD``), so one batch of
    32 prompts whose lengths spread over 200 tokens (B2 prompts do) decodes 150 tokens in 350 steps.
    Dynamic programming over the sorted rows (at most ``batch_size`` each) picks the cuts."""
    n = len(lengths)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(max(0, j - batch_size), j):
            c = best[i] + (new + lengths[j - 1] - lengths[i]) * (STEP_OVERHEAD + (j - i))
            if c < best[j]:
                best[j], cut[j] = c, i
    out, j = [], n
    while j > 0:
        out.append(list(order[cut[j]:j]))
        j = cut[j]
    return out[::-1]


def end_token_ids(tok) -> set[int]:
    """The ids that end a row: the tokenizer's end of text and the chat template's end of turn."""
    out = {int(tok.eos_token_id)} if tok.eos_token_id is not None else set()
    for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and i != tok.unk_token_id and i >= 0:
            out.add(i)
    return out
