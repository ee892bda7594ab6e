"""The demo data set: realistic, deterministic content for a first look at Overrule (SPEC §6).

Everything is built by code from the hand-written inputs in `data/demo/*.json` (question/answer
templates with the flaws a judge should catch, reason phrases in English and Turkish, notes,
seed-004 judgments, precedent interactions), combined with `random.Random` streams seeded from
`DEMO_SEED`. Times are relative to the fixed anchor in `products.json`, never to "now", so two
databases get identical rows.

How each part is written, so that it looks exactly as if the app had produced it:

- evaluations and their judgments go through the importer (evidence verified as for real files);
- reviews are what `lib.corrections.record_review` writes (confirmed/overruled events, version 2);
- second opinions follow `lib.evaluation_layer`'s rules and `lib.second_opinion`'s storage;
- tag relevance is replayed in memory with `lib.relevance`'s arithmetic and pinning rules (the
  tests check it equals going through the `lib.relevance` API, which is too slow for a first start).

`force`: the demo is normally loaded only into a database without evaluations. With `force=True`
it is loaded anyway, and every demo row is identified by a deterministic key (snapshot id and
source key, change id, note session+time+content, audit session id, interaction id): rows already
present are left untouched, so a forced load never duplicates anything and returns the number of
rows it actually added.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from difflib import SequenceMatcher
from functools import cache
from statistics import mean
from typing import Any

from sqlalchemy import Engine, func, insert, select, text, update
from sqlmodel import Session, col

from lib import relevance
from lib.config import DATA_DIR, get_settings
from lib.corrections import format_score, same_decision
from lib.db import session_scope
from lib.evaluation_layer import EvaluationVerdict, apply_evaluation
from lib.evidence import ANCHOR_LEN, verify_evidence
from lib.importer import import_evaluations, import_metrics, import_notes
from lib.metrics import DEFAULT_METRICS
from lib.models import (
    AutoEval,
    EvaluationSnapshot,
    ExpertFeedback,
    Interaction,
    Judgment,
    JudgmentEvent,
    LessonMatchStat,
    LessonTagRelevance,
    ProcessedRelevanceSession,
    SessionAudit,
    SessionNote,
    TagRelevanceEvent,
    compute_was_corrected,
)
from lib.second_opinion import ACTION as SECOND_OPINION_ACTION

DEMO_DIR = DATA_DIR / "demo"
DEMO_SEED = 20261116
DEMO_AUTHOR = "demo"
DEFAULT_SLUGS = tuple(m.slug for m in DEFAULT_METRICS)
# Target share of each verification stage among evidence items: every stage occurs many times.
STAGE_WEIGHTS = {"exact": 0.34, "substring": 0.22, "anchor": 0.2, "whitespace": 0.12, "unverified": 0.12}
NO_EVIDENCE_SHARE = 0.08  # seed 002 AD-8: some evaluations come without any evidence
QA_THRESHOLD = 0.85
PG_DEMO_LOCK = 7_140_513  # serialises concurrent first starts of several replicas


# ---------------------------------------------------------------------------------------------
# Inputs


@cache
def _read_input(name: str) -> Any:
    """One demo input file, parsed once per process (the inputs never change at run time)."""
    return json.loads((DEMO_DIR / name).read_text(encoding="utf-8"))


def _inputs(name: str) -> Any:
    # A deep copy, so no caller can mutate the cached inputs.
    return json.loads(json.dumps(_read_input(name)))


def demo_anchor() -> datetime:
    """The fixed moment the demo's history ends (all demo times lie before it)."""
    return datetime.fromisoformat(_read_input("products.json")["anchor"])


def _rng(seed: int, stream: str) -> random.Random:
    """An independent random stream per part, so changing one part never reshuffles another."""
    return random.Random(f"{seed}:{stream}")


def _fmt(value: float) -> str:
    """A score as decision text: what the importer writes for the judge and `record_review` for reviewers."""
    return format_score(value)


def _short_model(name: str) -> str:
    return name.rsplit("/", 1)[-1]


# ---------------------------------------------------------------------------------------------
# Evaluations


@dataclass
class EvaluationTruth:
    """What the demo knows about one evaluation beyond its record: the scores a careful reviewer
    would give and the flaws the judge missed, used to plan realistic reviews."""

    snapshot_id: str
    product: str
    language: str
    created_at: datetime
    truth: dict[str, float]
    judge: dict[str, float]
    missed: dict[str, str] = field(default_factory=dict)  # metric -> feedback of a flaw the judge missed


@dataclass
class DemoEvaluations:
    """Evaluation records for the importer, the rubric they need, and the truth behind them."""

    records: list[dict[str, Any]]
    metric_definitions: list[dict[str, Any]]
    truths: dict[str, EvaluationTruth]


@dataclass
class _Scale:
    slug: str
    lo: float
    hi: float
    integer: bool

    def clamp(self, value: float) -> float:
        value = min(self.hi, max(self.lo, value))
        return float(round(value)) if self.integer else round(round(value * 20) / 20, 2)

    def step(self) -> float:
        return 1.0 if self.integer else 0.2

    def is_good(self, value: float) -> bool:
        """A score in the upper part of the scale, where a judge cites strengths rather than flaws."""
        return value >= self.hi - (
            1 if self.integer and self.hi - self.lo > 2 else 0 if self.integer else 0.15
        )


def _scales(product: Mapping[str, Any]) -> list[_Scale]:
    rubric = product.get("rubric")
    if not rubric:
        return [_Scale(m.slug, m.min_value, m.max_value, m.integer_scale) for m in DEFAULT_METRICS]
    return [
        _Scale(m["slug"], float(m["min"]), float(m["max"]), bool(m.get("integer_scale", True)))
        for m in rubric
    ]


