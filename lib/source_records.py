"""Judge results from other tools (promptfoo, Langfuse, Phoenix, OpenTelemetry) as Overrule records.

Every reader of a foreign source (the file importers in `lib.source_files`, the OTLP receiver)
produces `SourceEvaluation`s: one judged answer with one `SourceVerdict` per evaluation name. This
module is the one rule that turns them into Overrule's evaluation records and, for metrics the
product's rubric does not define yet, into metric definitions; `lib.importer.import_source_evaluations`
writes both, all or nothing, through the ordinary evaluation import.

Rules (docs/importing.md says them to users):

- **Metric**: the evaluation name, matched to the product's rubric by slug or display name; an
  unknown name becomes a new metric whose slug is `metric_slug(name)` and whose display name is the
  name itself. Its scale is the one the source states (promptfoo: 0–1 continuous; a Langfuse
  BOOLEAN score: 0–1 whole), else 0–1 whole for pass/fail labels, else inferred from the scores
  (0, or the lowest score rounded down when negative, up to the highest rounded up, at least 1;
  whole numbers only when every score is whole). An inferred scale grows with later imports: a
  score outside it widens it (and a fractional score makes it continuous), never narrows it, in the
  import's transaction, with a "judge_changed" audit row (review7 F2: an OTLP stream's first
  request would otherwise freeze it). Any other rubric metric keeps its scale (a user defined it
  with `--kind metrics` or on the Admin page, or the source stated it): a score outside it refuses
  the evaluation, naming the place.
- **Score**: the source's number. A verdict with a label but no number gets the score the user
  gives that label (--label-scores), else the one the import's scored verdicts of the same metric
  give it, else the one the product's stored judgments of that metric and label have
  (`score_labels`), else a known label's (`LABEL_SCORES`: pass 1, fail 0, and Phoenix's
  rails as Phoenix scores them: hallucinated 1, factual 0, toxic 1, non-toxic 0) when the metric
  is 0–1, stored and as the import leaves it, or new and labelled only (review14 F8: on 1–5,
  `pass` as 1 is the worst score); any other label without a number, or a known one on another
  scale, refuses the file.
- **Reason**: the label, then the judge's explanation (`"fail: the answer invents a date"`), so a
  reviewer sees both. The label is also the score entry's `label` and the judgment's (`label_key`):
  the stored-label lookup reads that, never the reasoning's free text.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lib.metrics import SCALE_BOUND, MetricSpec
from lib.models import LABEL_MAX
from lib.records import ImportFailed, InvalidField, Located, located_failure

# A label without a number scores what its source scores it. Phoenix's pre-tested evals name their
# rails `{True: first, False: second}` and score the first 1 (ClassificationTemplate), also where 1
# is the bad outcome: hallucinated, toxic (review7 F9: "factual" was 1 here, Phoenix's own scored
# verdicts 0, and one metric got opposite numbers). Each pair is (the label scored 1, the one
# scored 0); compared case-insensitively after strip().
LABEL_PAIRS: tuple[tuple[str, str], ...] = (
    ("pass", "fail"), ("passed", "failed"), ("true", "false"), ("yes", "no"),
    # Phoenix's rails: QA, tool calling, SQL, reference links; RAG relevance; hallucination;
    # toxicity; summarization; code readability; code functionality.
    ("correct", "incorrect"), ("relevant", "unrelated"), ("hallucinated", "factual"),
    ("toxic", "non-toxic"), ("good", "bad"), ("readable", "unreadable"), ("bug_free", "is_bug"),
    # Others' pass/fail words.
    ("faithful", "unfaithful"), ("safe", "unsafe"),
)  # fmt: skip
LABEL_SCORES: dict[str, int] = {
    **{one: 1 for one, _ in LABEL_PAIRS}, **{zero: 0 for _, zero in LABEL_PAIRS}, "irrelevant": 0,
}  # fmt: skip
_PARTNER = {**dict(LABEL_PAIRS), **{zero: one for one, zero in LABEL_PAIRS}}

# How a user gives a label sent without a number its score, by where the import came from: a
# refusal names the way that place has (review14 F3: the receiver and the API named the command
# line's flag). `verdict_score` takes the one its caller names; {label} is the label refused.
LABEL_SCORE_ADVICE: dict[str, str] = {
    "cli": "give the evaluation a numeric score, or its label one (--label-scores {label}=N,…)",
    "api": "give the evaluation a numeric score, or its label one (?label_scores={label}=N,…)",
    "page": "give the evaluation a numeric score, or its label one "
    "(the field for scores of labels sent without a number: {label}=N,…)",
    "otlp": "send gen_ai.evaluation.score.value with the label",
}
# What a label sent without a number scores when the user gives it none (docs/importing.md,
# "Score", steps 2–5): the command line's and the Import page's help both say it.
LABEL_SCORE_STEPS = (
    "a label these scores do not name takes the score the file's scored results of the same metric "
    "give it, else the one the product's stored judgments of that metric and label have (a file "
    "whose partner label implies another number is refused), else "
    "for one of a pair (pass/fail, factual/hallucinated, …) the other number than its partner "
    "gets so, else, on a metric scored 0–1 (or a new one of labels only), a known label's "
    "(pass 1, fail 0, …; docs/importing.md)"
)
_SLUG_JUNK = re.compile(r"[^a-z0-9_-]+")
SLUG_MAX = 64


@dataclass(frozen=True)
class SourceScale:
    """A scale the source states for its scores."""

    min_value: float
    max_value: float
    integer_scale: bool


PROMPTFOO_SCALE = SourceScale(0.0, 1.0, integer_scale=False)  # promptfoo scores are 0–1
BINARY_SCALE = SourceScale(0.0, 1.0, integer_scale=True)  # pass/fail, true/false


@dataclass(slots=True)
class SourceVerdict:
    """One judge result on one answer: an evaluation name with a score and/or a label."""

    name: str
    score: float | None = None
    label: str | None = None
    reason: str | None = None
    scale: SourceScale | None = None
    # The source field the verdict came from, for error messages ("gradingResult.componentResults[1]").
    field: str = ""
    # A person's label (a Langfuse annotation), not a judge's: the reviewer's side of the evaluation.
    human: bool = False
    # Where the verdict is in the source when not where its evaluation is (a score's own line).
    where: str = ""
    # Why the source gives this label no number, said first when nothing else scores it: the
    # file's reviewer scores the label (`score_labels`, review18 M1), a Langfuse category's score
    # config is not in the file (M2). Keyword-only: not among the positional fields lib.otlp's
    # Verdict is built with.
    unscored: str = dataclasses.field(default="", kw_only=True)  # (`field` is a field here)


@dataclass(slots=True)
class SourceEvaluation:
    """One judged answer from another tool, ready to become an Overrule evaluation record.

    `where` locates it in the source ("results.json, results[3]", "spans.parquet row 7");
    `fields` maps Overrule's field names (question, model_answer, ...) to the source's, so a
    refusal names the field the user can find in their file.
    """

    where: str
    product: str
    question: Any
    answer: Any
    verdicts: list[SourceVerdict]
    model_name: str | None = None
    judge_model: str | None = None
    language: str | None = None
    created_at: str | datetime | None = None  # ISO 8601 text, or already a datetime (lib.otlp)
    question_id: str | None = None
    fields: dict[str, str] = field(default_factory=dict)


def metric_slug(name: str) -> str:
    """The slug of a foreign evaluation name: lower case, runs of other characters as "_" (max 64)."""
    slug = _SLUG_JUNK.sub("_", name.strip().lower()).strip("_-")[:SLUG_MAX].rstrip("_-")
    return slug or "score"


def label_key(label: Any) -> str | None:
    """A label as labels are compared and stored on a judgment (`Judgment.label`): stripped, lower
    case; None for no label, a blank one, or text longer than `LABEL_MAX` (free text, not a category)."""
    if not isinstance(label, str):
        return None
    key = label.strip().lower()
    return key if key and len(key) <= LABEL_MAX else None


def label_score(label: str) -> int | None:
    """The score a known label has (`LABEL_SCORES`), None for any other."""
    return LABEL_SCORES.get(label.strip().lower())


def parse_label_scores(text: str | None) -> dict[str, float]:
    """`toxic=1,non-toxic=0` (the --label-scores option) as {label: score}; ImportFailed if malformed."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        label, sep, number = part.rpartition("=")
        try:
            score = float(number) if sep and label.strip() else math.nan
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise ImportFailed(
                f"label scores: {part.strip()[:60]!r} is not LABEL=SCORE (e.g. toxic=1,non-toxic=0)"
            )
        out[label.strip().lower()] = score
    return out


