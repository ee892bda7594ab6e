"""Interactions in (seed 003): `import --kind interactions`, the trigger, and `auto-eval` from the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlmodel import Session

from lib import importer, precedents
from lib.__main__ import main
from lib.config import reset_settings
from lib.models import AutoEval, ExpertFeedback, Interaction

CITE = "https://help.acme.test/reset-password"
QUESTION = "How do I reset my password?"
S1 = "Open Settings and choose Reset password."
S2 = "We email you a link that works for one hour."


def _line(**fields: Any) -> dict[str, Any]:
    return {"product": "acme", "question": QUESTION, "answer": f"{S1} {S2}", "citation_url": CITE, **fields}


EXPERT = {
    "sentence_scores": [{"sentence": S1, "score": 80}, {"sentence": S2, "score": None}],
    "citation_score": 20,
    "citation_url": CITE,
    "reviewer": "ayse",
}


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def _import(engine: Engine, path: Path, **kwargs: Any) -> importer.ImportReport:
    return importer.import_path(
        engine=engine, path=path, kind=kwargs.pop("kind", "interactions"), reviewer="tester", **kwargs
    )


def _count(engine: Engine, model: Any) -> int:
    with Session(engine) as session:
        return session.execute(select(func.count()).select_from(model)).scalar_one()


def _corpus(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "interactions.jsonl",
        [
            _line(id="prec", expert=EXPERT, created_at="2026-01-01T10:00:00Z"),
            _line(id="same", created_at="2026-01-02T10:00:00+02:00"),
            _line(question="When are invoices sent?", answer="On the first business day.", language="tr"),
            _line(id="cite", citation_url="https://help.acme.test/other"),
        ],
    )


def test_import_stores_interactions_and_expert_reviews_and_evaluates_the_new_ones(
    engine: Engine, tmp_path: Path
) -> None:
    seen: list[tuple[int, int]] = []
    report = _import(engine, _corpus(tmp_path), progress=lambda d, t: seen.append((d, t)))
    assert (report.inserted, report.skipped, report.expert_reviews) == (4, 0, 1)
    assert report.evaluation.as_dict() == {
        "evaluated": 3,
        "matched": 1,
        "skipped": 0,
        "reasons": {"no_citation_match": 1, "no_qa_match": 1},
    }
    assert seen[-1] == (3, 3)
    assert "interactions: 4 inserted, 0 already present (skipped), 1 expert reviews" in report.summary()
    with Session(engine) as session:
        prec = session.get(Interaction, "prec")
        assert prec is not None and prec.citations == [CITE] and prec.created_at.hour == 10
        same = session.get(Interaction, "same")
        assert same is not None and same.created_at.hour == 8  # +02:00 stored as UTC
        [expert] = session.execute(select(ExpertFeedback).where(ExpertFeedback.type == "expert")).scalars()
        assert (expert.interaction_id, expert.reviewer, expert.citation_score) == ("prec", "ayse", 20)
        assert expert.total_score == precedents.total_score([80, 100], 20)  # a blank score counts 100
        rows = {r.interaction_id: r for r in session.execute(select(AutoEval)).scalars()}
        assert set(rows) == {"same", "cite", next(i for i in rows if i.startswith("int_"))}
        assert rows["same"].has_matches and rows["same"].matched_interaction_id == "prec"
        assert rows["same"].total_score == precedents.total_score([80, 100], 20)
        derived = next(i for i in rows if i.startswith("int_"))
        assert session.get(Interaction, derived).language == "tr"  # type: ignore[union-attr]


def test_reimporting_the_same_file_changes_nothing(engine: Engine, tmp_path: Path) -> None:
    path = _corpus(tmp_path)
    _import(engine, path)
    counts = [_count(engine, m) for m in (Interaction, ExpertFeedback, AutoEval)]
    again = _import(engine, path)
    assert (again.inserted, again.skipped, again.expert_reviews, again.evaluation.evaluated) == (0, 4, 0, 0)
    assert [_count(engine, m) for m in (Interaction, ExpertFeedback, AutoEval)] == counts


def test_duplicate_lines_in_one_file_are_stored_once(engine: Engine, tmp_path: Path) -> None:
    # Without an id, equal content is one interaction; with ids, the id decides (first line wins).
    path = _write(
        tmp_path / "dup.jsonl",
        [_line(), _line(), _line(id="x"), _line(id="x", answer="Other."), _line(id="y")],
    )
    report = _import(engine, path)
    assert (report.inserted, report.skipped) == (3, 2)


def test_an_expert_review_in_a_later_file_turns_a_stored_interaction_into_a_precedent(
    engine: Engine, tmp_path: Path
) -> None:
    _import(engine, _write(tmp_path / "a.jsonl", [_line(id="first")]))
    report = _import(engine, _write(tmp_path / "b.jsonl", [_line(id="first", expert=EXPERT)]))
    assert (report.inserted, report.skipped, report.expert_reviews) == (0, 1, 1)
    again = _import(engine, _write(tmp_path / "c.jsonl", [_line(id="first", expert=EXPERT)]))
    assert again.expert_reviews == 0  # already reviewed: not a second review
    later = _import(engine, _write(tmp_path / "d.jsonl", [_line(id="later")]))
    assert later.evaluation.matched == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: invalid JSON"),
        ([1, 2], "line 2: expected a JSON object, got a list"),
        ({"question": QUESTION, "answer": S1}, "line 2, field 'product': is required"),
        (_line(question=""), "line 2, field 'question': must not be empty"),
        (_line(answer=5), "line 2, field 'answer': must be a string, got a number"),
        (_line(id=""), "line 2, field 'id': must not be empty"),
        (_line(id="x" * 65), "line 2, field 'id': is 65 characters long; at most 64 allowed"),
        (_line(created_at="yesterday"), "line 2, field 'created_at': 'yesterday' is not an ISO 8601 time"),
        (_line(expert=[]), "line 2, field 'expert': must be an object, got a list"),
        (
            _line(expert={"sentence_scores": []}),
            "line 2, field 'expert.sentence_scores': must be a non-empty list",
        ),
        (
            _line(expert={"sentence_scores": [{"sentence": S1, "score": 101}]}),
            "line 2, field 'expert.sentence_scores[0].score': 101 is outside 0–100",
        ),
        (
            _line(expert={"sentence_scores": [{"sentence": S1, "score": "high"}]}),
            "line 2, field 'expert.sentence_scores[0].score': must be a number, got a string",
        ),
        (
            _line(expert={"sentence_scores": [{"score": 50}]}),
            "line 2, field 'expert.sentence_scores[0].sentence': is required",
        ),
        (
            _line(expert={"sentence_scores": [{"sentence": S1, "score": 50}], "citation_score": 30}),
            "line 2, field 'expert.citation_score': 30 is outside 0–25",
        ),
        (_line(answer="bad\x00text"), "line 2, field 'answer': contains a NUL character"),
    ],
)
def test_a_bad_line_refuses_the_whole_file_naming_line_and_field(
    engine: Engine, tmp_path: Path, line: Any, message: str
) -> None:
    path = _write(tmp_path / "bad.jsonl", [_line(id="good", expert=EXPERT), line, _line(id="after")])
    with pytest.raises(importer.ImportFailed) as info:
        _import(engine, path)
    assert f"bad.jsonl {message}" in str(info.value)
    assert str(info.value).endswith("nothing was imported")
    assert [_count(engine, m) for m in (Interaction, ExpertFeedback, AutoEval)] == [0, 0, 0]


def test_the_kind_is_detected_from_the_first_line(engine: Engine, tmp_path: Path) -> None:
    report = _import(engine, _write(tmp_path / "x.jsonl", [_line()]), kind=None)
    assert report.kind == "interactions"


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    """`python -m lib ...` in this process (lib.__main__.main), on the database URL given."""

    def run(*args: str, db: str, **env: str) -> Done:
        monkeypatch.setenv("OVERRULE_DATABASE_URL", db)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        reset_settings()
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return Done(code, out.out, out.err)

    return run


def test_cli_import_evaluates_with_progress_on_stderr_then_auto_eval_redo(
    sqlite_engine: Engine, sqlite_url: str, tmp_path: Path, cli: Callable[..., Done]
) -> None:
    path = _corpus(tmp_path)
    done = cli("import", str(path), "--kind", "interactions", db=sqlite_url, OVERRULE_EVAL_CONCURRENCY="2")
    assert done.returncode == 0, done.stderr
    assert "interactions: 4 inserted" in done.stdout and "auto-evaluated 3: 1 matched" in done.stdout
    assert "3/3" in done.stderr  # the progress bar
    nothing = cli("auto-eval", db=sqlite_url)
    assert nothing.returncode == 0 and "evaluated 0 interactions" in nothing.stdout
    redo = cli("auto-eval", "--redo", "--concurrency", "0", db=sqlite_url)
    assert redo.returncode == 0, redo.stderr
    assert redo.stdout.splitlines() == [
        "deleted 3 earlier auto-evaluations",
        "evaluated 3 interactions: 1 matched, 2 without a match, 0 already evaluated",
        "  no_citation_match: 1",
        "  no_qa_match: 1",
    ]
    forced = cli(
        "auto-eval", "--redo", "--force-fallback", "--product", "acme", "--since", "3650d", db=sqlite_url
    )
    assert "  forced_fallback_no_match: 2" in forced.stdout
    assert _count(sqlite_engine, AutoEval) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "7x"], "auto-eval: --since: invalid age '7x'"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--concurrency", "-1"], "--concurrency must be between 0 (serial) and 64"),
    ],
)
def test_cli_auto_eval_refuses_bad_options(
    sqlite_url: str, args: list[str], message: str, cli: Callable[..., Done]
) -> None:
    done = cli("auto-eval", *args, db=sqlite_url)
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr
