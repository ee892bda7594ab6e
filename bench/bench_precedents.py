"""Auto-evaluation by precedent at scale: the vectorised neighbour search vs today's per-row loop.

    .venv/bin/python bench/bench_precedents.py                          # 10k and 100k precedents
    .venv/bin/python bench/bench_precedents.py --precedents 10000 --new 200

For each size a SQLite database in bench/out/ gets N expert-reviewed precedents (synthetic
help-centre answers, offline hashing embeddings stored as packed float32) and `--new` (1,000)
unreviewed interactions: half near-copies of a precedent (they match), half unrelated.

1. Neighbour search. New: `PrecedentIndex.load` once per run (timed separately), then
   `find_qa_matches(..., index=index)` for every new interaction. Baseline: the per-row loop the
   repository had before this change (`loop_qa_matches`, kept verbatim below): every expert
   feedback and every precedent row read through the ORM, and a Python cosine per precedent, for
   each interaction. The loop is too slow to run 1,000 times at 100k, so it runs on a sample
   (`--loop-sample`) and its per-interaction median is compared; both must return the same ids.
2. Worker pool. `evaluate_ids` on the new interactions with 1 worker vs `--workers` (default: CPU
   count): once offline (CPU-bound hashing, numpy, SQLite writes), and once with `--force-fallback`
   against the local test LLM server answering each comparison after `--llm-latency` seconds
   (I/O-bound, as with a real LLM).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/bench_precedents.py` from anywhere
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, insert, select  # noqa: E402
from sqlmodel import Session, col  # noqa: E402

from lib import precedents  # noqa: E402
from lib.config import reset_settings  # noqa: E402
from lib.db import init_db, session_scope  # noqa: E402
from lib.models import AutoEval, ExpertFeedback, Interaction, utcnow  # noqa: E402

OUT = ROOT / "bench" / "out"
CITE = "https://help.acme.test/article/{n}"


def loop_qa_matches(
    session: Session, interaction: Interaction, limit: int = 10, threshold: float = 0.85
) -> list[tuple[str, float]]:
    """The repository's find_qa_matches before the index (vectors read per row, cosine in Python)."""
    rows = session.execute(
        select(ExpertFeedback)
        .where(ExpertFeedback.type == "expert", ExpertFeedback.interaction_id != interaction.id)
        .order_by(col(ExpertFeedback.created_at), col(ExpertFeedback.id))
    ).scalars()
    feedback = {fb.interaction_id: fb for fb in rows}
    if not feedback:
        return []
    neighbours = list(
        session.execute(select(Interaction).where(col(Interaction.id).in_(list(feedback)))).scalars()
    )
    mine = precedents.unpack_vector(interaction.qa_vector)
    mine_list = mine.tolist() if mine is not None else []
    scored = []
    for n in neighbours:
        vector = precedents.unpack_vector(n.qa_vector)
        scored.append((n.id, precedents.cosine(mine_list, vector.tolist() if vector is not None else [])))
    scored.sort(key=lambda m: (-m[1], m[0]))
    return [m for m in scored[:limit] if m[1] >= threshold]


def _vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    syllables = ["ka", "ro", "mi", "tel", "sun", "dra", "po", "vek", "lin", "sa", "gor", "ne", "fi", "ust"]
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def _sentence(rng: random.Random, words: list[str]) -> str:
    return " ".join(rng.choice(words) for _ in range(rng.randint(8, 13))).capitalize() + "."


def build(path: Path, n_precedents: int, n_new: int, seed: int = 3) -> Engine:
    """A database with the precedents (vectors stored) and the new interactions (vectors not yet)."""
    if path.exists():
        path.unlink()
    engine = init_db(f"sqlite:///{path}")
    rng = random.Random(seed)
    words = _vocabulary(rng)
    now = utcnow()
    prec_rows, feedback_rows, texts = [], [], []
    for n in range(n_precedents):
        question = _sentence(rng, words).rstrip(".") + "?"
        sentences = [_sentence(rng, words) for _ in range(rng.randint(2, 3))]
        answer = " ".join(sentences)
        texts.append((question, sentences))
        vector = precedents.hashing_embedding(f"{question}\n{answer}")
        prec_rows.append(
            {
                "id": f"p{n:06d}",
                "product": "acme",
                "language": "en",
                "question": question,
                "answer": answer,
                "citation_url": CITE.format(n=n % 500),
                "citations": [],
                "qa_vector": precedents.pack_vector(vector),
                "created_at": now,
            }
        )
        scores = [{"sentence": s, "score": rng.choice([60, 80, 90, 100])} for s in sentences]
        feedback_rows.append(
            {
                "interaction_id": f"p{n:06d}",
                "type": "expert",
                "total_score": 95.0,
                "citation_score": 20.0,
                "citation_url": CITE.format(n=n % 500),
                "sentence_scores": scores,
                "reviewer": "bench",
                "created_at": now,
            }
        )
    new_rows = []
    for n in range(n_new):
        if n % 2 == 0:
            source = rng.randrange(n_precedents)
            question, sentences = texts[source]
            answer = " ".join(sentences)
            cite = CITE.format(n=source % 500)
        else:
            question = _sentence(rng, words).rstrip(".") + "?"
            answer = " ".join(_sentence(rng, words) for _ in range(2))
            cite = CITE.format(n=n % 500)
        new_rows.append(
            {
                "id": f"n{n:05d}",
                "product": "acme",
                "language": "en",
                "question": question,
                "answer": answer,
                "citation_url": cite,
                "citations": [],
                "qa_vector": None,
                "created_at": now,
            }
        )
    with session_scope(engine) as session:
        for start in range(0, len(prec_rows), 5000):
            session.execute(insert(Interaction), prec_rows[start : start + 5000])
            session.execute(insert(ExpertFeedback), feedback_rows[start : start + 5000])
        session.execute(insert(Interaction), new_rows)
    return engine