def score_labels(
    evaluations: Iterable[SourceEvaluation],
    explicit: Mapping[str, float] | None = None,
    stored: Callable[[str, str, str], set[float]] | None = None,
    via: str | None = None,
) -> None:
    """Give each verdict that has a label and no number the score its label has here, the first of:
    the one `explicit` gives it (--label-scores); the one every scored verdict of the same product,
    evaluation name and side (the judge's, or the reviewer's: `human`) with that label has in these
    evaluations (a file that scores some rows and only labels others stays consistent, whatever its
    labels mean; a reviewer's number never scores the judge's label, which Analytics compares with
    it: review16 L5); the one every judgment the
    database holds for that product, metric and label has (`stored(product, metric slug, label)`:
    a label keeps the number reviewers already see for it); for one of a known pair (`LABEL_PAIRS`),
    the other of the number its partner gets so (a product that stored `factual` as 1 gets
    `hallucinated` 0, not a 1 for both). Others are left to `verdict_score`'s known labels
    (`LABEL_SCORES`). Labels are compared as the judgments store them (`label_key`): text longer
    than a label may be is free text, scored by none of these, as the stored lookup never found it.

    A stored number that the file's own partner (`--label-scores` or its scored results) contradicts
    (the product stored `hallucinated` 0, the file scores `factual` 0) would give one file both
    labels one number, in silence (review16 M3): with `via` (a file import: where it came from, for
    the advice) that refuses the file, naming the label, both numbers and where each came from.
    Without it (OTLP, whose sender cannot pass label scores) the stored number is kept."""
    evaluations = list(evaluations)
    scored: dict[tuple[str, str, str, bool], set[float]] = {}
    places: dict[tuple[str, str, str, bool], str] = {}  # where each scored label is first scored
    for ev in evaluations:
        for verdict in ev.verdicts:
            score, label = verdict.score, label_key(verdict.label)
            if (
                label is not None
                and isinstance(score, int | float)
                and not isinstance(score, bool)
                and math.isfinite(score)
            ):
                key = (str(ev.product), metric_slug(verdict.name), label, verdict.human)
                scored.setdefault(key, set()).add(float(score))
                places.setdefault(key, verdict.where or ev.where)
    explicit = explicit or {}
    in_database: dict[tuple[str, str, str], set[float]] = {}

    def one(found: set[float] | None) -> float | None:
        return next(iter(found)) if found is not None and len(found) == 1 else None

    def known(product: str, slug: str, label: str, human: bool) -> tuple[float | None, bool]:
        """The label's number from the file's same side, else the database's; and whether it is the database's."""
        found = scored.get((product, slug, label, human))
        if found is not None or stored is None:
            return one(found), False
        key = (product, slug, label)
        if key not in in_database:
            in_database[key] = stored(*key)
        return one(in_database[key]), True

    for ev in evaluations:
        for verdict in ev.verdicts:
            label = label_key(verdict.label)
            if verdict.score is not None or label is None:  # scored already, or no label to score
                continue
            product, slug = str(ev.product), metric_slug(verdict.name)
            score = explicit.get(label)
            if score is None:
                score, from_database = known(product, slug, label, verdict.human)
                if score is not None and from_database and via is not None and label in _PARTNER:
                    _check_partner(ev, verdict, label, score, explicit, scored, places, via)
            if score is None and label in _PARTNER:  # "factual" stored as 1: "hallucinated" is 0 here
                other = explicit.get(_PARTNER[label])
                if other is None:
                    other = known(product, slug, _PARTNER[label], verdict.human)[0]
                score = 1.0 - other if other in (0.0, 1.0) else None
            if score is not None:
                verdict.score = score
            elif not verdict.human and (side := (product, slug, label, True)) in scored:
                numbers = "/".join(f"{n:g}" for n in sorted(scored[side]))
                verdict.unscored = (
                    f"{places[side]} gives {label!r} {numbers} as a reviewer's score (Phoenix HUMAN, "
                    "Langfuse ANNOTATION), which never scores the judge's label"
                )