def _apply_flaws(template: Mapping[str, Any], flaws: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The template's paragraphs with the flaws written in, or None when two flaws collide."""
    paras = list(template["paragraphs"])
    for flaw in flaws:
        op = flaw["op"]
        if op == "replace":
            hit = next((i for i, p in enumerate(paras) if flaw["find"] in p), None)
            if hit is None:
                return None
            paras[hit] = paras[hit].replace(flaw["find"], flaw["replace"], 1)
        elif op == "append":
            idx = flaw["para"] if flaw["para"] >= 0 else len(paras) + flaw["para"]
            paras[idx] = f"{paras[idx]} {flaw['text']}"
        elif op == "insert":
            paras.insert(min(flaw["at"], len(paras)), flaw["text"])
        elif op == "recap":
            paras.append(f"{flaw['lead']} {template['recap']}")
        else:  # pragma: no cover - a malformed input file is a programming error
            raise ValueError(f"unknown flaw op {op!r}")
    return paras


def flaw_quote(template: Mapping[str, Any], flaw: Mapping[str, Any]) -> str:
    """The verbatim span of the answer that shows a flaw (what a careful judge would quote)."""
    if flaw.get("quote"):
        return flaw["quote"]
    if flaw["op"] == "replace":
        return flaw["replace"]
    if flaw["op"] == "recap":
        return flaw["lead"] if flaw.get("quote_lead_only") else f"{flaw['lead']} {template['recap']}"
    return flaw["text"]


def _swap_case(text_: str) -> str:
    return text_[:1].swapcase() + text_[1:]


_PARAPHRASES = (
    (" the ", " this "),
    (" and ", " & "),
    (" is ", " was "),
    (" ve ", " ile "),
    (" bir ", " tek "),
)


def _misquote(quote: str) -> str:
    """A judge's paraphrase of a quote: one word changed and the first letter's case flipped."""
    for old, new in _PARAPHRASES:
        if old in quote:
            quote = quote.replace(old, new, 1)
            break
    return _swap_case(quote)


def _elide_middle(quote: str, rng: random.Random) -> str | None:
    """The quote with part of its middle dropped, as judges shorten long quotes; head and tail kept."""
    if len(quote) < 2 * ANCHOR_LEN:
        return None
    spaces = [i for i, ch in enumerate(quote) if ch == " " and ANCHOR_LEN < i < len(quote) - ANCHOR_LEN - 1]
    if len(quote) >= 90 and len(spaces) >= 3:
        a, b = sorted(rng.sample(spaces, 2))
        if b - a >= 8:
            return quote[:a] + " ... " + quote[b + 1 :]
    # Drop a single middle word (the space before it goes with it).
    for _ in range(len(spaces)):
        if len(spaces) < 2:
            break
        i = rng.randrange(len(spaces) - 1)
        a, b = spaces[i], spaces[i + 1]
        candidate = quote[:a] + quote[b:]
        if len(candidate) >= 2 * ANCHOR_LEN:
            return candidate
    return None


def _rewrap(quote: str, rng: random.Random) -> str | None:
    """The quote as a judge re-wrapped it: line breaks collapsed or a break added near the start."""
    if "\n" in quote:
        collapsed = " ".join(quote.split())
        if collapsed != quote:
            return collapsed
    # A break inside the first 25 characters defeats the anchor stage, so only stage 4 can match.
    spaces = [i for i, ch in enumerate(quote[: ANCHOR_LEN - 1]) if ch == " " and i > 0]
    if not spaces:
        return None
    i = rng.choice(spaces)
    return quote[:i] + rng.choice(["\n", "  ", "\n  "]) + quote[i + 1 :]


def _place_evidence(
    answer: str, item: dict[str, Any], target: str, rng: random.Random, misquote: str | None
) -> dict[str, Any]:
    """The item with the quote and positions a judge might have sent so that it lands in `target`.

    Falls back to a stage that is possible for this quote (anchor needs 50+ characters, etc.).
    """
    quote = item["quote"]
    start = answer.find(quote)
    assert start >= 0, f"demo evidence quote not in its answer: {quote!r}"
    for stage in (target, "substring", "exact"):
        q, s, e = quote, start, start + len(quote)
        if stage == "substring":
            roll = rng.random()
            if roll < 0.55 or start == 0:
                s = max(0, start + rng.choice([-1, 1]) * rng.randint(3, 60))
                e = s + len(quote)
            elif roll < 0.8:
                s, e = 0, len(quote)
            else:
                s = e = None
        elif stage == "anchor":
            elided = _elide_middle(quote, rng)
            if elided is None:
                continue
            q, e = elided, start + len(elided)
        elif stage == "whitespace":
            wrapped = _rewrap(quote, rng)
            if wrapped is None:
                continue
            q, e = wrapped, start + len(wrapped)
        elif stage == "unverified":
            q = misquote or _misquote(quote)
            e = start + len(q)
        if verify_evidence(answer, q, s, e).stage == stage:
            return {**item, "quote": q, "start": s, "end": e}
    raise AssertionError(f"exact placement failed for {quote!r}")  # pragma: no cover


def _choose(rng: random.Random, options: Sequence[Any]) -> Any:
    return options[rng.randrange(len(options))]


def _weighted(rng: random.Random, models: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    return rng.choices(list(models), weights=[m["weight"] for m in models])[0]


def _band(scale: _Scale, value: float) -> str:
    """The phrase band of a score: high, mid or low on its own scale."""
    frac = (value - scale.lo) / (scale.hi - scale.lo)
    return "high" if frac >= 0.74 else "mid" if frac >= 0.45 else "low"


def _judge_reason(
    phrases: Mapping[str, Any],
    product: Mapping[str, Any],
    template: Mapping[str, Any],
    scale: _Scale,
    score: float,
    rng: random.Random,
) -> str:
    """A generic judge rationale for a metric that no (noticed) flaw touches."""
    if product.get("rubric"):
        pool = phrases["rag_judge"][scale.slug]
        key = ("3" if score >= 3 else "2") if scale.integer else ("high" if score >= 0.85 else "mid")
        sources = template.get("sources") or ["the retrieved passage", "the second passage"]
        return _choose(rng, pool[key]).format(s1=sources[0], s2=sources[-1])
    pool = phrases["judge"][product["language"]][scale.slug]
    return _choose(rng, pool[str(int(min(5, max(3, score))))])


def _user_scores_rag(scale: _Scale, truth: float, rng: random.Random, annotators: int) -> float:
    """The mean of several annotators' scores, as real RAG data sets report them (e.g. 2.67)."""
    votes = []
    for _ in range(annotators):
        if scale.integer:
            vote = truth + (rng.choice([-1, 1]) if rng.random() < 0.3 else 0)
        else:  # groundedness annotators answer on a coarse 0 / 0.5 / 1 grid
            vote = round((truth + rng.uniform(-0.3, 0.3)) * 2) / 2
        votes.append(min(scale.hi, max(scale.lo, vote)))
    return round(mean(votes), 2)


def _overall_feedback(
    phrases: Mapping[str, Any], language: str, quality: float, issues: list[str], rng: random.Random
) -> str:
    pool = phrases["overall"][language]
    band = "good" if quality >= 0.85 else "mixed" if quality >= 0.6 else "poor"
    parts = [_choose(rng, pool[band])]
    if issues:
        parts.append(pool["issues"].format(issues="; ".join(issues)))
    else:
        parts.append(_choose(rng, pool["none"]))
    if band != "good":
        parts.append(_choose(rng, pool["tips"]))
    return " ".join(parts)


def _created_times(rng: random.Random, count: int, anchor: datetime, span_days: int) -> list[datetime]:
    """Working-hour timestamps spread over the span, a little denser in recent weeks."""
    times = []
    for _ in range(count):
        age = span_days * (1 - rng.random() ** 0.85)
        moment = anchor - timedelta(days=age)
        moment = moment.replace(
            hour=rng.randint(8, 18), minute=rng.randint(0, 59), second=rng.randint(0, 59), microsecond=0
        )
        if moment >= anchor:
            moment -= timedelta(days=1)
        times.append(moment)
    return times


@dataclass
class _Draft:
    """One evaluation while it is built: the answer, the flaws in it, and every side's scores."""

    template: Mapping[str, Any]
    model: str
    flaws: list[Mapping[str, Any]]
    answer: str
    seen_flaws: list[Mapping[str, Any]] = field(default_factory=list)  # what the judge noticed
    missed_flaws: list[Mapping[str, Any]] = field(default_factory=list)
    base: dict[str, float] = field(default_factory=dict)  # the score without any flaw
    truth: dict[str, float] = field(default_factory=dict)  # what a careful reviewer gives
    judge: dict[str, float] = field(default_factory=dict)
    user: dict[str, float] = field(default_factory=dict)  # the annotator who scored the answer
    judge_null: set[str] = field(default_factory=set)
    user_null: set[str] = field(default_factory=set)

    def touched(self) -> set[str]:
        return {slug for f in self.flaws for slug in f["scores"]}


def _draft_answer(
    rng: random.Random, product: Mapping[str, Any], template: Mapping[str, Any], seen: set[tuple[str, str]]
) -> _Draft:
    """A model's answer to the template with the flaws it happened to make; never a repeat."""
    for _attempt in range(40):
        model = _weighted(rng, product["models"])
        flaws: list[Mapping[str, Any]] = []
        if rng.random() < model["flaw_rate"]:
            k = 2 if rng.random() < 0.25 and len(template["flaws"]) > 1 else 1
            flaws = rng.sample(template["flaws"], k)
        if product["generic_flaws"] and rng.random() < 0.22:
            flaws.append(_choose(rng, product["generic_flaws"]))
        paras = _apply_flaws(template, flaws)
        if paras is None:
            continue
        intro, outro = _choose(rng, product["intros"]), _choose(rng, product["outros"])
        answer = "\n\n".join(([intro] if intro else []) + paras + ([outro] if outro else []))
        if all(flaw_quote(template, f) in answer for f in flaws) and (answer, model["name"]) not in seen:
            seen.add((answer, model["name"]))
            return _Draft(template=template, model=model["name"], flaws=flaws, answer=answer)
    raise RuntimeError(f"cannot vary template {template['key']!r} enough")  # pragma: no cover


def _capped(flaws: Iterable[Mapping[str, Any]], slug: str, start: float) -> float:
    """A score lowered to the worst cap any of the flaws puts on that metric."""
    value = start
    for f in flaws:
        if slug in f["scores"]:
            value = min(value, float(f["scores"][slug]))
    return value


def _score(
    draft: _Draft, rng: random.Random, product: Mapping[str, Any], scales: Sequence[_Scale], p_dev: float
) -> None:
    """Truth from the flaws; a judge that misses flaws and drifts at rate `p_dev`; a noisy annotator."""
    draft.base = {
        s.slug: (
            float(rng.choices([5, 4], [0.62, 0.38])[0])
            if s.integer and s.hi == 5
            else s.hi
            if s.integer
            else _choose(rng, [1.0, 1.0, 0.95, 0.9, 0.85])
        )
        for s in scales
    }
    draft.missed_flaws = [f for f in draft.flaws if rng.random() < p_dev * 0.7]
    draft.seen_flaws = [f for f in draft.flaws if f not in draft.missed_flaws]
    draft.truth = {s: _capped(draft.flaws, s, v) for s, v in draft.base.items()}
    draft.judge = {s: _capped(draft.seen_flaws, s, v) for s, v in draft.base.items()}
    bullets = "\n1." in draft.answer or "\n- " in draft.answer
    for s in scales:
        chance = p_dev * (1.2 if s.slug == "clarity" and bullets else 0.7)
        if rng.random() < chance:
            # Judges lean lenient (and over-score bulleted answers for clarity), sometimes harsh.
            lenient = rng.random() < (0.85 if s.slug == "clarity" and bullets else 0.65)
            size = s.step() * (1 if s.integer else rng.choice([1, 1.5]))
            draft.judge[s.slug] = s.clamp(draft.judge[s.slug] + (size if lenient else -size))
    if product.get("rubric"):
        draft.user = {
            s.slug: _user_scores_rag(s, draft.truth[s.slug], rng, product["annotators"]) for s in scales
        }
        return
    for s in scales:
        value = draft.truth[s.slug]
        if value <= 2 and rng.random() < 0.15:
            value = draft.base[s.slug]  # the annotator missed the flaw too
        elif rng.random() < 0.28:
            value = s.clamp(value + rng.choice([-1, 1]))
        draft.user[s.slug] = value


def _leave_some_unscored(draft: _Draft, rng: random.Random, product: Mapping[str, Any]) -> None:
    """Null scores where real data has them: metrics that do not apply, or an annotator who skipped."""
    focus = {draft.template["primary"], *draft.template["bonus"]}
    if product.get("rubric"):
        if rng.random() < 0.05:
            draft.user_null.add("coherence")
        return
    touched = draft.touched()
    for slug, p in (("bias", 0.3), ("safety", 0.1), ("robustness", 0.06)):
        if slug not in touched and slug not in focus and rng.random() < p:
            draft.judge_null.add(slug)
    for slug, p in (("robustness", 0.1), ("efficiency", 0.05), ("bias", 0.08)):
        if slug not in focus and rng.random() < p:
            draft.user_null.add(slug)


def _score_entries(
    draft: _Draft,
    rng: random.Random,
    product: Mapping[str, Any],
    scales: Sequence[_Scale],
    phrases: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """judge_scores and user_scores as `{slug: {"score", "reason"}}`, reasons matching the scores."""
    language = product["language"]
    judge_reasons: dict[str, str] = {}
    for s in scales:
        own = [f["reason"] for f in draft.seen_flaws if f["metric"] == s.slug]
        side = [
            phrases["secondary"][language].format(feedback=f["feedback"])
            for f in draft.seen_flaws
            if f["metric"] != s.slug and s.slug in f["scores"]
        ]
        judge_reasons[s.slug] = " ".join(own + side) or _judge_reason(
            phrases, product, draft.template, s, draft.judge[s.slug], rng
        )
    user_reasons: dict[str, str] = {}
    for s in scales:
        noticed = [
            f["user_reason"]
            for f in draft.flaws
            if f["metric"] == s.slug and draft.user[s.slug] <= draft.truth[s.slug]
        ]
        pool = phrases["user"][language]
        user_reasons[s.slug] = noticed[0] if noticed else _choose(rng, pool[_band(s, draft.user[s.slug])])
    nulls = phrases["null_reasons"][language]
    judge_scores = {
        s.slug: {"score": None, "reason": nulls["judge"][s.slug]}
        if s.slug in draft.judge_null
        else {"score": _num(draft.judge[s.slug]), "reason": judge_reasons[s.slug]}
        for s in scales
    }
    user_scores = {
        s.slug: {"score": None, "reason": nulls["user"]}
        if s.slug in draft.user_null
        else {"score": _num(draft.user[s.slug]), "reason": user_reasons[s.slug]}
        for s in scales
    }
    return judge_scores, user_scores


def _stage(rng: random.Random) -> str:
    return rng.choices(list(STAGE_WEIGHTS), weights=list(STAGE_WEIGHTS.values()))[0]


def _evidence(
    draft: _Draft, rng: random.Random, scales: Sequence[_Scale], phrases: Mapping[str, Any], language: str
) -> dict[str, list[dict[str, Any]]]:
    """What the judge cited (the flaws it noticed, some strengths) and how imprecisely it cited it."""
    evidence: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if rng.random() < NO_EVIDENCE_SHARE:
        return {}
    template, answer = draft.template, draft.answer
    for f in draft.seen_flaws:
        item = {"quote": flaw_quote(template, f), "why": f["why"], "better": f["better"]}
        evidence[f["metric"]].append(_place_evidence(answer, item, _stage(rng), rng, f.get("misquote")))
        for slug in f["scores"]:
            # Judges often cite the same sentence again for a second metric it hurts.
            if slug != f["metric"] and slug not in draft.judge_null and rng.random() < 0.3:
                side = {**item, "why": phrases["secondary"][language].format(feedback=f["feedback"])}
                evidence[slug].append(_place_evidence(answer, side, _stage(rng), rng, None))
    by_slug = {s.slug: s for s in scales}
    touched = draft.touched()
    for strength in template["strengths"]:
        slug = strength["metric"]
        if (
            slug in draft.judge_null
            or slug in touched
            or strength["quote"] not in answer
            or not by_slug[slug].is_good(draft.judge[slug])
            or rng.random() < 0.15
        ):
            continue
        item = {
            "quote": strength["quote"],
            "why": strength["why"],
            "better": phrases["strength_better"][language],
        }
        evidence[slug].append(_place_evidence(answer, item, _stage(rng), rng, None))
    return dict(evidence)


def _build_product(
    product: Mapping[str, Any],
    phrases: Mapping[str, Any],
    config: Mapping[str, Any],
    seed: int,
    used_ids: set[str],
) -> tuple[list[dict[str, Any]], list[EvaluationTruth]]:
    """One product's evaluations: every template in turn, answered by weighted models over the span."""
    rng = _rng(seed, f"evaluations:{product['name']}")
    anchor, span_days = demo_anchor(), config["span_days"]
    templates = _inputs(product["templates"])
    scales = _scales(product)
    language = product["language"]
    records: list[dict[str, Any]] = []
    truths: list[EvaluationTruth] = []
    seen: set[tuple[str, str]] = set()
    order = list(range(len(templates)))
    for n, created in enumerate(_created_times(rng, product["evaluations"], anchor, span_days)):
        if n % len(order) == 0:
            rng.shuffle(order)
        draft = _draft_answer(rng, product, templates[order[n % len(order)]], seen)
        age_share = (anchor - created).total_seconds() / (span_days * 86400)
        # The judge improves as corrections feed back into its prompt: older runs err more often.
        _score(draft, rng, product, scales, p_dev=0.08 + 0.42 * age_share)
        _leave_some_unscored(draft, rng, product)
        judge_scores, user_scores = _score_entries(draft, rng, product, scales, phrases)
        evidence = _evidence(draft, rng, scales, phrases, language)
        quality = mean(
            (draft.judge[s.slug] - s.lo) / (s.hi - s.lo) for s in scales if s.slug not in draft.judge_null
        )
        feedback = _overall_feedback(
            phrases, language, quality, [f["feedback"] for f in draft.seen_flaws], rng
        )

        snapshot_id = f"snap_{created:%Y%m%d_%H%M%S}_{rng.getrandbits(32):08x}"
        assert snapshot_id not in used_ids
        used_ids.add(snapshot_id)
        template = draft.template
        record: dict[str, Any] = {
            "id": snapshot_id,
            "created_at": created.isoformat(),
            "question_id": f"{product['name']}:{template['key']}",
            "question": template["question"],
            "model_answer": draft.answer,
            "product": product["name"],
            "language": language,
            "category": template["category"],
            "model_name": draft.model,
            "judge_model": config["judge_model"],
            "primary_metric": template["primary"],
            "bonus_metrics": list(template["bonus"]),
            "user_scores": user_scores,
            "judge_scores": judge_scores,
            "overall_feedback": feedback,
        }
        if evidence:
            record["evidence"] = evidence
        records.append(record)
        missed: dict[str, str] = {}
        for f in draft.missed_flaws:
            for slug in f["scores"]:
                if draft.truth[slug] < draft.judge[slug]:
                    missed.setdefault(slug, f["feedback"])
        scored = [s.slug for s in scales if s.slug not in draft.judge_null]
        truths.append(
            EvaluationTruth(
                snapshot_id=snapshot_id,
                product=product["name"],
                language=language,
                created_at=created,
                truth={s: draft.truth[s] for s in scored},
                judge={s: draft.judge[s] for s in scored},
                missed=missed,
            )
        )
    return records, truths


def _num(value: float) -> int | float:
    """Whole scores as ints (as a judge writes them), others as floats."""
    return int(value) if float(value).is_integer() else value


def build_evaluations(seed: int = DEMO_SEED) -> DemoEvaluations:
    """The demo evaluation records (importer format), the custom rubric, and the truth behind them."""
    config = _read_input("products.json")
    phrases = _read_input("phrases.json")
    records: list[dict[str, Any]] = []
    truths: dict[str, EvaluationTruth] = {}
    definitions: list[dict[str, Any]] = []
    used_ids: set[str] = set()
    for product in config["products"]:
        for position, metric in enumerate(product.get("rubric") or []):
            definitions.append({"product": product["name"], "position": position, **metric})
        recs, product_truths = _build_product(product, phrases, config, seed, used_ids)
        records.extend(recs)
        truths.update({t.snapshot_id: t for t in product_truths})
    records.sort(key=lambda r: (r["created_at"], r["id"]))
    return DemoEvaluations(records=records, metric_definitions=definitions, truths=truths)


# ---------------------------------------------------------------------------------------------
# Reviews of the evaluations' judgments


@dataclass(frozen=True)
class PlannedReview:
    """A reviewer's verdict on one judgment, decided from the evaluation's truth."""

    change_id: str
    reviewer: str
    user_decision: str
    reason: str | None
    reviewed_at: datetime


def _reviewer_language(reviewer: str, language: str, config: Mapping[str, Any]) -> str:
    return language if language in config["reviewer_languages"][reviewer] else "en"


def _review_chance(age: timedelta) -> float:
    """Reviewers work through the queue oldest first, so older evaluations are mostly reviewed."""
    for days, chance in ((21, 0.75), (7, 0.55), (2, 0.3)):
        if age > timedelta(days=days):
            return chance
    return 0.1


def plan_reviews(evaluations: DemoEvaluations, seed: int = DEMO_SEED) -> list[PlannedReview]:
    """Which judgments reviewers confirmed or overruled: older evaluations are mostly reviewed."""
    config = _read_input("products.json")
    phrases = _read_input("phrases.json")
    anchor = demo_anchor()
    rng = _rng(seed, "reviews")
    scales = {p["name"]: {s.slug: s for s in _scales(p)} for p in config["products"]}
    plan: list[PlannedReview] = []
    for snapshot_id in sorted(evaluations.truths):
        t = evaluations.truths[snapshot_id]
        p_review = _review_chance(anchor - t.created_at)
        if rng.random() >= p_review:
            continue
        reviewer = _choose(rng, config["reviewers"][t.product])
        lang = _reviewer_language(reviewer, t.language, config)
        metrics = sorted(t.judge)
        if rng.random() < 0.15:  # a review interrupted half-way
            metrics = sorted(rng.sample(metrics, max(1, len(metrics) // 2)))
        # Reviews happen within four days, and (one metric every few minutes) before the anchor.
        room = max(0.0, (anchor - t.created_at).total_seconds() - 3600)
        at = t.created_at + timedelta(seconds=rng.uniform(0.2, 0.9) * min(room, 4 * 86400) + 60)
        for slug in metrics:
            scale = scales[t.product][slug]
            judge, truth = t.judge[slug], t.truth[slug]
            verdict = truth
            if rng.random() < 0.14:
                verdict = scale.clamp(truth + rng.choice([-1, 1]) * scale.step())
            if not scale.integer and abs(verdict - judge) <= 0.1:
                verdict = judge  # on a continuous scale reviewers let small differences pass
            decision = _fmt(judge)
            if verdict == judge:
                reason = _choose(rng, phrases["confirm"][lang]) if rng.random() < 0.3 else None
                plan.append(PlannedReview(f"{snapshot_id}:{slug}", reviewer, decision, reason, at))
            else:
                corrections = phrases["corrections"][lang]
                if slug in t.missed and verdict < judge:
                    reason = _choose(rng, phrases["missed"][lang]).format(feedback=t.missed[slug])
                else:
                    direction = "too_high" if verdict < judge else "too_low"
                    pool = corrections[direction].get(slug) or phrases["corrections"]["en"][direction][slug]
                    reason = _choose(rng, pool)
                plan.append(PlannedReview(f"{snapshot_id}:{slug}", reviewer, _fmt(verdict), reason, at))
            at += timedelta(seconds=rng.randint(20, 240))
    return plan


def _apply_reviews(session: Session, plan: Sequence[PlannedReview]) -> int:
    """Write planned reviews onto judgments nobody has reviewed yet; one audit event each."""
    by_change = {p.change_id: p for p in plan}
    rows = []
    ids = list(by_change)
    for i in range(0, len(ids), 500):
        rows.extend(
            session.execute(
                select(Judgment.id, Judgment.change_id, Judgment.decision, Judgment.version).where(
                    col(Judgment.change_id).in_(ids[i : i + 500]), col(Judgment.reviewed_at).is_(None)
                )
            ).all()
        )
    updates, events = [], []
    for judgment_id, change_id, decision, version in sorted(rows, key=lambda r: r[1]):
        p = by_change[change_id]
        # As record_review does: a confirmation stores the judge's exact text.
        user_decision = decision if same_decision(decision, p.user_decision) else p.user_decision
        corrected = compute_was_corrected(decision, user_decision)
        updates.append(
            {
                "id": judgment_id,
                "user_decision": user_decision,
                "user_reasoning": p.reason,
                "reviewer": p.reviewer,
                "reviewed_at": p.reviewed_at,
                "version": version + 1,
                "was_corrected": corrected,
            }
        )
        events.append(
            {
                "judgment_id": judgment_id,
                "change_id": change_id,
                "action": "overruled" if corrected else "confirmed",
                "reviewer": p.reviewer,
                "at": p.reviewed_at,
                "from_decision": decision,
                "to_decision": user_decision,
                "reason": p.reason,
                "version": version + 1,
            }
        )
    if updates:
        session.execute(update(Judgment), updates)
        session.execute(insert(JudgmentEvent), events)
    return len(updates)


# ---------------------------------------------------------------------------------------------
# Seed-004 judgments (product "Acme Fungear")


def build_cache_judgments(seed: int = DEMO_SEED) -> list[dict[str, Any]]:
    """Judgment rows in the seed-004 shape (INCLUDE/EXCLUDE/UNCERTAIN), some reviewed or corrected."""
    config = _read_input("products.json")
    anchor = demo_anchor()
    rng = _rng(seed, "cache-judgments")
    rows = []
    entries = _inputs("fungear_judgments.json")
    for i, entry in enumerate(entries):
        # Monthly report runs: entries spread over the span in the order the PRs were merged.
        age = config["span_days"] * (1 - (i + rng.random()) / (len(entries) + 1))
        stamp = (anchor - timedelta(days=age)).replace(microsecond=0)
        number = entry["change_id"].rsplit("#", 1)[-1].rsplit("!", 1)[-1]
        repo = entry["change_id"].split("#")[0].split("!")[0]
        kind = "pull" if "#" in entry["change_id"] else "merge_requests"
        row: dict[str, Any] = {
            "change_id": entry["change_id"],
            "product": "Acme Fungear",
            "metric": None,
            "snapshot_id": None,
            "decision": entry["decision"],
            "confidence": entry["confidence"],
            "reasoning": entry["reasoning"],
            "timestamp": stamp,
            "version": 1,
            "was_corrected": False,
            "url": f"https://{repo}/{'-/' if kind == 'merge_requests' else ''}{kind}/{number}",
            "description": entry["description"],
            "ai_provider": "openai" if rng.random() < 0.8 else "gemini",
            "judge_model": "gpt-4o",
            "user_decision": None,
            "user_reasoning": None,
            "reviewer": None,
            "reviewed_at": None,
        }
        review = entry.get("review")
        if review is not None:
            room = min((anchor - stamp).total_seconds() * 0.9, 6 * 86400)
            row.update(
                user_decision=review["decision"],
                user_reasoning=review["reason"],
                reviewer=_choose(rng, config["reviewers"]["Acme Fungear"]),
                reviewed_at=stamp + timedelta(seconds=rng.uniform(0.1, 1.0) * room),
                version=2,
                was_corrected=compute_was_corrected(entry["decision"], review["decision"]),
            )
        if entry.get("second_opinion"):
            row.update(_second_opinion(entry, row, config, rng))
        rows.append(row)
    return rows


def _second_opinion(
    entry: Mapping[str, Any], row: Mapping[str, Any], config: Mapping[str, Any], rng: random.Random
) -> dict[str, Any]:
    """The seed-000 evaluation layer's verdict on a judgment, as lib.second_opinion stores it.

    Asked for by a reviewer shortly after the judgment and before any review (`_opinion_by` names
    who asked; it is the event's reviewer, not a column).
    """
    op = entry["second_opinion"]
    verdict = EvaluationVerdict(
        valid=op["valid"],
        improved_code=op["improved"],
        improved_confidence=op["improved_confidence"],
        improved_reasoning=op["improved_reasoning"],
        evaluation=op["evaluation"],
    )
    decision, confidence, action = apply_evaluation(entry["decision"], entry["confidence"], verdict)
    text = op["evaluation"]
    if op["improved"] and op["improved_reasoning"]:
        text += f"\n\nImproved decision {op['improved']}: {op['improved_reasoning']}"
    stamp: datetime = row["timestamp"]
    window = (row["reviewed_at"] - stamp) / 2 if row["reviewed_at"] else timedelta(hours=2)
    return {
        "second_opinion_action": action,
        "second_opinion_valid": op["valid"],
        "second_opinion_decision": decision,
        "second_opinion_confidence": confidence,
        "second_opinion_text": text,
        "second_opinion_model": config["eval_model"],
        "second_opinion_at": stamp + min(window, timedelta(minutes=rng.randint(5, 40))),
        "_opinion_by": _choose(rng, config["reviewers"]["Acme Fungear"]),
    }


def _write_cache_judgments(session: Session, rows: list[dict[str, Any]]) -> tuple[int, int]:
    stored = set(
        session.execute(
            select(Judgment.change_id).where(col(Judgment.change_id).in_([r["change_id"] for r in rows]))
        ).scalars()
    )
    fresh = [r for r in rows if r["change_id"] not in stored]
    if not fresh:
        return 0, 0
    columns = set(Judgment.model_fields)
    session.execute(insert(Judgment), [{k: v for k, v in r.items() if k in columns} for r in fresh])
    ids = dict(
        session.execute(
            select(Judgment.change_id, Judgment.id).where(
                col(Judgment.change_id).in_([r["change_id"] for r in fresh])
            )
        ).all()
    )
    events = [
        {
            "judgment_id": ids[r["change_id"]],
            "change_id": r["change_id"],
            "action": "overruled" if r["was_corrected"] else "confirmed",
            "reviewer": r["reviewer"],
            "at": r["reviewed_at"],
            "from_decision": r["decision"],
            "to_decision": r["user_decision"],
            "reason": r["user_reasoning"],
            "version": 2,
        }
        for r in fresh
        if r["reviewed_at"] is not None
    ]
    opinions = [
        {
            "judgment_id": ids[r["change_id"]],
            "change_id": r["change_id"],
            "action": SECOND_OPINION_ACTION,
            "reviewer": r["_opinion_by"],
            "at": r["second_opinion_at"],
            "from_decision": r["decision"],
            "to_decision": r["second_opinion_decision"],
            "reason": f"{r['second_opinion_action']} by {r['second_opinion_model']}: {r['second_opinion_text']}",
            "version": 1,
        }
        for r in fresh
        if r.get("second_opinion_action")
    ]
    if events or opinions:
        session.execute(insert(JudgmentEvent), opinions + events)
    return len(fresh), len(events)


# ---------------------------------------------------------------------------------------------
# Notes, session audits and tag relevance (seeds 000 and 001)


@dataclass
class DemoSession:
    """One judge run: its seed-000 session id, context, and when it ran."""

    session_id: str
    started: datetime
    language: str
    product: str
    metric: str
    model: str


@dataclass
class DemoNotes:
    """Note records (importer format) with their relevance profiles, and the judge-run sessions."""

    records: list[dict[str, Any]]
    profiles: list[dict[str, Any]]  # helps / hurts / pinned per record, same order
    sessions: list[DemoSession]


_SESSION_PRODUCTS = {"tr": ["mentor-tr"], "en": ["acme-support", "docsearch-rag"], "es": ["acme-support"]}
# Languages of the twelve note-writing sessions, oldest first (seed 000 runs are per language).
_NOTE_SESSION_LANGUAGES = ["en", "tr", "en", "es", "tr", "en", "tr", "en", "es", "tr", "en", "en"]
_EXTRA_RUN_LANGUAGES = ["en", "tr", "en", "tr", "en", "en", "tr", "en", "es", "tr"]


def _session_id(moment: datetime, rng: random.Random) -> str:
    """Seed 000: `YYYYMMDD_HHMMSS_PID_RANDOM`."""
    return f"{moment:%Y%m%d_%H%M%S}_{rng.randint(1200, 64000)}_{rng.randint(100, 999)}"


def build_notes(seed: int = DEMO_SEED) -> DemoNotes:
    """90 notes of all five types over twelve sessions, plus the other judge runs of the period."""
    config = _read_input("products.json")
    anchor = demo_anchor()
    span = config["span_days"]
    rng = _rng(seed, "notes")
    products = {p["name"]: p for p in config["products"]}

    def make_session(started: datetime, language: str) -> DemoSession:
        product = products[_choose(rng, _SESSION_PRODUCTS[language])]
        metrics = [m["slug"] for m in product.get("rubric") or []] or list(DEFAULT_SLUGS)
        return DemoSession(
            session_id=_session_id(started, rng),
            started=started,
            language=language,
            product=product["name"],
            metric=_choose(rng, metrics),
            model=_short_model(_weighted(rng, product["models"])["name"]),
        )

    note_sessions = []
    for k, language in enumerate(_NOTE_SESSION_LANGUAGES):
        day = span - 2 - k * (span - 6) / len(_NOTE_SESSION_LANGUAGES) - rng.uniform(0, 2)
        started = (anchor - timedelta(days=day)).replace(
            hour=rng.randint(9, 16), minute=rng.randint(0, 59), second=rng.randint(0, 59), microsecond=0
        )
        note_sessions.append(make_session(started, language))

    raw = _inputs("notes.json")
    slots: dict[str, list[DemoSession]] = defaultdict(list)
    for s in note_sessions:
        slots[s.language].append(s)
    turn: dict[str, int] = defaultdict(int)
    records, profiles = [], []
    offsets: dict[str, int] = defaultdict(int)
    for note in raw:
        language = note["language"]
        if language:
            pool = slots[language]
            target = pool[turn[language] % len(pool)]
        else:
            target = note_sessions[turn[""] % len(note_sessions)]
        turn[language] += 1
        offsets[target.session_id] += rng.randint(2, 19)
        stamp = target.started + timedelta(minutes=offsets[target.session_id], seconds=rng.randint(0, 59))
        record = {
            "timestamp": stamp.isoformat(),
            "language": language,
            "note_type": note["note_type"],
            "content": note["content"],
            "session_id": target.session_id,
        }
        if note.get("phelps_code"):
            record["phelps_code"] = note["phelps_code"]
            record["confidence"] = note["confidence"]
        records.append(record)
        profiles.append(
            {
                "helps": note.get("helps", []),
                "hurts": note.get("hurts", []),
                "pinned": bool(note.get("pinned")),
            }
        )

    runs = list(note_sessions)
    for k in range(28):
        language = _EXTRA_RUN_LANGUAGES[k % len(_EXTRA_RUN_LANGUAGES)]
        day = span - 8 - k * (span - 9) / 28 - rng.uniform(0, 1.5)
        started = (anchor - timedelta(days=day)).replace(
            hour=rng.randint(8, 19), minute=rng.randint(0, 59), second=rng.randint(0, 59), microsecond=0
        )
        runs.append(make_session(started, language))
    runs.sort(key=lambda s: s.started)
    return DemoNotes(records=records, profiles=profiles, sessions=runs)


def _raw_relevance(
    note: Mapping[str, Any],
    profile: Mapping[str, Any],
    run: DemoSession,
    tags: Sequence[str],
    rng: random.Random,
) -> float:
    """What the evaluator would say about a shown note in this run: helpful, neutral or harmful."""
    if "*" in profile["helps"]:
        base = 0.85
    else:
        language = note["language"]
        base = 0.3 if language == run.language else 0.1 if not language else -0.7
        base += 0.55 * sum(t in profile["helps"] for t in tags) - 0.7 * sum(
            t in profile["hurts"] for t in tags
        )
    return round(max(-1.0, min(1.0, base + rng.uniform(-0.25, 0.25))), 2)


def _transcript(
    run: DemoSession, shown: int, snapshot: str | None, rng: random.Random
) -> list[dict[str, Any]]:
    """A short stand-in for the judge run's conversation, as the session audit keeps it."""
    if run.metric == "groundedness":
        score: float = round(rng.uniform(0.3, 1.0), 2)
    else:
        score = rng.randint(1, 3) if run.product == "docsearch-rag" else rng.randint(2, 5)
    return [
        {
            "role": "system",
            "content": f"You are the evaluation judge for {run.product}. {shown} cross-session notes follow.",
        },
        {"role": "user", "content": f"Score snapshot {snapshot or '(ad-hoc answer)'} on {run.metric}."},
        {
            "role": "assistant",
            "content": json.dumps(
                {run.metric: {"score": score, "reason": "Scored against the rubric; see the evidence items."}}
            ),
        },
    ]


@dataclass
class RelevancePlan:
    """Judge-run audits and, in time order, what the evaluator and reviewers said about the notes."""

    audits: list[dict[str, Any]] = field(default_factory=list)  # lib.relevance.record_audit arguments
    # (when, kind, audit session id, payload): kind "evaluation" {note id: raw}, "feedback"
    # (note id, useful, reviewer) or "failed" (retry count).
    actions: list[tuple[datetime, str, str, Any]] = field(default_factory=list)
    manual_pin: int | None = None


def plan_relevance(
    notes: DemoNotes, note_ids: Sequence[int | None], evaluations: DemoEvaluations, seed: int = DEMO_SEED
) -> RelevancePlan:
    """Which notes each judge run showed, and how the evaluator and reviewers scored them later."""
    config = _read_input("products.json")
    rng = _rng(seed, "relevance")
    plan = RelevancePlan()
    reviewers = sorted(config["reviewer_languages"])
    stamps = [datetime.fromisoformat(r["timestamp"]) for r in notes.records]
    snapshots_by = defaultdict(list)
    for t in sorted(evaluations.truths.values(), key=lambda t: t.created_at):
        snapshots_by[(t.product, t.language)].append(t)
    categories = {r["id"]: r["category"] for r in evaluations.records}
    pending_from = len(notes.sessions) - 4  # the evaluator has not reached the newest runs yet
    failed_at = len(notes.sessions) // 2

    for index, run in enumerate(notes.sessions):
        nearby = [t for t in snapshots_by.get((run.product, run.language), []) if t.created_at <= run.started]
        snapshot = nearby[-1].snapshot_id if nearby else None
        tags = relevance.build_env_tags(
            language=run.language, product=run.product, metric=run.metric, model=run.model,
            category=categories.get(snapshot or ""),
        )  # fmt: skip
        # The seed-000 relevant-notes query (language, language-free, or any STRATEGY/PATTERN; newest
        # 20), of which the run's prompt showed a handful, favouring notes with a known profile.
        candidates = [
            i
            for i, r in enumerate(notes.records)
            if note_ids[i] is not None
            and stamps[i] < run.started
            and (r["language"] in (run.language, "") or r["note_type"] in ("STRATEGY", "PATTERN"))
        ]
        candidates = sorted(candidates, key=lambda i: stamps[i], reverse=True)[:20]
        weight = {
            i: 3.0 if notes.profiles[i]["helps"] or notes.profiles[i]["hurts"] else 1.0 for i in candidates
        }
        size = min(len(candidates), rng.randint(5, 9))
        shown = sorted(candidates, key=lambda i: rng.random() ** (1 / weight[i]), reverse=True)[:size]
        if not shown:
            continue  # a run that showed no notes leaves no audit
        shown.sort(key=lambda i: stamps[i], reverse=True)
        audit_at = run.started + timedelta(minutes=rng.randint(35, 55))
        plan.audits.append(
            {
                "session_id": run.session_id,
                "shown_note_ids": [note_ids[i] for i in shown],
                "env_tags": tags,
                "product": run.product,
                "snapshot_id": snapshot,
                "transcript": _transcript(run, len(shown), snapshot, rng),
                "at": audit_at,
            }
        )
        if index >= pending_from:
            continue
        processed_at = audit_at + timedelta(hours=rng.randint(1, 6))
        if index == failed_at:
            plan.actions.append((processed_at, "failed", run.session_id, 3))
            continue
        scores = {
            note_ids[i]: _raw_relevance(notes.records[i], notes.profiles[i], run, tags, rng) for i in shown
        }
        plan.actions.append((processed_at, "evaluation", run.session_id, scores))
        for note_id, raw in scores.items():
            if raw != 0 and rng.random() < 0.14:
                # A reviewer answered "was this note useful here?" on the evaluation page.
                at = processed_at + timedelta(hours=rng.randint(1, 30))
                plan.actions.append(
                    (at, "feedback", run.session_id, (note_id, raw > 0, _choose(rng, reviewers)))
                )
    plan.actions.sort(key=lambda a: (a[0], a[2], a[1]))
    pinned = [i for i, p in enumerate(notes.profiles) if p["pinned"]]
    plan.manual_pin = note_ids[pinned[0]] if pinned else None
    return plan


@dataclass
class RelevanceReplay:
    """The rows lib.relevance would have written for the plan, computed in memory for a fast load."""

    rows: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    processed: list[dict[str, Any]] = field(default_factory=list)
    pins: dict[int, dict[str, Any]] = field(
        default_factory=dict
    )  # note id -> pinned, auto_pinned, prerequisites

    def score(
        self, note: int, tags: Sequence[str], raw: float, weight: float, at: datetime, **extra: Any
    ) -> None:
        """lib.relevance.apply_score: one EMA step under every tag, a history event each, then pins."""
        for tag in relevance.normalize_tags(tags):
            row = self.rows.setdefault(
                (note, tag),
                {"lesson_id": note, "tag": tag, "score": 0.0, "positive_evals": 0, "negative_evals": 0},
            )
            old = row["score"]
            row["score"] = relevance.ema_update(old, raw, weight)
            row["positive_evals"] += raw > 0
            row["negative_evals"] += raw < 0
            row["last_evaluated"] = at
            self.events.append(
                {"lesson_id": note, "tag": tag, "at": at, "raw_score": raw, "weight": weight, "old_score": old,
                 "new_score": row["score"], **extra}
            )  # fmt: skip
        self._update_pin(note)

    def _update_pin(self, note: int) -> None:
        """lib.relevance.update_pin_state, on the in-memory rows."""
        settings = get_settings()
        rows = [r for (n, _tag), r in self.rows.items() if n == note]
        total = sum(r["positive_evals"] + r["negative_evals"] for r in rows)
        if total < settings.autopin_min_evals:
            return
        avg = mean(r["score"] for r in rows)
        pin = self.pins.setdefault(note, {"pinned": False, "auto_pinned": False, "prerequisites": {}})
        if not pin["pinned"] and avg > settings.autopin_threshold:
            positive = sorted(r["tag"] for r in rows if r["score"] > 0)
            pin["prerequisites"] = {
                **pin["prerequisites"],
                "auto_pinned": True,
                **({"tags": positive} if positive else {}),
            }
            pin["pinned"] = pin["auto_pinned"] = True
        elif pin["pinned"] and pin["auto_pinned"] and avg < settings.autounpin_threshold:
            pin["prerequisites"] = {k: v for k, v in pin["prerequisites"].items() if k != "auto_pinned"}
            pin["pinned"] = pin["auto_pinned"] = False

    def manual_pin(self, note: int, reviewer: str, at: datetime) -> None:
        """lib.relevance.set_manual_pin: a manual pin replaces an auto-pin and is never auto-unpinned."""
        pin = self.pins.setdefault(note, {"pinned": False, "auto_pinned": False, "prerequisites": {}})
        prerequisites = {
            k: v for k, v in pin["prerequisites"].items() if k not in ("auto_pinned", "match_pinned")
        }
        pin.update(pinned=True, auto_pinned=False,
                   prerequisites={**prerequisites, "pinned_by": reviewer, "pinned_at": at.isoformat()})  # fmt: skip


def replay_relevance(plan: RelevancePlan, anchor: datetime) -> RelevanceReplay:
    """Apply the plan's scores in time order with lib.relevance's arithmetic and pinning rules."""
    settings = get_settings()
    replay = RelevanceReplay()
    tags_of = {a["session_id"]: a["env_tags"] for a in plan.audits}
    actions = list(plan.actions)
    if plan.manual_pin is not None:
        actions.append((anchor - timedelta(days=12), "pin", "", plan.manual_pin))
    for at, kind, session_id, payload in sorted(actions, key=lambda a: (a[0], a[2], a[1])):
        if kind == "evaluation":
            for note, raw in sorted(payload.items()):
                replay.score(note, tags_of[session_id], raw, settings.evaluator_weight, at,
                             source="evaluator", session_id=session_id, reviewer=None)  # fmt: skip
            replay.processed.append({"session_id": session_id, "processed_at": at, "retry_count": 0,
                                     "status": "completed"})  # fmt: skip
        elif kind == "feedback":
            note, useful, reviewer = payload
            replay.score(note, tags_of[session_id], 1.0 if useful else -1.0, settings.feedback_weight, at,
                         source="reviewer", session_id=session_id, reviewer=reviewer)  # fmt: skip
        elif kind == "failed":
            replay.processed.append({"session_id": session_id, "processed_at": at, "retry_count": payload,
                                     "status": "failed"})  # fmt: skip
        else:
            replay.manual_pin(payload, "ayse", at)
    return replay


def _write_relevance(session: Session, plan: RelevancePlan, anchor: datetime) -> int:
    """Bulk-write the audits, match counts, scores, history and pins the app would have produced."""
    replay = replay_relevance(plan, anchor)
    audits, matches = [], {}
    for audit in plan.audits:
        tags = sorted(relevance.normalize_tags(audit["env_tags"]))
        shown = sorted(audit["shown_note_ids"])
        audits.append(
            {"session_id": audit["session_id"], "shown_lesson_ids": shown, "env_tags": tags,
             "repo": audit["product"], "snapshot_id": audit["snapshot_id"], "timestamp": audit["at"],
             "transcript": audit["transcript"], "transcript_path": None}
        )  # fmt: skip
        key = relevance.tag_set_key(tags)
        for note in shown:
            m = matches.setdefault((note, key), {"lesson_id": note, "tag_set": key, "times_matched": 0})
            m["times_matched"] += 1
            m["last_matched"] = audit["at"]
    session.execute(insert(SessionAudit), audits)
    session.execute(insert(LessonMatchStat), [matches[k] for k in sorted(matches)])
    if replay.processed:
        session.execute(insert(ProcessedRelevanceSession), replay.processed)
    if replay.events:
        session.execute(insert(TagRelevanceEvent), replay.events)
    if replay.rows:
        session.execute(insert(LessonTagRelevance), [replay.rows[k] for k in sorted(replay.rows)])
    pinned = [
        {"id": note, **pin}
        for note, pin in sorted(replay.pins.items())
        if pin["pinned"] or pin["prerequisites"]
    ]
    if pinned:
        session.execute(update(SessionNote), pinned)
    return len(audits)


def _note_ids(session: Session, records: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """The stored id of each demo note record (None when it is not in the database)."""
    sessions = sorted({r["session_id"] for r in records})
    found: dict[tuple[str, str, str], int] = {}
    rows = session.execute(
        select(SessionNote.id, SessionNote.session_id, SessionNote.note_type, SessionNote.content).where(
            col(SessionNote.session_id).in_(sessions)
        )
    ).all()
    for note_id, session_id, note_type, content in sorted(rows, key=lambda r: r[0]):
        found.setdefault((session_id, note_type, content), note_id)
    return [found.get((r["session_id"], r["note_type"], r["content"])) for r in records]


# ---------------------------------------------------------------------------------------------
# Precedents (seed 003)


def _similarity(a: str, b: str) -> float:
    return SequenceMatcher(None, a, b).ratio()


def _same_url(a: str | None, b: str | None) -> bool:
    return (a or "").strip().lower() == (b or "").strip().lower()


def _precedent_total(scores: Sequence[float], citation: float | None) -> float:
    """Seed 003: round(mean(sentence scores) × 0.75 + (citation score or 25), 2)."""
    return round(mean(scores) * 0.75 + (citation if citation is not None else 25), 2)


@dataclass
class DemoPrecedents:
    """Interactions, expert feedback (by interaction id) and auto-evaluations (by interaction id)."""

    interactions: list[dict[str, Any]]
    expert: dict[str, dict[str, Any]]
    auto: dict[str, dict[str, Any]]  # interaction id -> AutoEval fields + optional "ai_feedback"


def _auto_evaluation(
    a: Mapping[str, Any],
    iid: str,
    at: datetime,
    expert_by_key: Mapping[str, Mapping[str, Any]],
    expert: Mapping[str, Mapping[str, Any]],
    rng: random.Random,
) -> dict[str, Any]:
    """The seed-003 outcome the input asks for, with the match trace that explains it."""
    outcome, precedent = a["outcome"], expert_by_key.get(a["precedent"] or "")
    answer = " ".join(a["sentences"])
    trace: dict[str, Any] = {"qa_matches": [], "sentences": [], "citation": {}}
    result: dict[str, Any] = {
        "interaction_id": iid,
        "processed": True,
        "has_matches": False,
        "matched_interaction_id": None,
        "no_match_reason": None if outcome == "matched" else outcome,
        "total_score": None,
        "created_at": at,
    }
    if outcome == "no_embeddings":
        trace = {
            "error": "no embedding stored for this interaction; it was created before embeddings were enabled"
        }
    elif outcome == "no_qa_match":
        # The nearest expert-reviewed neighbours, all below the threshold.
        near = sorted(
            (
                (round(0.45 + 0.35 * _similarity(a["question"], e["question"]), 3), e["id"])
                for e in expert_by_key.values()
            ),
            reverse=True,
        )[:3]
        trace["qa_candidates"] = [{"interaction_id": i, "similarity": s} for s, i in near]
    else:
        assert precedent is not None
        qa_sim = round(0.88 + 0.1 * _similarity(answer, precedent["answer"]), 3)
        trace["qa_matches"] = [{"interaction_id": precedent["id"], "similarity": qa_sim}]
        others = [e for e in expert_by_key.values() if e["id"] != precedent["id"]]
        runner_up = max(others, key=lambda e: _similarity(a["question"], e["question"]))
        runner_sim = round(QA_THRESHOLD + 0.03 * rng.random(), 3)
        if rng.random() < 0.5 and runner_sim < qa_sim:
            trace["qa_matches"].append({"interaction_id": runner_up["id"], "similarity": runner_sim})
        copied = []
        for sentence in a["sentences"]:
            best = max(precedent["sentences"], key=lambda s: _similarity(sentence, s["sentence"]))
            ratio = _similarity(sentence, best["sentence"])
            sim = round(0.55 + 0.45 * ratio, 3) if ratio < 0.95 else round(0.95 + 0.05 * ratio, 3)
            trace["sentences"].append(
                {
                    "sentence": sentence,
                    "best_match": best["sentence"] if sim >= QA_THRESHOLD else None,
                    "similarity": sim,
                }
            )
            copied.append({"sentence": sentence, "score": best["score"]})
        trace["citation"] = {
            "expected": precedent["citation_url"],
            "actual": a["citation_url"],
            "match": _same_url(precedent["citation_url"], a["citation_url"]),
        }
        if outcome == "forced_fallback_no_match":
            trace["fallback"] = {
                "candidates": [
                    m["interaction_id"]
                    for m in trace["qa_matches"]
                    if expert[m["interaction_id"]]["total_score"] >= 90
                ],
                "citation_match": trace["citation"]["match"],
                "llm_pass": False,
                "llm_reason": "The answer tells the user to hash the parsed JSON with the API key; the "
                "precedent requires an HMAC of the raw body with the signing secret.",
            }
        if outcome == "matched":
            fb = expert[precedent["id"]]
            total = _precedent_total([c["score"] for c in copied], fb["citation_score"])
            result.update(has_matches=True, total_score=total, matched_interaction_id=precedent["id"])
            result["ai_feedback"] = {
                "interaction_id": iid,
                "type": "ai",
                "total_score": total,
                "citation_score": fb["citation_score"],
                "citation_url": a["citation_url"],
                "sentence_scores": copied,
                "reviewer": None,
                "created_at": result["created_at"],
            }
    result["sentence_match_trace"] = trace
    return result


def build_precedents(seed: int = DEMO_SEED) -> DemoPrecedents:
    """Expert-reviewed help-center answers and newer ones auto-evaluated against them."""
    data = _inputs("precedents.json")
    anchor = demo_anchor()
    rng = _rng(seed, "precedents")
    out = DemoPrecedents([], {}, {})
    expert_by_key: dict[str, dict[str, Any]] = {}
    for n, e in enumerate(data["expert"]):
        iid = f"int_{e['key']}"
        created = (anchor - timedelta(days=62 - n * 2, hours=rng.randint(0, 8))).replace(microsecond=0)
        answer = " ".join(s["sentence"] for s in e["sentences"])
        out.interactions.append(
            {
                "id": iid,
                "product": "acme-support",
                "language": "en",
                "question": e["question"],
                "answer": answer,
                "citation_url": e["citation_url"],
                "citations": [e["citation_url"]],
                "created_at": created,
            }
        )
        scores = [s["score"] for s in e["sentences"]]
        out.expert[iid] = {
            "interaction_id": iid,
            "type": "expert",
            "total_score": _precedent_total(scores, e["citation_score"]),
            "citation_score": e["citation_score"],
            "citation_url": e["citation_url"],
            "sentence_scores": e["sentences"],
            "reviewer": e["reviewer"],
            "created_at": created + timedelta(days=rng.randint(1, 3), hours=rng.randint(0, 7)),
        }
        expert_by_key[e["key"]] = {**e, "id": iid, "answer": answer}

    for n, a in enumerate(data["auto"]):
        iid = f"int_{a['key']}"
        created = (anchor - timedelta(days=27 - n * 1.8, hours=rng.randint(0, 8))).replace(microsecond=0)
        answer = " ".join(a["sentences"])
        out.interactions.append(
            {
                "id": iid,
                "product": "acme-support",
                "language": "en",
                "question": a["question"],
                "answer": answer,
                "citation_url": a["citation_url"],
                "citations": [a["citation_url"]],
                "created_at": created,
            }
        )
        out.auto[iid] = _auto_evaluation(
            a, iid, created + timedelta(minutes=rng.randint(1, 9)), expert_by_key, out.expert, rng
        )
    return out


def _write_precedents(session: Session, data: DemoPrecedents) -> dict[str, int]:
    ids = [i["id"] for i in data.interactions]
    stored = set(session.execute(select(Interaction.id).where(col(Interaction.id).in_(ids))).scalars())
    fresh = [i for i in data.interactions if i["id"] not in stored]
    if not fresh:
        return {"interactions": 0, "expert feedback": 0, "auto evaluations": 0}
    session.execute(insert(Interaction), fresh)
    fresh_ids = {i["id"] for i in fresh}
    expert = [fb for iid, fb in sorted(data.expert.items()) if iid in fresh_ids]
    if expert:
        session.execute(insert(ExpertFeedback), expert)
    autos = 0
    for iid, result in sorted(data.auto.items()):
        if iid not in fresh_ids:
            continue
        fields = {k: v for k, v in result.items() if k != "ai_feedback"}
        if "ai_feedback" in result:
            fb = ExpertFeedback(**result["ai_feedback"])
            session.add(fb)
            session.flush()
            fields["expert_feedback_id"] = fb.id
        session.execute(insert(AutoEval), [fields])
        autos += 1
    return {"interactions": len(fresh), "expert feedback": len(expert), "auto evaluations": autos}


# ---------------------------------------------------------------------------------------------
# Loading


def _relevance_rows(session: Session) -> tuple[int, int]:
    """(tag score rows, tag history events) in the database."""
    scores = session.execute(select(func.count()).select_from(LessonTagRelevance)).scalar_one()
    events = session.execute(select(func.count()).select_from(TagRelevanceEvent)).scalar_one()
    return int(scores), int(events)


def _lock(session: Session) -> None:
    """Serialise demo loads: two app replicas starting on an empty PostgreSQL load it only once."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_DEMO_LOCK})
    # SQLite: the writer transaction (BEGIN IMMEDIATE) already serialises this check and the writes.


def _has_evaluations(session: Session) -> bool:
    return session.execute(select(EvaluationSnapshot.id).limit(1)).first() is not None


def load_demo(*, engine: Engine, force: bool = False) -> dict[str, int]:
    """Load the demo data set; {} without writing when evaluations exist and `force` is False.

    Returns how many rows of each kind were added. Everything is written in one transaction.
    """
    evaluations = build_evaluations()
    reviews = plan_reviews(evaluations)
    cache_rows = build_cache_judgments()
    notes = build_notes()
    precedents = build_precedents()
    with session_scope(engine) as session:
        _lock(session)
        if not force and _has_evaluations(session):
            return {}
        counts: dict[str, int] = {}
        import_metrics(session=session, data=evaluations.metric_definitions, source="demo rubric")
        report = import_evaluations(
            session=session, records=evaluations.records, source="demo", reviewer=DEMO_AUTHOR
        )
        counts["evaluations"] = report.inserted
        cache_added, cache_events = _write_cache_judgments(session, cache_rows)
        counts["judgments"] = report.judgments + cache_added
        counts["reviews"] = _apply_reviews(session, reviews) + cache_events

        note_report = import_notes(
            session=session, records=notes.records, source="demo notes", reviewer=DEMO_AUTHOR
        )
        counts["notes"] = note_report.inserted
        note_ids = _note_ids(session, notes.records)
        audit_ids = [s.session_id for s in notes.sessions]
        have_audits = session.execute(
            select(SessionAudit.id).where(col(SessionAudit.session_id).in_(audit_ids)).limit(1)
        ).first()
        counts["session audits"] = 0
        before = _relevance_rows(session)
        if not have_audits:
            plan = plan_relevance(notes, note_ids, evaluations)
            counts["session audits"] = _write_relevance(session, plan, demo_anchor())
        after = _relevance_rows(session)
        counts["tag scores"], counts["tag events"] = after[0] - before[0], after[1] - before[1]
        counts.update(_write_precedents(session, precedents))
    return counts
