"""The LLM judge (``mdl-jax judge --judge llm``) end to end against a real local OpenAI-compatible server
(``python -m mdl_repro.serve``, the bundled SmolLM2) on a few gold answers, and its failure paths: a
server that is down (failed verdicts with their reason, exit 3), retries after 503, replies that name
no label (failed, never guessed)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mdl_repro.pipeline.judgement_llm import LLMJudge, verdict_from_reply

ROOT = Path(__file__).resolve().parents[1]
GOLD = ROOT / "repro" / "mdl_repro" / "pipeline" / "resources" / "gold_labels.jsonl"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(model_server):
    """(base URL, served model id) of the session's real server process."""
    with urllib.request.urlopen(model_server + "/models", timeout=30) as r:
        return model_server, json.load(r)["data"][0]["id"]


def _gold_slice(path: Path, n: int) -> Path:
    lines = [ln for ln in GOLD.read_text().splitlines() if ln.strip()]
    # both datasets, both labels
    pick = lines[:n // 2] + lines[-(n - n // 2):]
    path.write_text("\n".join(pick) + "\n")
    return path


@pytest.mark.slow
def test_llm_judge_grades_gold_answers_through_a_real_server_and_asks_nothing_twice(
        served, tmp_path, capsys, monkeypatch):
    from mdl_jax.cli import main

    base, model = served
    monkeypatch.setenv("JC_JUDGE_KEY", "sk-judge-secret-987")
    src = _gold_slice(tmp_path / "gold4.jsonl", 4)
    argv = ["judge", str(src), "--judge", "llm", "--base-url", base, "--model", model, "--no-gold",
            "--api-key-env", "JC_JUDGE_KEY", "--concurrency", "2", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    out = [json.loads(x) for x in (tmp_path / "gold4.judged.jsonl").read_text().splitlines()]
    assert len(out) == 4
    for r in out:
        # ours sends logprobs: every verdict is a label likelihood, none guessed
        assert r["judge_llm_method"] == "logprobs" and isinstance(r["judge_llm_hallucinated"], bool)
        assert 0.0 <= r["judge_llm_p_yes"] <= 1.0 and r["judge_llm_hallucinated"] == (r["judge_llm_p_yes"] > 0.5)
        assert r["judge_llm_model"] == model and r["judge_llm_error"] is None
    summary = json.loads((tmp_path / "gold4.judged.llm-judge.json").read_text())
    assert summary["calls"] == 4 and summary["failed"] == 0
    agree = summary["gold_agreement"]
    assert sum(a["n"] for a in agree.values()) == 4
    assert all(a["agree"] == sum(r["judge_llm_hallucinated"] == (r["label"] == "hallucinated")
                                 for r in out if r["dataset"] == ds) for ds, a in agree.items())
    # a rerun answers from the on-disk cache: no request reaches the server
    assert main(argv) == 0
    capsys.readouterr()
    again = json.loads((tmp_path / "gold4.judged.llm-judge.json").read_text())
    assert again["calls"] == 0 and again["cache_hits"] == 4
    # the report section reads what the command wrote
    from mdl_repro.analysis.judges import llm_section

    assert "Wilson" in llm_section(tmp_path) and model in llm_section(tmp_path)
    # the key is never written or logged
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert b"sk-judge-secret-987" not in f.read_bytes(), f
    assert "sk-judge-secret-987" not in err


def test_server_down_gives_failed_verdicts_with_their_reason_and_exit_3(tmp_path, capsys):
    from mdl_jax.cli import main

    src = _gold_slice(tmp_path / "gold2.jsonl", 2)
    port = _free_port()  # nothing listens there
    rc = main(["judge", str(src), "--judge", "llm", "--base-url", f"http://127.0.0.1:{port}/v1",
               "--model", "m", "--no-gold", "--retries", "1", "--cache-dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert rc == 3 and "2 of 2 LLM verdicts failed" in err and "Traceback" not in err
    for r in map(json.loads, (tmp_path / "gold2.judged.jsonl").read_text().splitlines()):
        assert r["judge_llm_hallucinated"] is None and r["judge_llm_method"] == "failed"
        assert f"cannot reach 127.0.0.1:{port}" in r["judge_llm_error"] and "2 attempts" in r["judge_llm_error"]


class _Flaky(BaseHTTPRequestHandler):
    """Fault server: 503 for the first two requests, then a completion whose top_logprobs say No."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen += 1
        if self.server.seen <= 2:
            body, code = b'{"error": {"message": "busy"}}', 503
        else:
            tops = [{"token": "No", "logprob": -0.2}, {"token": " Yes", "logprob": -1.9}]
            body, code = json.dumps({"choices": [{"message": {"content": "No"}, "logprobs": {
                "content": [{"token": "No", "logprob": -0.2, "top_logprobs": tops}]}}]}).encode(), 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_retries_after_503_then_decide_by_label_likelihood(tmp_path):
    from mdl_repro.pipeline.data import load

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    srv.seen = 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        judge = LLMJudge(f"http://127.0.0.1:{srv.server_port}/v1", "m", retries=2, backoff=0.01,
                         concurrency=1, cache=tmp_path / "c.sqlite", progress=False)
        v, = judge.judge(["Paris."], [load("halueval")[0]])
        judge.close()
    finally:
        srv.shutdown()
        srv.server_close()
    assert srv.seen == 3 and v.method == "logprobs" and v.hallucinated is False
    assert abs(v.p_yes - 1 / (1 + pow(2.718281828459045, 1.7))) < 1e-6


def test_verdicts_are_never_guessed():
    assert verdict_from_reply("Yes", None).hallucinated is True  # no logprobs: the reply is read
    assert verdict_from_reply("no.", []).method == "parsed"
    v = verdict_from_reply("Maybe", [("Maybe", -0.1), ("Perhaps", -2.0)])
    assert v.hallucinated is None and v.method == "failed" and "neither Yes nor No" in v.error
    # one label among the top tokens: the other is below all of them
    assert verdict_from_reply("", [(" yes", -3.0), ("The", -0.1)]).p_yes == 1.0
