"""The demo's finished alignment experiment: the real experiment code against a scripted judge.

A new user should see the Alignment lab filled without an API key. So the demo runs
`lib.alignment.create_experiment` and `run_experiment` exactly as the CLI does, through `lib.llm`
and the real `openai` client, against the local OpenAI-compatible server of `lib.scripted_llm`,
whose judge is a deterministic *policy* that reads only its prompt:

- with correction history for a metric, it answers that metric's most common reviewed outcome in
  the history (the reviewer's decision when corrected, the AI's when confirmed; the newest wins a
  tie): what the history implies reviewers want;
- without, it answers the middle of the scale (a cautious judge with no context).

So `history`/`full` can only gain through the history the prompt shows, and early evaluations
(little history as of their creation) cannot: the figures show what the lab measures (and that
it does not leak), not what a real model gains. The experiment's judge model is
`DEMO_JUDGE_MODEL`, which the page reads to say so plainly.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine
from sqlmodel import col, select

from lib import alignment
from lib.auth import system_actor
from lib.config import get_settings
from lib.db import session_scope
from lib.demo.inputs import DEMO_AUTHOR
from lib.models import AlignmentExperiment
from lib.scripted_llm import Reply, json_reply, running_llm_server

DEMO_JUDGE_MODEL = alignment.SCRIPTED_JUDGE_PREFIX + "demo history policy"
DEMO_PRODUCT = "acme-support"
DEMO_SAMPLE = 40
DEMO_ARMS = ("bare", "history", "full")
DEMO_NAME = "Demo: scripted judge (not a real model) · bare, history, full"

_ENTRY_RE = re.compile(r"^\d+\. \[(CORRECTED|CONFIRMED|NOT REVIEWED)\] .*?\| metric: ([^|\n]+)", re.M)
_DECISION_RE = re.compile(r"^\s+(AI decision|Reviewer's decision): ([^|\n]+)", re.M)


def _scales(body: dict[str, Any]) -> dict[str, list[float]]:
    """Each metric's allowed scores, from the Stage 1 JSON schema the request carries."""
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or fmt.get("schema") or {}
    metrics = schema["properties"]["independent_scores"]["properties"]
    out = {}
    for slug, spec in metrics.items():
        score = spec["properties"]["score"]
        allowed = [v for v in score.get("enum", []) if v is not None]
        out[slug] = allowed or [score["minimum"], score["maximum"]]
    return out


def _history_outcomes(prompt: str) -> dict[str, list[str]]:
    """Reviewed outcomes per metric in the prompt's correction history, newest first."""
    history = prompt.split("## Correction history for this product", 1)[-1]
    history = history.split("## Cross-session notes", 1)[0]
    outcomes: dict[str, list[str]] = {}
    for block in re.split(r"\n(?=\d+\. \[)", history):
        entry = _ENTRY_RE.search(block)
        if entry is None or entry.group(1) == "NOT REVIEWED":
            continue
        decisions = dict(_DECISION_RE.findall(block))
        outcome = decisions.get("Reviewer's decision") or decisions.get("AI decision")
        if outcome:
            outcomes.setdefault(entry.group(2).strip(), []).append(outcome.strip())
    return outcomes


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def history_policy(body: dict[str, Any]) -> Reply:
    """The demo judge: each metric's most common reviewed outcome in the history, else mid-scale."""
    prompt = "\n".join(str(m.get("content") or "") for m in body["messages"] if m.get("role") == "user")
    outcomes = _history_outcomes(prompt)
    scores: dict[str, Any] = {}
    for slug, allowed in _scales(body).items():
        seen = [n for n in (_number(o) for o in outcomes.get(slug, [])) if n is not None and n in allowed]
        if seen:
            score, why = (
                Counter(seen).most_common(1)[0][0],
                "the score reviewers most often gave in the history",
            )
        else:
            middle = (min(allowed) + max(allowed)) / 2
            score = min(allowed, key=lambda v: (abs(v - middle), v)) if len(allowed) > 2 else middle
            why = "no reviewed history for this metric, so the middle of the scale"
        scores[slug] = {
            "score": int(score) if float(score).is_integer() else score,
            "confidence": 0.5,
            "rationale": f"Scripted demo judge: {why}.",
        }
    return json_reply({"independent_scores": scores, "evidence": {slug: [] for slug in scores}})


def demo_experiment_id(engine: Engine) -> int | None:
    """The demo's experiment, if this database has it (a forced reload does not run it twice)."""
    with session_scope(engine, read_only=True) as session:
        return session.exec(
            select(AlignmentExperiment.id).where(col(AlignmentExperiment.judge_model) == DEMO_JUDGE_MODEL)
        ).first()


def run_demo_experiment(engine: Engine) -> int:
    """Create and run the demo experiment against the scripted judge; returns its id."""
    found = demo_experiment_id(engine)
    if found is not None:
        return found
    with running_llm_server(model_ids=(DEMO_JUDGE_MODEL,)) as server:
        server.responder = history_policy
        settings = replace(
            get_settings(),
            openai_base_url=server.base_url,
            openai_api_key="scripted",
            judge_model=DEMO_JUDGE_MODEL,
            llm_profile="default",
            llm_max_retries=0,
        )
        spec = alignment.ExperimentSpec(
            product=DEMO_PRODUCT,
            sample_size=DEMO_SAMPLE,
            arms=DEMO_ARMS,
            name=DEMO_NAME,
            created_by=system_actor(DEMO_AUTHOR),
        )
        experiment_id = alignment.create_experiment(engine, spec, settings=settings)
        # A few calls in flight overlap the server's and SQLite's waits: about 3x faster here.
        report = alignment.run_experiment(engine, experiment_id, settings=settings, concurrency=4)
    if report.status != "finished":
        raise RuntimeError(f"the demo experiment did not finish: {report}")
    return experiment_id
