"""The chat messages of the four actions: what Active, Supp, Silent and Opt-Out send to a model.

Shared by the experiment pipeline (B1 / B2 / B3 and the baselines, ``pipeline/systems.py``) and the
memory gate (``mdl_jax.gate``), so a gated application sends exactly the prompts the benchmark measured:
  Active   the memories, then the question;
  Supp     the memories, the caution below, then the question;
  Silent   the question alone (B1's prompt);
  Opt-Out  no model call: the answer is ``ABSTENTION``.
Standard library only: importing this module loads no model.
"""

from __future__ import annotations

from collections.abc import Sequence

SYSTEM_PROMPT = ("You are a helpful assistant. Answer the question truthfully and concisely, "
                 "in one or two sentences.")
CAUTION = ("Caution: these memories may be unreliable or contradict each other. Use a memory only if "
           "you are confident it is correct; if you are not sure, say \"I don't know\".")
ABSTENTION = ("I don't know. (The memory decision layer abstained: the retrieved memories are not "
              "trustworthy enough for this question.)")


def memory_block(memories: Sequence[str], caution: bool = False) -> str:
    """The memories as a bulleted block (and the caution for Supp), as the user turn carries them."""
    mem = "\n".join(f"- {m}" for m in memories)
    return f"Memories:\n{mem}\n\n" + (CAUTION + "\n\n" if caution else "")


def chat(question: str, memories: Sequence[str] = (), caution: bool = False) -> list[dict]:
    """[system, user] messages for ``question`` with ``memories`` injected (none: the question alone)."""
    user = (memory_block(memories, caution) if memories else "") + f"Question: {question}\nAnswer:"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