def _check_partner(
    ev: SourceEvaluation,
    verdict: SourceVerdict,
    label: str,
    stored: float,
    explicit: Mapping[str, float],
    scored: Mapping[tuple[str, str, str, bool], set[float]],
    places: Mapping[tuple[str, str, str, bool], str],
    via: str,
) -> None:
    """Refuse (`score_labels`' `via`) a label whose number the product stores (`stored`) when the
    import's own word on its partner implies the other: `--label-scores`, else the file's scored
    results of the partner on the same side, when they give it one number of 0 and 1."""
    partner = _PARTNER[label]
    key = (str(ev.product), metric_slug(verdict.name), partner, verdict.human)
    other = explicit.get(partner)
    source = f"the label scores you gave make its partner {partner!r} {other:g}" if other is not None else ""
    if other is None and len(found := scored.get(key, set())) == 1:
        other = next(iter(found))
        source = f"this file scores its partner {partner!r} {other:g} (at {places[key]})"
    if other is None or other not in (0.0, 1.0) or 1.0 - other == stored:
        return
    field = verdict.field or verdict.name
    raise ImportFailed(
        f"{verdict.where or ev.where}, field {field!r}: label {label!r} of {verdict.name!r} has no score, "
        f"and two numbers apply: the stored judgments of product {ev.product!r} score it {stored:g}, and "
        f"{source}, which makes it {1.0 - other:g}; " + LABEL_SCORE_ADVICE[via].format(label=label[:20])
    )


