"""A small client for the pipeline API (issue 13), standard library only: what a remote judge needs.

from lib.client import Client
api = Client("http://127.0.0.1:8501/api/v1", token="ovr_...")
api.push_evaluations(records)                # list of dicts, or JSONL bytes
history = api.history_prompt("tutor")        # the block `python -m lib history --format prompt` prints
notes = api.notes_prompt("en", tags=["math"])
api.review(change_id, decision="3", reason="too harsh")   # GETs the version, PATCHes with If-Match
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any


class ApiError(Exception):
    """A non-2xx answer: `status` and the server's `detail` (plus `body`, the whole JSON answer)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body
        self.detail = body.get("detail") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {self.detail}")


class Client:
    """Calls `base_url` (ending in /api/v1) with a bearer token; every method raises ApiError on failure."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 300.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the API address must be http:// or https://, got {base_url!r}")
        self.base_url, self.token, self.timeout = base_url.rstrip("/"), token, timeout

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None}, doseq=True)
        url = f"{self.base_url}{path}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, data=body, method=method)  # noqa: S310 - http(s) only
        request.add_header("Authorization", f"Bearer {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return response.read(), response.headers
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                detail: Any = json.loads(raw)
            except ValueError:
                detail = raw.decode("utf-8", "replace")
            raise ApiError(exc.code, detail) from None

    def _json(self, method: str, path: str, payload: Any = None, **kwargs: Any) -> Any:
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        raw, _ = self._call(method, path, body=body, headers=headers, **kwargs)
        return json.loads(raw)

    def push_evaluations(
        self,
        records: Iterable[Mapping[str, Any]] | bytes,
        *,
        judge: bool = False,
        concurrency: int | None = None,
    ) -> dict[str, Any]:
        """Import evaluations (all or nothing; re-pushing the same records inserts nothing), or with
        `judge=True` have Overrule's judge score questions and answers (re-pushing resumes)."""
        if isinstance(records, bytes):
            body = records
        else:
            body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
        params = {"judge": "true", "concurrency": concurrency} if judge else None
        raw, _ = self._call(
            "POST", "/evaluations", params=params, body=body, headers={"Content-Type": "application/x-ndjson"}
        )
        return json.loads(raw)

    def history_prompt(
        self,
        product: str,
        *,
        metric: str | None = None,
        max_entries: int | None = None,
        ratio: float | None = None,
    ) -> str:
        """The correction-history block a judge prompt for `product` gets, as the CLI prints it."""
        params = {"product": product, "metric": metric, "max_entries": max_entries, "ratio": ratio}
        raw, _ = self._call("GET", "/history", params={**params, "format": "prompt"})
        return raw.decode("utf-8")

    def notes_prompt(self, language: str, *, tags: Iterable[str] = (), session: str | None = None) -> str:
        """The notes block for a judge of `language` (and context tags), as the CLI prints it."""
        params = {"language": language, "tags": list(tags), "session": session, "format": "prompt"}
        raw, _ = self._call("GET", "/notes", params=params)
        return raw.decode("utf-8")

    def add_note(self, content: str, *, note_type: str, language: str = "", **fields: Any) -> dict[str, Any]:
        """Add one note (`code`, `confidence`, `session` optional); it records the token's name."""
        return self._json(
            "POST", "/notes", {"content": content, "type": note_type, "language": language, **fields}
        )

    def record_shown_notes(
        self, session_id: str, shown_note_ids: Iterable[int], tags: Iterable[str] = (), **extra: Any
    ) -> dict[str, Any]:
        """Tell Overrule which notes a remote judge run showed, under which tags (feeds tag relevance);
        `product`, `snapshot_id` and `transcript` may go in `extra`. Idempotent per session id."""
        payload = {"session_id": session_id, "shown_note_ids": list(shown_note_ids), "tags": list(tags)}
        return self._json("POST", "/relevance/audits", {**payload, **extra})

    def record_scores(self, session_id: str, scores: Mapping[int, float]) -> dict[str, Any]:
        """A remote evaluator's scores (-1..1) for the notes an audited run showed; applied once."""
        return self._json(
            "POST",
            "/relevance/scores",
            {"session_id": session_id, "scores": {str(k): v for k, v in scores.items()}},
        )

    def review(
        self,
        change_id: str,
        *,
        action: str = "overrule",
        decision: str | None = None,
        reason: str | None = None,
        version: int | None = None,
    ) -> dict[str, Any]:
        """Confirm (`action="confirm"`) or overrule a judgment as of `version` (fetched first when not
        given); ApiError 409 when another reviewer changed it meanwhile, with their decision."""
        path = f"/judgments/{urllib.parse.quote(change_id)}"
        if version is None:
            version = int(self._json("GET", path)["version"])
        body = {"action": action, "decision": decision, "reason": reason}
        return self._json("PATCH", path, body, headers={"If-Match": f'"{version}"'})
