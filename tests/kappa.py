"""scikit-learn's Cohen's kappa, the tests' reference, imported where a test first computes one.

`sklearn.metrics` costs a process about 2 CPU s to import; imported by a test module, every xdist
worker paid it while collecting, including the browser worker that never runs those tests.
"""

from __future__ import annotations

from typing import Any


def cohen_kappa_score(*args: Any, **kwargs: Any) -> Any:
    """`sklearn.metrics.cohen_kappa_score`, same arguments."""
    from sklearn.metrics import cohen_kappa_score as kappa

    return kappa(*args, **kwargs)
