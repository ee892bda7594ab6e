"""Streamed "Download CSV (all matches)" links (lib.downloads) on both backends, and the pages using them."""

from __future__ import annotations

import csv
import functools
import io
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlmodel import Session
from starlette.applications import Starlette
from starlette.testclient import TestClient

from lib import downloads, export
from lib.corrections import JudgmentFilter
from lib.importer import import_evaluations
from lib.inspector import EvaluationFilters
from tests.test_inspector import RECORDS


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(Starlette(routes=downloads.routes())) as c:
        yield c


@pytest.fixture
def seeded(engine: Engine) -> Engine:
    with Session(engine) as session:
        import_evaluations(session=session, records=RECORDS, reviewer="tester")
        session.commit()
    return engine


@pytest.mark.parametrize("form", ["wide", "long"])
def test_link_streams_the_same_csv_as_the_button(seeded: Engine, client: TestClient, form: str) -> None:
    filters = EvaluationFilters(product="beta")
    path = downloads.register(
        f"evaluations_{form}.csv",
        functools.partial(export.evaluations_csv_chunks, engine=seeded, filters=filters, form=form),
    )
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-disposition"] == f'attachment; filename="evaluations_{form}.csv"'
    assert response.headers["content-type"].startswith("text/csv")
    assert response.content == export.evaluations_csv_bytes(engine=seeded, filters=filters, form=form)
    assert {r["id"] for r in csv.DictReader(io.StringIO(response.text))} == {"s_c", "s_d"}


def test_link_streams_in_chunks(seeded: Engine, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "CSV_CHUNK_CHARS", 10)
    chunks = list(export.evaluations_csv_chunks(engine=seeded, filters=EvaluationFilters()))
    assert len(chunks) > 4  # header and every row handed on separately, not one buffer
    path = downloads.register(
        "e.csv", functools.partial(export.evaluations_csv_chunks, engine=seeded, filters=EvaluationFilters())
    )
    assert client.get(path).content == b"".join(chunks)


def test_corrections_link_streams_judgments(seeded: Engine, client: TestClient) -> None:
    path = downloads.register(
        "judgments.csv",
        functools.partial(export.judgments_csv_chunks, engine=seeded, filters=JudgmentFilter()),
    )
    rows = list(csv.DictReader(io.StringIO(client.get(path).text)))
    assert len(rows) == 7 and {r["state"] for r in rows} == {"unreviewed"}


def test_unknown_and_expired_links_say_what_to_do(client: TestClient) -> None:
    expired = downloads.register(
        "x.csv", lambda: iter([b"a"]), now=time.monotonic() - downloads.LINK_TTL_SECONDS - 1
    )
    for path in (f"{downloads.DOWNLOAD_PREFIX}/nope", expired):
        response = client.get(path)
        assert response.status_code == 404
        assert "expired or is unknown" in response.text


def test_file_names_cannot_break_the_header(client: TestClient) -> None:
    path = downloads.register('a"b\r\nc.csv', lambda: iter([b"x"]))
    assert client.get(path).headers["content-disposition"] == 'attachment; filename="a_b__c.csv"'