def verdict_reason(verdict: SourceVerdict) -> str | None:
    """The reason a reviewer reads: the label first, then the judge's explanation."""
    label = (verdict.label or "").strip()
    reason = (verdict.reason or "").strip()
    if label and reason:
        return f"{label}: {reason}"
    return label or reason or None


def verdict_score(verdict: SourceVerdict, via: str = "cli", metric: MetricSpec | None = None) -> float:
    """The verdict's number: its score, else its known label's (`LABEL_SCORES`); InvalidField otherwise,
    advising what `via` (a `LABEL_SCORE_ADVICE` key: where the import came from) offers.

    `metric` is the stored metric the verdict scores (None for one this import defines, whose scale
    the numbers will set): a known label's 1 or 0 holds only on a 0–1 scale, so on any other it is
    refused like an unknown label (review14 F8: `pass` became 1, the worst of a 1–5 metric)."""
    if verdict.score.__class__ is float and math.isfinite(verdict.score):
        return verdict.score  # the common case (every OTLP number), as the checks below would return it
    if verdict.score is not None:
        if isinstance(verdict.score, bool) or not isinstance(verdict.score, int | float):
            raise InvalidField(
                verdict.field or verdict.name, f"score must be a number, got {verdict.score!r}"
            )
        if not math.isfinite(verdict.score):
            raise InvalidField(verdict.field or verdict.name, "score must be a finite number")
        return float(verdict.score)
    if verdict.label is not None and verdict.label.strip():
        number = label_score(verdict.label)
        if number is not None and (metric is None or (metric.min_value, metric.max_value) == (0, 1)):
            return float(number)
        if metric is not None and number is not None:
            raise _off_scale(verdict, via, metric.display_name, metric.min_value, metric.max_value, number)
        if label_key(verdict.label) is None:  # free text: no label score can name it (review16 L4)
            raise InvalidField(
                verdict.field or verdict.name,
                f"label {verdict.label.strip()[:60]!r}… has no score, and text over {LABEL_MAX} "
                "characters is free text, not a label a label score can name; "
                + (LABEL_SCORE_ADVICE[via] if via == "otlp" else "give the evaluation a numeric score"),
            )
        raise InvalidField(
            verdict.field or verdict.name,
            f"label {verdict.label.strip()[:60]!r} has no score"
            + (f": {verdict.unscored}; nor is it" if verdict.unscored else ", and it is not")
            + " a known label (pass/fail, true/false, correct/incorrect, … docs/importing.md); "
            + LABEL_SCORE_ADVICE[via].format(label=verdict.label.strip()[:20]),
        )
    raise InvalidField(verdict.field or verdict.name, "has neither a score nor a label")


