"""Demo evaluations: answers built from templates with flaws written in, judge scores, evidence."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import mean
from typing import Any

from lib.demo.inputs import (
    DEMO_SEED,
    _choose,
    _inputs,
    _read_input,
    _rng,
    _weighted,
    demo_anchor,
)
from lib.evidence import ANCHOR_LEN, verify_evidence
from lib.metrics import DEFAULT_METRICS

# Target share of each verification stage among evidence items: every stage occurs many times.
STAGE_WEIGHTS = {"exact": 0.34, "substring": 0.22, "anchor": 0.2, "whitespace": 0.12, "unverified": 0.12}
NO_EVIDENCE_SHARE = 0.08  # seed 002 AD-8: some evaluations come without any evidence


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
