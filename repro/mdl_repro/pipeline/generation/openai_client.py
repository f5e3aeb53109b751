"""``OpenAIBackend``: any OpenAI-compatible HTTP server through the ``openai`` client.

Base URL and key come from the environment (MDL_JAX_OPENAI_BASE_URL / OPENAI_BASE_URL,
MDL_JAX_OPENAI_API_KEY / OPENAI_API_KEY) and are never written to records or logs. Timeouts, refused
connections and 5xx answers are retried with exponential backoff inside a total time budget per call
(``call_timeout``); a malformed answer (a body that is not JSON, no choices) is not retried. A call
that still fails comes back with ``failed=True`` and a reason (the run goes on, and a rerun fills it
in).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from mdl_repro.pipeline.generation.base import MAX_NEW_TOKENS, TEMPERATURE, TOP_P, Chat, Generation
from mdl_repro.pipeline.generation.sampling import seed_list


def _env(*names: str) -> str | None:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return None


class OpenAIBackend:
    """An OpenAI-compatible chat-completions server (deepseek, gemini, a local server, ...)."""

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 max_retries: int = 4, timeout: float = 60.0, backoff: float = 0.5,
                 concurrency: int = 4, max_new_tokens: int = MAX_NEW_TOKENS,
                 call_timeout: float = 120.0):
        from urllib.parse import urlsplit

        from openai import OpenAI

        base_url = base_url or _env("MDL_JAX_OPENAI_BASE_URL", "OPENAI_BASE_URL")
        if not base_url:
            raise ValueError("base_url: set MDL_JAX_OPENAI_BASE_URL (or OPENAI_BASE_URL) for the "
                             "openai backend")
        if not call_timeout > 0:
            raise ValueError(f"call_timeout: expected seconds > 0, got {call_timeout!r}")
        key = api_key or _env("MDL_JAX_OPENAI_API_KEY", "OPENAI_API_KEY") or "none"
        # Our own retry loop (below) decides what is retried; the client's is switched off.
        self._client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout)
        # Host and port only, for error texts: a URL may carry credentials in userinfo or query.
        u = urlsplit(base_url)
        self._where = f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"
        self.max_new_tokens = max_new_tokens
        self.model = model
        self.model_id = model  # the URL and key are deliberately not part of the id
        self.max_retries = max_retries
        self.timeout = timeout
        self.call_timeout = float(call_timeout)
        self.backoff = backoff
        self.concurrency = concurrency
        self.tokens_generated = 0
        self.seconds = 0.0
        self.score_seconds = 0.0
        self.calls = self.failed_calls = 0
        self._lock = threading.Lock()

    def _describe(self, e) -> str:
        """One line naming what went wrong and where (host:port only), never the key or full URL."""
        import re

        import openai

        name = type(e).__name__
        if isinstance(e, openai.APITimeoutError):
            return f"{name}: no answer from {self._where}"
        if isinstance(e, openai.APIConnectionError):
            cause = e.__cause__ or e.__context__
            detail = re.sub(r"^\[Errno -?\d+\]\s*", "", str(cause or "")).strip() or "connection failed"
            return f"{name}: {detail} to {self._where}"
        if isinstance(e, openai.APIStatusError):
            return f"HTTP {e.status_code} from {self._where}"
        return f"{name}: {str(e)[:200]}"

    def _call(self, *, _legacy: bool = False, **kw):
        """(response, "") or (None, reason). Retries timeouts, refused connections, 429 and 5xx with
        exponential backoff, all inside ``call_timeout`` seconds; anything else fails at once.
        ``_legacy``: the legacy ``/v1/completions`` endpoint instead of chat completions."""
        import openai

        create = self._client.completions.create if _legacy else self._client.chat.completions.create

        deadline = time.monotonic() + self.call_timeout
        last = ""
        for attempt in range(self.max_retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                # The per-request timeout never runs past the call's total budget.
                return create(timeout=min(self.timeout, left), **kw), ""
            except (openai.APITimeoutError, openai.APIConnectionError, openai.InternalServerError,
                    openai.RateLimitError) as e:
                last = self._describe(e)
            except openai.APIStatusError as e:
                if e.status_code < 500:
                    return None, self._describe(e)
                last = self._describe(e)
            except Exception as e:  # noqa: BLE001 - a 200 whose body is not a completion (not JSON ...)
                return None, f"malformed answer from {self._where}: {type(e).__name__}: {str(e)[:160]}"
            if attempt == self.max_retries:
                return None, last
            pause = self.backoff * 2 ** attempt
            if time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)
        return None, (last + "; " if last else "") + \
            f"gave up: the {self.call_timeout:g} s budget of this call (--call-timeout) ran out"

    def _note(self, failed: bool, reason: str) -> None:
        with self._lock:
            self.calls += 1
            self.failed_calls += failed
        if failed:
            # Visible while the bar waits: a silent hang was the old failure mode.
            _say(f"openai backend: a call failed: {reason}")

    def _one(self, chat: Chat, seed: int, max_new_tokens: int, temperature: float,
             top_p: float) -> Generation:
        r, err = self._call(model=self.model, messages=chat, temperature=temperature, top_p=top_p,
                            max_tokens=max_new_tokens, seed=seed)
        g = Generation(None, failed=True, error=err)
        if r is not None:
            try:
                text = (r.choices[0].message.content or "").strip()
                n = getattr(r.usage, "completion_tokens", 0) if getattr(r, "usage", None) else 0
                g = Generation(text, int(n or 0))
            except (AttributeError, IndexError, TypeError, KeyError) as e:
                g = Generation(None, failed=True, error=f"malformed answer from {self._where}: "
                                                        f"{_shape_of(r, e)}")
        self._note(g.failed, g.error)
        return g

    def generate(self, prompts: Sequence[Chat], *, seed, max_new_tokens: int | None = None,
                 temperature: float = TEMPERATURE, top_p: float = TOP_P) -> list[Generation]:
        """One text per prompt; each request carries its prompt's record seed (servers that honour
        ``seed`` then give the same answer to the same prompt of the same record)."""
        max_new_tokens = max_new_tokens or self.max_new_tokens
        seeds = seed_list(seed, len(prompts))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(self.concurrency) as pool:
            out = list(pool.map(lambda ps: self._one(ps[0], ps[1], max_new_tokens, temperature, top_p),
                                zip(prompts, seeds)))
        self.seconds += time.perf_counter() - t0
        self.tokens_generated += sum(g.n_tokens for g in out)
        return out

    def _score_one(self, chat: Chat, options: Sequence[str]):
        """Scores from the ``top_logprobs`` of a 1-token greedy completion: an option gets the best
        log-probability of a listed token that starts it (labels are chosen so their first tokens
        differ). None when the server sent no logprobs; (None, reason) when the call failed."""
        r, err = self._call(model=self.model, messages=chat, temperature=0.0, max_tokens=1, seed=0,
                            logprobs=True, top_logprobs=20)
        self._note(r is None, err)
        if r is None:
            return None, err
        try:
            content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
        except (AttributeError, IndexError, TypeError):
            return None, "malformed answer"
        if not content:
            return None, ""
        tops = [(t.token, t.logprob) for t in (content[0].top_logprobs or [])] or \
            [(content[0].token, content[0].logprob)]
        scores = []
        for o in options:
            hits = [lp for t, lp in tops if t.strip() and o.lower().startswith(t.strip().lower())]
            scores.append(max(hits) if hits else float("-inf"))
        return scores, ""

    def score(self, prompts: Sequence[Chat], options) -> list[list[float] | None]:
        """Per prompt, one log-probability per option, or None where the server gave no logprobs (the
        caller then falls back to parsing text)."""
        per = [list(options)] * len(prompts) if options and isinstance(options[0], str) \
            else [list(o) for o in options]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(self.concurrency) as pool:
            res = list(pool.map(lambda po: self._score_one(*po), zip(prompts, per)))
        self.score_seconds += time.perf_counter() - t0
        return [sc for sc, _ in res]


    def _token_logprobs_one(self, prompt: str, answer: str) -> dict:
        r, err = self._call(_legacy=True, model=self.model, prompt=prompt + answer, echo=True,
                            max_tokens=0, logprobs=0, temperature=0.0)
        self._note(r is None, err)
        if r is None:
            return {"failed": True, "error": err}
        try:
            lp = r.choices[0].logprobs
            toks, lps, offs = list(lp.tokens), list(lp.token_logprobs), list(lp.text_offset)
            if not (len(toks) == len(lps) == len(offs)):
                raise ValueError(f"{len(toks)} tokens, {len(lps)} logprobs, {len(offs)} offsets")
        except (AttributeError, IndexError, TypeError, ValueError) as e:
            return {"failed": True, "error": f"malformed answer from {self._where}: {_shape_of(r, e)}"
                                             f" ({type(e).__name__}: {str(e)[:120]})"}
        # The answer's tokens are those that start at or after the end of the prompt text (a token
        # straddling the boundary belongs to the prompt); the first token of an echoed prompt has
        # no log-probability (null), which can only happen here for an empty prompt.
        keep = [i for i, o in enumerate(offs) if o >= len(prompt)]
        return {"tokens": [toks[i] for i in keep],
                "logprobs": [float("nan") if lps[i] is None else float(lps[i]) for i in keep],
                # one token's log-probability per position (logprobs: 0) gives no distribution:
                # entropy is unknown through this path
                "entropy": [float("nan")] * len(keep), "failed": False, "error": ""}

    def token_logprobs(self, prompts: Sequence[str], answers: Sequence[str]) -> list[dict]:
        """Teacher-forced scoring through the server's legacy ``/v1/completions`` (``echo: true,
        max_tokens: 0, logprobs: 0``, the OpenAI / vLLM format): per (prompt, answer), the answer's
        ``tokens`` and their ``logprobs`` (T,), read from ``choices[0].logprobs`` by ``text_offset``.

        ``prompts`` are TEXT prompts rendered by the caller (e.g. a chat template applied with the
        assistant's turn opened), since the legacy endpoint takes text. ``entropy`` is NaN per token:
        the format returns no full distribution. A failed call gives ``{"failed": True, "error"}``.
        """
        if len(prompts) != len(answers):
            raise ValueError(f"answers: expected one answer per prompt ({len(prompts)}), got {len(answers)}")
        for name, xs in (("prompts", prompts), ("answers", answers)):
            bad = [type(x).__name__ for x in xs if not isinstance(x, str)]
            if bad:
                raise ValueError(f"{name}: expected text (str), got {bad[0]}")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(self.concurrency) as pool:
            out = list(pool.map(lambda pa: self._token_logprobs_one(*pa), zip(prompts, answers)))
        self.score_seconds += time.perf_counter() - t0
        return out


def _shape_of(r, e) -> str:
    try:
        n = len(r.choices)
    except Exception:  # noqa: BLE001
        return f"{type(e).__name__} reading the answer"
    return f"{n} choices" if n == 0 else f"{type(e).__name__} reading the answer"


def _say(msg: str) -> None:
    try:
        from tqdm.auto import tqdm

        tqdm.write(msg, file=sys.stderr)
    except ImportError:  # pragma: no cover
        print(msg, file=sys.stderr, flush=True)