def _off_scale(
    verdict: SourceVerdict, via: str, name: str, low: float, high: float, number: float
) -> InvalidField:
    """The refusal of a known label's number on a metric that is not 0–1 (`low`–`high`)."""
    label = (verdict.label or "").strip()
    return InvalidField(
        verdict.field or verdict.name,
        f"label {label[:60]!r} has no score, and {name!r} is scored {low:g}–{high:g}: a known label's "
        f"{number:g} holds only on a 0–1 scale (docs/importing.md); "
        + LABEL_SCORE_ADVICE[via].format(label=label[:20]),
    )


@dataclass
class _MetricPlan:
    """The scores an import gives a metric it defines, or one whose stored scale an import inferred
    (`stored`): the scale it writes covers them."""

    name: str
    slug: str
    stored: MetricSpec | None = None
    stated: SourceScale | None = None
    labels_only: bool = True
    low: float = math.inf
    high: float = -math.inf
    whole: bool = True

    def add(self, score: float, labelled: bool, scale: SourceScale | None) -> None:
        """One accepted evaluation's score for this metric."""
        self.stated = self.stated or scale
        self.labels_only = self.labels_only and labelled
        if score < self.low:
            self.low = score
        if score > self.high:
            self.high = score
        self.whole = self.whole and score.is_integer()

    @property
    def scored(self) -> bool:
        return self.low <= self.high

    def final_scale(self) -> tuple[float, float]:
        """The scale the metric has once this import's definitions are written (a stored one widened)."""
        if self.stored is None:
            scale = _new_scale(self)
            return scale.min_value, scale.max_value
        inferred = _inferred_scale(self)
        return min(self.stored.min_value, inferred.min_value), max(self.stored.max_value, inferred.max_value)


# What one accepted record gave the plan: its product, whether it scored a metric the rubric fixes,
# and each score of a metric the plan defines or widens (the plan, score, label only, stated scale).
_Use = tuple[_MetricPlan, float, bool, SourceScale | None]
_Contribution = tuple[Any, bool, list[_Use]]
_Resolved = tuple[str | None, str, str, str, _MetricPlan | None, MetricSpec | None]


