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
- tag relevance is replayed in memory with `lib.relevance`'s own pure steps (`tag_step`,
  `auto_pin_decision`, `manual_pin_state`): the API's per-row locking is too slow for a first start;
- auto-evaluations are `lib.precedents.evaluate_interaction`'s own results (offline, no LLM);
- the alignment experiment is `lib.alignment`'s own run against a scripted judge on the local
  server of `lib.scripted_llm` (`experiment`); its scores are deterministic, its run times are the
  real ones of the first start.

`force`: the demo is normally loaded only into a database without evaluations. With `force=True`
it is loaded anyway, and every demo row is identified by a deterministic key (snapshot id and
source key, change id, note session+time+content, audit session id, interaction id): rows already
present are left untouched, so a forced load never duplicates anything and returns the number of
rows it actually added.

Parts (one module each): `inputs` (the JSON inputs, the anchor, seeded random streams),
`evaluations`, `reviews` (reviews and the seed-004 judgments), `notes` (notes, session audits and
tag relevance), `precedents`, `experiment` (the scripted-judge alignment experiment) and `load`
(`load_demo`). The names below are the public surface.
"""

from lib.demo.evaluations import DemoEvaluations, EvaluationTruth, build_evaluations, flaw_quote
from lib.demo.inputs import DEMO_AUTHOR, DEMO_DIR, DEMO_SEED, demo_anchor
from lib.demo.load import load_demo
from lib.demo.notes import (
    DemoNotes,
    DemoSession,
    RelevancePlan,
    RelevanceReplay,
    build_notes,
    plan_relevance,
    replay_relevance,
)
from lib.demo.precedents import DemoPrecedents, build_precedents
from lib.demo.reviews import PlannedReview, build_cache_judgments, plan_reviews

__all__ = [
    "DEMO_AUTHOR",
    "DEMO_DIR",
    "DEMO_SEED",
    "DemoEvaluations",
    "DemoNotes",
    "DemoPrecedents",
    "DemoSession",
    "EvaluationTruth",
    "PlannedReview",
    "RelevancePlan",
    "RelevanceReplay",
    "build_cache_judgments",
    "build_evaluations",
    "build_notes",
    "build_precedents",
    "demo_anchor",
    "flaw_quote",
    "load_demo",
    "plan_relevance",
    "plan_reviews",
    "replay_relevance",
]