def new_ids(engine: Engine) -> list[str]:
    with Session(engine) as session:
        return list(session.execute(select(Interaction.id).where(col(Interaction.id).like("n%"))).scalars())


def clear_results(engine: Engine) -> None:
    with session_scope(engine) as session:
        precedents.delete_auto_evals(session=session)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def bench_search(engine: Engine, ids: list[str], loop_sample: int) -> dict[str, float]:
    load_s, index = timed(lambda: precedents.load_index(engine))
    per_new: list[float] = []
    found_new: dict[str, list[str]] = {}
    with Session(engine) as session:
        for iid in ids:
            interaction = session.get(Interaction, iid)
            assert interaction is not None
            precedents.ensure_qa_vectors(session=session, interactions=[interaction], dim=index.dim)
            seconds, matches = timed(
                lambda i=interaction: precedents.find_qa_matches(session=session, interaction=i, index=index)
            )
            per_new.append(seconds)
            found_new[iid] = [m.interaction.id for m in matches]
        session.commit()  # the new interactions' vectors, so the loop compares the same ones
    per_loop: list[float] = []
    with Session(engine) as session:
        for iid in ids[:loop_sample]:
            interaction = session.get(Interaction, iid)
            assert interaction is not None
            seconds, matches = timed(lambda i=interaction: loop_qa_matches(session, i))
            per_loop.append(seconds)
            assert [m[0] for m in matches] == found_new[iid], f"{iid}: the index and the loop disagree"
            session.expunge_all()
    matched = sum(1 for v in found_new.values() if v)
    return {
        "index_load_s": load_s,
        "new_median_ms": statistics.median(per_new) * 1000,
        "new_total_s": sum(per_new) + load_s,
        "loop_median_ms": statistics.median(per_loop) * 1000,
        "loop_total_est_s": statistics.median(per_loop) * len(ids),
        "with_match": matched,
    }


def bench_pool(engine: Engine, ids: list[str], workers: int, force_fallback: bool) -> dict[int, float]:
    out = {}
    for n in (1, workers):
        clear_results(engine)
        seconds, summary = timed(
            lambda n=n: precedents.evaluate_ids(engine, ids, concurrency=n, force_fallback=force_fallback)
        )
        assert summary.evaluated == len(ids), summary
        out[n] = seconds
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--precedents", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--new", type=int, default=1000)
    parser.add_argument("--loop-sample", type=int, default=20)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--llm-latency", type=float, default=0.05)
    parser.add_argument("--pool-new", type=int, default=200, help="interactions per pool run")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"CPUs: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    for size in args.precedents:
        build_s, engine = timed(lambda size=size: build(OUT / f"precedents_{size}.db", size, args.new))
        ids = new_ids(engine)
        print(f"\n== {size:,} precedents, {len(ids):,} new interactions (built in {build_s:.0f} s)")
        r = bench_search(engine, ids, args.loop_sample)
        print(
            f"neighbour search: index load {r['index_load_s']:.2f} s once; per interaction "
            f"{r['new_median_ms']:.2f} ms (index) vs {r['loop_median_ms']:.1f} ms (per-row loop, "
            f"{args.loop_sample} sampled) → ratio {r['loop_median_ms'] / r['new_median_ms']:.0f}x per search"
        )
        print(
            f"  all {len(ids)} interactions: {r['new_total_s']:.1f} s with the index (load included) vs "
            f"~{r['loop_total_est_s']:.0f} s estimated for the loop → ratio "
            f"{r['loop_total_est_s'] / r['new_total_s']:.0f}x; {r['with_match']} had a QA match"
        )
        pool_ids = ids[: args.pool_new]
        offline = bench_pool(engine, pool_ids, args.workers, force_fallback=False)
        print(
            f"pool, offline ({len(pool_ids)} interactions): 1 worker {offline[1]:.1f} s, "
            f"{args.workers} workers {offline[args.workers]:.1f} s → {offline[1] / offline[args.workers]:.2f}x"
        )
        from tests.llm_server import json_reply, start_llm_server

        def slow_pass(_body: dict[str, Any]) -> Any:
            time.sleep(args.llm_latency)
            return json_reply({"pass": True, "reason": "same advice"})

        server = start_llm_server(responder=slow_pass)
        os.environ.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="bench")
        reset_settings()
        try:
            llm_run = bench_pool(engine, pool_ids, args.workers, force_fallback=True)
        finally:
            server.stop()
            del os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
            reset_settings()
        print(
            f"pool, --force-fallback with a {args.llm_latency * 1000:.0f} ms LLM: 1 worker {llm_run[1]:.1f} s, "
            f"{args.workers} workers {llm_run[args.workers]:.1f} s → {llm_run[1] / llm_run[args.workers]:.2f}x"
        )
        with Session(engine) as session:
            count = session.execute(select(AutoEval.id)).all()
        print(f"  ({len(count)} AutoEval rows after the last run)")
        engine.dispose()


if __name__ == "__main__":
    main()