@dataclass
class SourcePlan:
    """What importing some source evaluations writes: metric definitions first, then the records
    (`indexes`: each record's position among the evaluations, when faulty ones were left out).

    The definitions come from the records only: an evaluation refused while planning adds nothing
    to them, and `definitions_without` gives them again without the records a later check refused
    (review7 F7: a refused OTLP span wrote its product's rubric)."""

    definitions: list[dict[str, Any]]
    records: list[tuple[Located, dict[str, Any]]]
    indexes: list[int] = field(default_factory=list)
    rubrics: dict[Any, tuple[list[MetricSpec], bool, bool]] = field(default_factory=dict)
    contributions: list[_Contribution] = field(default_factory=list)  # one per record

    def definitions_without(self, refused: Collection[int]) -> list[dict[str, Any]]:
        """The definitions of the records but those at the positions `refused` (in `records`)."""
        plans: dict[tuple[Any, str], _MetricPlan] = {}
        uses_rubric: set[Any] = set()
        for position, (product, on_rubric, uses) in enumerate(self.contributions):
            if position in refused:
                continue
            if on_rubric:
                uses_rubric.add(product)
            for template, score, labelled, scale in uses:
                plan = plans.get((product, template.slug))
                if plan is None:
                    plan = plans[product, template.slug] = _MetricPlan(
                        template.name, template.slug, template.stored
                    )
                plan.add(score, labelled, scale)
        return _definitions(self.rubrics, plans, uses_rubric)


def resolve_metric(specs: Sequence[MetricSpec], name: str) -> str:
    """The slug an evaluation name is stored under: the rubric's metric it names, else its own slug."""
    return _resolve(specs, name) or metric_slug(name)


def _resolve(specs: Sequence[MetricSpec], name: str) -> str | None:
    for spec in specs:
        if name in (spec.slug, spec.display_name):
            return spec.slug
    slug = metric_slug(name)
    return slug if any(spec.slug == slug for spec in specs) else None


def _resolved(specs: Sequence[MetricSpec], name: str) -> tuple[str | None, str]:
    """(the rubric's slug `name` names or None, the key its scores go under)."""
    slug = _resolve(specs, name)
    return slug, slug if slug is not None else metric_slug(name)


