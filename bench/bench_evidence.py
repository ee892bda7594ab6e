"""Evidence verification of many quotes of one long answer: whitespace collapsed once vs per quote.

    .venv/bin/python bench/bench_evidence.py [--chars 200000] [--quotes 20] [--repeat 7]

Unverified quotes (the worst case: all five stages run) against an answer of `--chars`
characters. Per quote: `verify_evidence_item` for each item, which prepares the answer each time,
as every quote did before issue 19 item 7. Once per answer: `verify_evidence_items`, what the
importer and `verify_evidence_map` use. Prints the median milliseconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lib.evidence import verify_evidence_item, verify_evidence_items  # noqa: E402


def median_ms(run: object, repeat: int) -> float:
    """Median wall milliseconds of `run()` over `repeat` calls after one warm-up."""
    run()  # type: ignore[operator]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Time both ways and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=200_000)
    parser.add_argument("--quotes", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    sentence = "The answer  explains\tthe refund window,\n then the  exceptions. "
    answer = (sentence * (args.chars // len(sentence) + 1))[: args.chars]
    items = [{"quote": f"a sentence the answer never says, number {i}"} for i in range(args.quotes)]
    per_quote = median_ms(lambda: [verify_evidence_item(answer, item) for item in items], args.repeat)
    once = median_ms(lambda: verify_evidence_items(answer, items), args.repeat)
    print(
        f"{args.quotes} unverified quotes, {args.chars:,}-character answer: per quote {per_quote:.1f} ms "
        f"({per_quote / args.quotes:.2f} ms a quote), once per answer {once:.1f} ms "
        f"({once / args.quotes:.2f} ms a quote): {per_quote / once:.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
