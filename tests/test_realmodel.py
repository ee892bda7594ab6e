"""Opt-in tier against a real model server: protocol and robustness, not quality (issue 18).

Skipped unless `OVERRULE_TEST_LLM_URL` names a running OpenAI-compatible server (llama.cpp's
`llama-server`, Ollama, vLLM), or `OVERRULE_TEST_GGUF` names a GGUF file that
`python -m llama_cpp.server` (llama-cpp-python[server]) can serve. CI does not run it:

    OVERRULE_TEST_LLM_URL=http://127.0.0.1:8080/v1 .venv/bin/python -m pytest -m realmodel -n 0 tests/test_realmodel.py

`OVERRULE_TEST_LLM_MODEL` picks the model (default: the server's first). The checks: structured
output is negotiated and the reply is either schema-valid or a clean `LLMError`; streaming ends
with a finish reason; an oversized prompt and an impossible timeout fail with an `LLMError` and
nothing else; and the judge on four lines "fails cleanly or saves valid data".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from lib import judge, llm
from lib.config import Settings, load_settings
from lib.db import session_scope
from lib.metrics import metrics_for_product, upsert_metric_definitions
from lib.models import EvaluationSnapshot

pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(3600)]

PRODUCT = "realmodel"
RUBRIC = [
    {"product": PRODUCT, "slug": "correctness", "display_name": "Correctness", "min": 1, "max": 5,
     "description": "Are the facts right?"},
    {"product": PRODUCT, "slug": "clarity", "display_name": "Clarity", "min": 1, "max": 5,
     "description": "Is it easy to follow?"},
]  # fmt: skip
LINES = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many legs does a spider have?", "Spiders have six legs."),
    ("What is 2 + 2?", "2 + 2 equals 4."),
    ("Who wrote Hamlet?", "Hamlet was written by William Shakespeare around 1600."),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _models(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url.rstrip('/')}/models", timeout=5) as response:  # noqa: S310 (local URL)
        return [m["id"] for m in json.load(response)["data"]]


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """The URL of a real server: the one named, or llama-cpp-python serving the named GGUF file."""
    url = os.environ.get("OVERRULE_TEST_LLM_URL")
    gguf = os.environ.get("OVERRULE_TEST_GGUF")
    if os.environ.get("CI") == "true":
        pytest.skip("CI does not run the real-model tier (minutes per call on a CPU)")
    if url:
        yield url
        return
    if not gguf:
        pytest.skip("set OVERRULE_TEST_LLM_URL or OVERRULE_TEST_GGUF to run the real-model tier")
    pytest.importorskip("llama_cpp.server", reason="OVERRULE_TEST_GGUF needs llama-cpp-python[server]")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--port", str(port), "--n_ctx", "8192"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                _models(url)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("the llama-cpp-python server did not start")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def real(server_url: str) -> Settings:
    """Settings for the real server under the local profile."""
    model = os.environ.get("OVERRULE_TEST_LLM_MODEL") or _models(server_url)[0]
    env = {
        "OPENAI_BASE_URL": server_url,
        "OVERRULE_LLM_PROFILE": "local",
        "OVERRULE_JUDGE_MODEL": model,
        "OVERRULE_EVAL_MODEL": model,
        "OVERRULE_EVALUATOR_MODEL": model,
        "OVERRULE_CONTEXT_TOKENS": os.environ.get("OVERRULE_CONTEXT_TOKENS", "8192"),
    }
    llm.close_clients()
    return load_settings(env, secrets_path=Path("/nonexistent"))


SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


def test_structured_output_is_negotiated_and_the_reply_is_valid_or_a_clean_error(real: Settings) -> None:
    messages = [{"role": "user", "content": "What colour is the sky on a clear day? Answer in JSON."}]
    try:
        reply = llm.chat_json(
            messages, model=real.judge_model, settings=real, schema=SCHEMA, purpose="compare"
        )
    except llm.LLMError as exc:
        assert exc.kind in {"invalid_json", "invalid_reply", "truncated"}, exc
    else:
        assert llm.schema_errors(reply, SCHEMA) == []
    assert llm.json_mode_of(real.judge_model, real) in llm.JSON_MODES


def test_streaming_ends_with_a_finish_reason(real: Settings) -> None:
    deltas = list(
        llm.stream_chat(
            [{"role": "user", "content": "Say hello."}],
            model=real.judge_model,
            settings=real,
            purpose="compare",
        )
    )
    assert "".join(deltas).strip()


def test_a_prompt_larger_than_the_context_fails_with_an_llm_error(real: Settings) -> None:
    huge = [{"role": "user", "content": "word " * 200_000}]
    with pytest.raises(llm.LLMError):
        llm.chat(huge, model=real.judge_model, settings=real, purpose="compare")


def test_an_impossible_timeout_is_a_timeout(real: Settings) -> None:
    hurried = replace(real, llm_timeout=0.001, llm_profile="default")
    with pytest.raises(llm.LLMError) as failure:
        llm.chat([{"role": "user", "content": "Count to 50."}], model=real.judge_model, settings=hurried)
    assert failure.value.kind in {"timeout", "connection"}


def test_the_judge_on_four_lines_fails_cleanly_or_saves_valid_data(
    real: Settings, sqlite_engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with session_scope(sqlite_engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
    batch = tmp_path / "four.jsonl"
    batch.write_text(
        "".join(json.dumps({"question": q, "model_answer": a, "product": PRODUCT}) + "\n" for q, a in LINES)
    )
    started = time.monotonic()
    report = judge.judge_file(batch, engine=sqlite_engine, concurrency=1, settings=real)
    elapsed = time.monotonic() - started
    assert report.judged + len(report.failed) == len(LINES)
    with Session(sqlite_engine) as session:
        specs = {m.slug: m for m in metrics_for_product(session=session, product=PRODUCT)}
        for snap in session.exec(select(EvaluationSnapshot)).all():
            for slug, entry in snap.judge_scores_json.items():
                if entry["score"] is not None:
                    specs[slug].validate(float(entry["score"]))
                    assert judge.weak_text_problem(slug, entry["reason"]) is None
    for _lineno, message in report.failed:
        assert "Nothing was saved." in message
    with capsys.disabled():
        print(f"\nreal model {real.judge_model}: {report.summary()} in {elapsed:.0f} s", file=sys.stderr)
        for lineno, message in report.failed:
            print(f"  line {lineno}: {message}", file=sys.stderr)