def plan_import(
    evaluations: Iterable[SourceEvaluation],
    rubric: Callable[[str], tuple[list[MetricSpec], bool, bool]],
    *,
    on_invalid: Callable[[int, ImportFailed], None] | None = None,
    via: str = "cli",
) -> SourcePlan:
    """Records and new metric definitions for `evaluations`; InvalidField-based refusals located
    (raised, or with `on_invalid` handed to it with the evaluation's index and left out), their
    advice for a label without a score the one `via` offers (`LABEL_SCORE_ADVICE`).

    `rubric(product)` is (the product's metrics, whether it defines its own rather than using the
    defaults, whether it holds evaluations). A product on the default metrics that gains a metric
    here keeps the defaults as well (written out with the new ones) when it holds evaluations or
    this import scores one of them, so nothing it shows changes scale or disappears.
    """
    plans: dict[tuple[str, str], _MetricPlan] = {}
    records: list[tuple[Located, dict[str, Any]]] = []
    indexes: list[int] = []
    contributions: list[_Contribution] = []
    # Each record's verdicts scored by a known label's number on a metric this import defines or
    # widens: refused below if the import's other scores leave that metric on another scale than 0–1.
    by_label: dict[int, list[tuple[_MetricPlan, SourceVerdict]]] = {}
    rubrics: dict[str, tuple[list[MetricSpec], bool, bool]] = {}
    uses_rubric: set[str] = set()
    # (product, evaluation name) → (rubric slug or None, score key, the record's field for it as a
    # judge's and as a person's score, the new metric's plan or None, the stored metric or None):
    # every evaluation names the same few metrics, and every verdict passes here (an OTLP request of
    # 512 spans: 2,560).
    resolved: dict[tuple[Any, str], _Resolved] = {}
    for index, ev in enumerate(evaluations):
        product = ev.product
        where = Located(ev.where, dict(ev.fields))
        if product not in rubrics:
            rubrics[product] = rubric(product) if isinstance(product, str) else ([], True, False)
        specs = rubrics[product][0]
        scores: dict[str, dict[str, Any]] = {}
        human: dict[str, dict[str, Any]] = {}
        uses: list[_Use] = []  # added to the plans once the evaluation is accepted whole
        known: list[tuple[_MetricPlan, SourceVerdict]] = []
        on_rubric = False
        try:
            if not ev.verdicts:
                raise InvalidField(None, "has no evaluation results")
            for verdict in ev.verdicts:
                name = verdict.name
                source_field = verdict.field or name
                if verdict.where:
                    where.places[source_field] = verdict.where
                named = isinstance(name, str)
                cached = resolved.get((product, name)) if named else None
                if cached is None:
                    slug, key = _resolved(specs, name)
                    plan = plans.get((product, key))
                    stored = None if slug is None else next(spec for spec in specs if spec.slug == slug)
                    if plan is None and stored is None:
                        plan = plans[product, key] = _MetricPlan(name, key)
                    elif plan is None and stored is not None and stored.scale_inferred:
                        # an import's scale: this import's scores widen it
                        plan = plans[product, key] = _MetricPlan(stored.display_name, key, stored)
                    cached = (slug, key, f"judge_scores.{key}", f"user_scores.{key}", plan, stored)
                    if named:
                        resolved[product, name] = cached
                slug, key, judge_field, user_field, plan, stored = cached
                score = verdict_score(verdict, via, stored)
                if plan is None:  # the rubric's metric, on a scale a user (or the source) set
                    on_rubric = True
                else:  # a metric this import defines, or one whose inferred scale it may widen
                    if abs(score) > SCALE_BOUND:
                        raise InvalidField(
                            source_field,
                            f"score {score:g} for {name!r} is beyond any scale a metric may have "
                            f"(±{SCALE_BOUND:,})",
                        )
                    uses.append((plan, score, verdict.score is None, verdict.scale))
                    if verdict.score is None:
                        known.append((plan, verdict))
                side, field_name = (human, user_field) if verdict.human else (scores, judge_field)
                if key in side:
                    raise InvalidField(
                        source_field, f"evaluation {name!r} is given twice for the same answer"
                    )
                entry = side[key] = {"score": score, "reason": verdict_reason(verdict)}
                label = verdict.label
                if label and (label := label.strip()):
                    entry["label"] = label  # the judgment's structured label (`label_key`)
                where.fields.setdefault(field_name, source_field)
                if verdict.where:
                    where.places.setdefault(field_name, verdict.where)
        except InvalidField as exc:
            if on_invalid is None:
                raise located_failure(where, exc) from None
            on_invalid(index, located_failure(where, exc))
            continue
        record: dict[str, Any] = {
            "product": product,
            "question": ev.question,
            "model_answer": ev.answer,
            "judge_scores": scores,
        }
        if human:
            record["user_scores"] = human
        for name in ("model_name", "judge_model", "language", "created_at", "question_id"):
            value = getattr(ev, name)
            if value is not None:
                record[name] = value
        for plan, score, labelled, scale in uses:
            plan.add(score, labelled, scale)
        if on_rubric:
            uses_rubric.add(product)
        if known:
            by_label[len(records)] = known
        records.append((where, record))
        indexes.append(index)
        contributions.append((product, on_rubric, uses))
    planned = SourcePlan(
        definitions=_definitions(rubrics, plans, uses_rubric),
        records=records,
        indexes=indexes,
        rubrics=rubrics,
        contributions=contributions,
    )
    return _without_stray_labels(planned, by_label, on_invalid, via)


def _without_stray_labels(
    planned: SourcePlan,
    by_label: Mapping[int, list[tuple[_MetricPlan, SourceVerdict]]],
    on_invalid: Callable[[int, ImportFailed], None] | None,
    via: str,
) -> SourcePlan:
    """`planned` without the records whose known label scored a metric the import's other scores
    put on another scale than 0–1 (a file with `mood` 5 and `mood` `pass`: pass is not 1 of 0–5,
    review14 F8); raised, or handed to `on_invalid`, as `verdict_score` refuses a stored one."""
    strays: dict[int, ImportFailed] = {}
    for position, labelled in by_label.items():
        for plan, verdict in labelled:
            low, high = plan.final_scale()
            if (low, high) != (0, 1):
                number = label_score(verdict.label or "") or 0
                refusal = _off_scale(verdict, via, plan.name, low, high, number)
                strays[position] = located_failure(planned.records[position][0], refusal)
                break
    if not strays:
        return planned
    if on_invalid is None:
        raise strays[min(strays)]
    for position, failure in strays.items():
        on_invalid(planned.indexes[position], failure)
    kept = [position for position in range(len(planned.records)) if position not in strays]
    return SourcePlan(
        definitions=planned.definitions_without(strays),
        records=[planned.records[position] for position in kept],
        indexes=[planned.indexes[position] for position in kept],
        rubrics=planned.rubrics,
        contributions=[planned.contributions[position] for position in kept],
    )


def _definitions(
    rubrics: Mapping[Any, tuple[list[MetricSpec], bool, bool]],
    plans: Mapping[tuple[Any, str], _MetricPlan],
    uses_rubric: Collection[Any],
) -> list[dict[str, Any]]:
    """The definitions the scored plans write (a plan no accepted evaluation scored writes none)."""
    definitions: list[dict[str, Any]] = []
    for product, (specs, own, populated) in rubrics.items():
        ours = [plan for (p, _), plan in plans.items() if p == product and plan.scored]
        definitions.extend(filter(None, (_widened(product, plan) for plan in ours if plan.stored)))
        new = [plan for plan in ours if plan.stored is None]
        if not new:
            continue
        kept = specs if own or populated or product in uses_rubric else []
        if not own:
            definitions.extend({**_definition(product, spec), "position": i} for i, spec in enumerate(kept))
        definitions.extend(
            {**_new_definition(product, plan), "position": len(kept) + i} for i, plan in enumerate(new)
        )
    return definitions


def _definition(product: str, spec: MetricSpec) -> dict[str, Any]:
    return {
        "product": product, "slug": spec.slug, "display_name": spec.display_name, "min": spec.min_value,
        "max": spec.max_value, "integer_scale": spec.integer_scale, "description": spec.description,
    }  # fmt: skip


def _inferred_scale(plan: _MetricPlan) -> SourceScale:
    """The scale the scores imply: 0 (or the lowest score rounded down, when negative) up to the
    highest rounded up (3 gives 0–3), at least 1; whole when every score is."""
    low = min(0.0, math.floor(plan.low))
    high = max(1.0, math.ceil(plan.high))
    return SourceScale(low, high, integer_scale=plan.whole)


def _new_scale(plan: _MetricPlan) -> SourceScale:
    """A new metric's scale: the source's, else 0–1 for labels only, else the scores' (`_inferred_scale`)."""
    return plan.stated or (BINARY_SCALE if plan.labels_only else _inferred_scale(plan))


def _new_definition(product: str, plan: _MetricPlan) -> dict[str, Any]:
    return {
        "product": product, "slug": plan.slug, "display_name": plan.name[:200],
        "description": f"Imported evaluation {plan.name!r}.", **_scale_fields(_new_scale(plan)),
        # Only a scale inferred from the scores grows with later imports; a stated one is fixed.
        "scale_inferred": plan.stated is None and not plan.labels_only,
    }  # fmt: skip


def _widened(product: str, plan: _MetricPlan) -> dict[str, Any] | None:
    """The stored inferred metric with the scale this import's scores imply, which
    lib.metrics.upsert_metric_definitions adds to the stored one (widened, never narrowed); None
    when the scores fit the stored scale."""
    spec = plan.stored
    assert spec is not None
    if spec.min_value <= plan.low and plan.high <= spec.max_value and (plan.whole or not spec.integer_scale):
        return None
    return {
        "product": product, "slug": spec.slug, "display_name": spec.display_name,
        "description": spec.description, **_scale_fields(_inferred_scale(plan)), "scale_inferred": True,
    }  # fmt: skip


def _scale_fields(scale: SourceScale) -> dict[str, Any]:
    return {"min": scale.min_value, "max": scale.max_value, "integer_scale": scale.integer_scale}
