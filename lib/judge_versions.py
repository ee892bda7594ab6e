"""Judge versions (issue 28): which judge made each judgment.

A version is one configuration of a product's judge: the judge model, the rubric as it was (every
metric's display name, scale and text), the identity of the prompt templates (a hash of the
scoring and mentoring templates), the correction-history and notes settings (entries, correction
ratio, notes limit, tag relevance on or off), the temperature and the reply caps.

- **Content-addressed.** A complete configuration is identified by its content: the same
  configuration twice is one version, whatever it is called; changing any field makes another.
  A judge that runs elsewhere may name only some fields (or none); such a partial version is
  identified by its name and what it names.
- **Names.** A lead names versions ("v3: stricter clarity rubric"); one made by the judge itself
  gets "v<n>" and a short account of what changed since the product's previous version.
- **Unversioned.** Rows written without a version (older data, imports that name none) belong
  to the product's "unversioned" bucket, id `UNVERSIONED` (0) wherever an id is needed.

This module holds the records, their hash, their differences and the `judge_version` field of
imports and the API. The built-in judge derives its configuration in `lib.judge`; rubric edits,
promotions from the lab and re-judging live in `lib.judge_changes`; agreement per version in
`lib.version_agreement`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, TypeVar

import pandas as pd
from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from lib.auth import Actor, Permission, authorize, record_event
from lib.config import setting_range
from lib.judgment_text import UNVERSIONED_NAME as UNVERSIONED_NAME  # their home; imported from here
from lib.judgment_text import name_for as name_for
from lib.metrics import SCALE_BOUND, MetricSpec, parse_metric_definition
from lib.models import UNVERSIONED, JudgeConfigFields, JudgeVersion, ProductJudge, utcnow

NAME_LIMIT = 200
# The fields of a configuration, in the order tables and diffs show them, with their labels
# (`JudgeConfigFields`' titles).
FIELD_LABELS: dict[str, str] = {
    name: str(info.title) for name, info in JudgeConfigFields.model_fields.items()
}
# The audit trail's action for a change of a product's judge: a rubric save, a promotion, a version made current.
AUDIT_ACTION = "judge_changed"
# The server setting (lib.config) each option of a version stands for: the built-in judge runs with
# the product's current version's value in its place (`lib.judge.builtin_config`, `settings_for`),
# and a version's value keeps that setting's bounds (`option_range`). Tag relevance has no setting.
OPTION_SETTINGS: dict[str, str] = {
    "judge_model": "judge_model",
    "history_entries": "history_max_entries",
    "history_ratio": "history_correction_ratio",
    "notes_limit": "notes_limit",
    "temperature": "judge_temperature",
    "max_tokens_judge": "max_tokens_judge",
    "max_tokens_mentor": "max_tokens_mentor",
}
RUBRIC_KEYS = ("slug", "display_name", "min", "max", "integer_scale", "description")


class VersionError(ValueError):
    """A judge version that cannot be made, found or used as asked; the message says what to fix."""


# ---------------------------------------------------------------------------------------------
# The configuration


def rubric_entries(metrics: Iterable[MetricSpec]) -> tuple[dict[str, Any], ...]:
    """A rubric as stored in a version: every metric's slug, display name, scale and text, in order."""
    return tuple(
        {
            "slug": m.slug,
            "display_name": m.display_name,
            "min": float(m.min_value),
            "max": float(m.max_value),
            "integer_scale": bool(m.integer_scale),
            "description": m.description,
        }
        for m in metrics
    )


def rubric_specs(entries: Iterable[Mapping[str, Any]]) -> list[MetricSpec]:
    """A stored rubric back as metric specs (the judge's and the detail page's shape)."""
    return [
        MetricSpec(
            slug=str(e["slug"]),
            display_name=str(e["display_name"]),
            min_value=float(e["min"]),
            max_value=float(e["max"]),
            integer_scale=bool(e["integer_scale"]),
            description=str(e.get("description") or ""),
        )
        for e in entries
    ]


def version_rubric(session: Session, version_id: int | None) -> list[MetricSpec]:
    """The rubric a version judged under ([] when unversioned, unknown or it did not say): how a
    metric since removed from the product's rubric is still shown and reviewed."""
    version = session.get(JudgeVersion, version_id) if version_id else None
    return rubric_specs(version.rubric) if version is not None and version.rubric else []


_Cls = TypeVar("_Cls", bound=type)


def _with_config_fields(cls: _Cls) -> _Cls:
    """Annotate `cls` with one field per `JudgeConfigFields` column, of the column's type and
    default None (the rubric a tuple, not the row's JSON list, so a configuration holds no list to
    mutate): the configuration's fields are declared once, where the table's columns are."""
    annotations: dict[str, Any] = {}
    for name, info in JudgeConfigFields.model_fields.items():
        annotations[name] = tuple[dict[str, Any], ...] | None if name == "rubric" else info.annotation
        setattr(cls, name, None)
    cls.__annotations__ = annotations
    return cls


@dataclass(frozen=True)
@_with_config_fields
class JudgeConfig:
    """What a judge version records (the fields of `lib.models.JudgeConfigFields`); None for a
    field a judge that runs elsewhere did not name."""

    @property
    def complete(self) -> bool:
        """Every field known: the configuration the built-in judge can run."""
        return all(getattr(self, f.name) is not None for f in fields(self))

    @property
    def empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def canonical(self) -> dict[str, Any]:
        """The fields as plain JSON values, numbers normalised so 20 and 20.0 hash alike."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "rubric" and value is not None:
                value = [{k: _plain(entry.get(k)) for k in RUBRIC_KEYS} for entry in value]
            else:
                value = _plain(value)
            out[f.name] = value
        return out

    @classmethod
    def of(cls, version: JudgeVersion) -> JudgeConfig:
        """A stored version's configuration (`columns` is the way back)."""
        values = {f.name: getattr(version, f.name) for f in fields(cls)}
        if values["rubric"] is not None:
            values["rubric"] = tuple(dict(e) for e in values["rubric"])
        return cls(**values)

    def columns(self) -> dict[str, Any]:
        """The configuration as `JudgeVersion` columns (`of` is the way back): every field, so a
        field added here is stored without a second list to extend."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.rubric is not None:
            values["rubric"] = [dict(e) for e in self.rubric]
        return values

    def specs(self) -> list[MetricSpec]:
        """The rubric as metric specs ([] when this version does not say)."""
        return rubric_specs(self.rubric or ())


def _plain(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        number = float(value)
        return int(number) if number.is_integer() else number
    return value


def content_hash(config: JudgeConfig, name: str | None = None) -> str:
    """The version's identity: SHA-256 of its canonical fields; a partial one's also of its name."""
    payload: dict[str, Any] = {"config": config.canonical()}
    if not config.complete:
        payload["name"] = (name or "").strip()
    text = json.dumps(payload, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


# ---------------------------------------------------------------------------------------------
# Differences


@dataclass(frozen=True)
class Change:
    """One difference between two versions: a field, or one attribute of one rubric metric."""

    field: str
    label: str
    before: str
    after: str
    detail: str = ""  # a unified diff of rubric text, when the text changed
    metric: str = ""  # the rubric metric's slug, when the change is one metric's (`field` says it too)


METRIC_ADDED = "Metric added"  # the labels of a metric's arrival and departure (audit texts read them)
METRIC_REMOVED = "Metric removed"


def _shown(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _scale_text(entry: Mapping[str, Any]) -> str:
    spec = rubric_specs([entry])[0]
    return spec.scale_label()


def rubric_changes(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[Change]:
    """Metric by metric: added, removed, renamed, rescaled, text changed (with its line diff), moved."""
    old = {e["slug"]: e for e in before}
    new = {e["slug"]: e for e in after}
    out: list[Change] = []
    for slug in [*new, *(s for s in old if s not in new)]:
        a, b = old.get(slug), new.get(slug)
        where = f"rubric: {slug}"
        if a is None and b is not None:
            out.append(
                Change(where, METRIC_ADDED, "—", f"{b['display_name']} ({_scale_text(b)})", metric=slug)
            )
            continue
        if b is None and a is not None:
            out.append(
                Change(where, METRIC_REMOVED, f"{a['display_name']} ({_scale_text(a)})", "—", metric=slug)
            )
            continue
        assert a is not None and b is not None
        if a["display_name"] != b["display_name"]:
            out.append(Change(where, "Display name", a["display_name"], b["display_name"], metric=slug))
        if _scale_text(a) != _scale_text(b):
            out.append(Change(where, "Scale", _scale_text(a), _scale_text(b), metric=slug))
        old_text, new_text = str(a.get("description") or ""), str(b.get("description") or "")
        if old_text != new_text:
            lines = difflib.unified_diff(
                old_text.splitlines(), new_text.splitlines(), "before", "after", lineterm="", n=1
            )
            out.append(Change(where, "Rubric text", old_text, new_text, "\n".join(lines), metric=slug))
    if [e["slug"] for e in before if e["slug"] in new] != [e["slug"] for e in after if e["slug"] in old]:
        out.append(
            Change(
                "rubric",
                "Metric order",
                ", ".join(e["slug"] for e in before),
                ", ".join(e["slug"] for e in after),
            )
        )
    return out


def config_changes(before: JudgeConfig | None, after: JudgeConfig) -> list[Change]:
    """What changed from `before` to `after`, field by field (the rubric metric by metric)."""
    base = before or JudgeConfig()
    out: list[Change] = []
    for name, label in FIELD_LABELS.items():
        a, b = getattr(base, name), getattr(after, name)
        if name == "rubric":
            if a is not None and b is not None:
                out.extend(rubric_changes(a, b))
            elif a != b:
                out.append(Change(name, label, _rubric_summary(a), _rubric_summary(b)))
            continue
        if _plain(a) != _plain(b):
            out.append(Change(name, label, _shown(a), _shown(b)))
    return out


def _rubric_summary(rubric: Sequence[Mapping[str, Any]] | None) -> str:
    if rubric is None:
        return "—"
    return ", ".join(f"{e['slug']} ({_scale_text(e)})" for e in rubric)


def summarize_changes(changes: Sequence[Change], limit: int = 80) -> str:
    """A few words on what changed, for an automatic version name ("judge model gpt-4o-mini")."""
    parts: list[str] = []
    for change in changes:
        if change.field.startswith("rubric"):
            slug = change.field.partition(": ")[2]
            part = f"rubric {slug}".strip() if slug else "rubric"
        elif change.field == "prompt_hash":
            part = "prompt templates"
        else:
            part = f"{change.label.lower()} {change.after}"
        if part not in parts:
            parts.append(part)
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def changes_frame(changes: Sequence[Change]) -> pd.DataFrame:
    """The differences as a table (what the page shows and its CSV holds)."""
    return pd.DataFrame(
        [{"what": c.field, "change": c.label, "before": c.before, "after": c.after} for c in changes],
        columns=["what", "change", "before", "after"],
    )


# ---------------------------------------------------------------------------------------------
# Records


def _newest(session: Session, product: str) -> JudgeVersion | None:
    return session.exec(
        select(JudgeVersion)
        .where(col(JudgeVersion.product) == product)
        .order_by(col(JudgeVersion.id).desc())
        .limit(1)
    ).first()


def version_by_name(session: Session, product: str, name: str) -> JudgeVersion | None:
    """The product's version of this name, or None."""
    return session.exec(
        select(JudgeVersion).where(
            col(JudgeVersion.product) == product, col(JudgeVersion.name) == name.strip()
        )
    ).first()


def require_version(session: Session, product: str, name: str) -> JudgeVersion:
    """The product's version of this name; VersionError naming the versions that exist otherwise."""
    found = version_by_name(session, product, name)
    if found is not None:
        return found
    known = [v.name for v in versions_of(session, product)]
    listed = ", ".join(repr(n) for n in known[-8:]) if known else "none yet"
    raise VersionError(f"product {product!r} has no judge version named {name!r} (its versions: {listed})")


def versions_of(session: Session, product: str) -> list[JudgeVersion]:
    """A product's versions, oldest first."""
    return list(
        session.exec(
            select(JudgeVersion).where(col(JudgeVersion.product) == product).order_by(col(JudgeVersion.id))
        ).all()
    )


def versions_by_id(session: Session, ids: Iterable[int]) -> dict[int, JudgeVersion]:
    """Versions by id (the unversioned id is left out)."""
    wanted = sorted({int(i) for i in ids if i})
    out: dict[int, JudgeVersion] = {}
    for start in range(0, len(wanted), 500):
        part = wanted[start : start + 500]
        for row in session.exec(select(JudgeVersion).where(col(JudgeVersion.id).in_(part))).all():
            assert row.id is not None
            out[row.id] = row
    return out


def version_label(version: JudgeVersion | None) -> str:
    """How a page, CSV or CLI names a version: its name, or "unversioned"."""
    return UNVERSIONED_NAME if version is None else version.name


def next_auto_name(session: Session, product: str) -> str:
    """Names "v<n>": one more than the product's versions, moved on past any name already taken."""
    count = session.exec(select(func.count()).where(col(JudgeVersion.product) == product)).one()
    n = int(count) + 1
    taken = {
        str(name)
        for name in session.exec(
            select(JudgeVersion.name).where(
                col(JudgeVersion.product) == product, col(JudgeVersion.name).like("v%")
            )
        ).all()
    }
    while any(t == f"v{n}" or t.startswith(f"v{n}:") for t in taken):
        n += 1
    return f"v{n}"


def check_name(name: str) -> str:
    """A version name as stored (trimmed); VersionError when empty, too long or "unversioned"."""
    name = (name or "").strip()
    if not name:
        raise VersionError("a judge version needs a name")
    if len(name) > NAME_LIMIT:
        raise VersionError(f"a judge version's name is at most {NAME_LIMIT} characters ({len(name)} given)")
    if name.lower() == UNVERSIONED_NAME:
        raise VersionError(f"{UNVERSIONED_NAME!r} names the rows without a version; choose another name")
    if "\x00" in name:
        raise VersionError("a judge version's name cannot contain a NUL character")
    return name


@dataclass(frozen=True)
class Ensured:
    """A version found or made by `ensure_version`, and whether this call made it."""

    version: JudgeVersion
    created: bool

    @property
    def id(self) -> int:
        assert self.version.id is not None
        return self.version.id


def find_version(
    session: Session, product: str, config: JudgeConfig, name: str | None = None
) -> JudgeVersion | None:
    """The stored version of exactly this configuration (and name, for a partial one), or None."""
    digest = content_hash(config, name)
    return session.exec(
        select(JudgeVersion).where(
            col(JudgeVersion.product) == product, col(JudgeVersion.content_hash) == digest
        )
    ).first()


def ensure_version(
    *,
    session: Session,
    product: str,
    config: JudgeConfig,
    created_by: str,
    origin: str = "judge",
    name: str | None = None,
    description: str = "",
    experiment_id: int | None = None,
    experiment_arm: str | None = None,
) -> Ensured:
    """The product's version of this configuration, made (named `name`, or "v<n>: what changed") when new.

    The same configuration is always the same version: asking again, under any name, returns the
    stored one (`created` False). A new version takes the product's newest as its previous one, for
    the diff. Two writers making the same version at once both get the one row (the unique hash).
    """
    product = product.strip()
    if not product:
        raise VersionError("a judge version belongs to a product; none was given")
    if name is not None:
        name = check_name(name)
    if config.empty and not name:
        raise VersionError("a judge version without any field needs a name")
    found = find_version(session, product, config, name)
    if found is not None:
        return Ensured(found, False)
    previous = _newest(session, product)
    if name is None:
        summary = summarize_changes(config_changes(JudgeConfig.of(previous) if previous else None, config))
        name = next_auto_name(session, product) + (f": {summary}" if previous and summary else "")
        name = name[:NAME_LIMIT]
    elif version_by_name(session, product, name) is not None:
        raise VersionError(
            f"product {product!r} already has a judge version named {name!r} with another configuration; "
            "choose another name"
        )
    row = JudgeVersion(
        product=product,
        name=name,
        content_hash=content_hash(config, name),
        complete=config.complete,
        **config.columns(),
        origin=origin,
        description=description.strip(),
        previous_id=previous.id if previous else None,
        experiment_id=experiment_id,
        experiment_arm=experiment_arm,
        created_by=created_by,
        created_at=utcnow(),
    )
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        # Another writer made it (or took the name) between our read and our insert.
        found = find_version(session, product, config, name)
        if found is not None:
            return Ensured(found, False)
        raise VersionError(f"product {product!r} already has a judge version named {name!r}") from None
    return Ensured(row, True)


def previous_of(session: Session, version: JudgeVersion) -> JudgeVersion | None:
    """The version this one was made after (the product's newest at the time), or None."""
    return session.get(JudgeVersion, version.previous_id) if version.previous_id else None


def changes_since_previous(session: Session, version: JudgeVersion) -> list[Change]:
    """The version's diff against the one before it."""
    previous = previous_of(session, version)
    return config_changes(JudgeConfig.of(previous) if previous else None, JudgeConfig.of(version))


# ---------------------------------------------------------------------------------------------
# A product's current options


def current_options(session: Session, product: str) -> JudgeVersion | None:
    """The version whose options a lead made current for the product, or None (the server's settings)."""
    pinned = session.get(ProductJudge, product)
    return session.get(JudgeVersion, pinned.judge_version_id) if pinned else None


def set_current_options(*, session: Session, version: JudgeVersion, set_by: Actor | str) -> None:
    """Make `version`'s options (model, history, notes, temperature, caps) the product's judge's (a lead)."""
    set_by = authorize(session, set_by, Permission.JUDGE).identity
    if not version.complete:
        raise VersionError(
            f"version {version.name!r} does not name every field (an outside judge's), so the built-in "
            "judge cannot run with it"
        )
    assert version.id is not None
    pinned = session.get(ProductJudge, version.product)
    if pinned is None:
        pinned = ProductJudge(product=version.product, judge_version_id=version.id, set_by=set_by)
    pinned.judge_version_id, pinned.set_by, pinned.set_at = version.id, set_by, utcnow()
    session.add(pinned)
    record_change(
        session=session, identity=set_by, product=version.product, what=f"{version.name} made current"
    )
    session.flush()


def record_change(*, session: Session, identity: str, product: str, what: str) -> None:
    """The audit trail's row for a change of a product's judge (a rubric saved, a version promoted or
    made current, an import widening a metric's inferred scale): "PRODUCT: WHAT", action
    `AUDIT_ACTION`, so a lead reads every change of what the judge scores against in one place."""
    record_event(session=session, identity=identity, action=AUDIT_ACTION, detail=f"{product}: {what}")


def clear_current_options(*, session: Session, product: str) -> bool:
    """Go back to the server's settings for the product's judge; False when none were pinned."""
    pinned = session.get(ProductJudge, product)
    if pinned is None:
        return False
    session.delete(pinned)
    session.flush()
    return True


# ---------------------------------------------------------------------------------------------
# Tables


VERSION_COLUMNS = [
    "product", "version_id", "name", "origin", "complete", "judge_model", "prompt_hash", "rubric_metrics",
    "history_entries", "history_ratio", "notes_limit", "relevance", "temperature", "max_tokens_judge",
    "max_tokens_mentor", "previous", "changes", "experiment_id", "experiment_arm", "description",
    "created_by", "created_at", "current",
]  # fmt: skip


def versions_frame(session: Session, products: Sequence[str] = ()) -> pd.DataFrame:
    """Every version (of `products`, or all), oldest first per product, with what changed since the previous."""
    stmt = select(JudgeVersion).order_by(col(JudgeVersion.product), col(JudgeVersion.id))
    if products:
        stmt = stmt.where(col(JudgeVersion.product).in_(list(products)))
    rows = list(session.exec(stmt).all())
    by_id = {r.id: r for r in rows}
    current = {p.product: p.judge_version_id for p in session.exec(select(ProductJudge)).all()}
    out = []
    for v in rows:
        previous = by_id.get(v.previous_id) if v.previous_id else None
        if v.previous_id and previous is None:
            previous = session.get(JudgeVersion, v.previous_id)
        changes = config_changes(JudgeConfig.of(previous) if previous else None, JudgeConfig.of(v))
        out.append(
            {
                "product": v.product,
                "version_id": v.id,
                "name": v.name,
                "origin": v.origin,
                "complete": v.complete,
                "judge_model": v.judge_model,
                "prompt_hash": (v.prompt_hash or "")[:12] or None,
                "rubric_metrics": ", ".join(e["slug"] for e in v.rubric) if v.rubric else None,
                "history_entries": v.history_entries,
                "history_ratio": v.history_ratio,
                "notes_limit": v.notes_limit,
                "relevance": v.relevance,
                "temperature": v.temperature,
                "max_tokens_judge": v.max_tokens_judge,
                "max_tokens_mentor": v.max_tokens_mentor,
                "previous": previous.name if previous else None,
                "changes": summarize_changes(changes, limit=200) if previous else "first version",
                "experiment_id": v.experiment_id,
                "experiment_arm": v.experiment_arm,
                "description": v.description,
                "created_by": v.created_by,
                "created_at": v.created_at,
                "current": current.get(v.product) == v.id,
            }
        )
    return pd.DataFrame(out, columns=VERSION_COLUMNS)


def version_record(version: JudgeVersion, *, changes: Sequence[Change] | None = None) -> dict[str, Any]:
    """A version as JSON (CLI and API): every field, and its diff when given."""
    record: dict[str, Any] = {
        "id": version.id,
        "product": version.product,
        "name": version.name,
        "content_hash": version.content_hash,
        "complete": version.complete,
        **JudgeConfig.of(version).canonical(),
        "origin": version.origin,
        "description": version.description,
        "previous_id": version.previous_id,
        "experiment_id": version.experiment_id,
        "experiment_arm": version.experiment_arm,
        "created_by": version.created_by,
        "created_at": version.created_at.isoformat(),
    }
    if changes is not None:
        record["changes"] = [
            {"what": c.field, "change": c.label, "before": c.before, "after": c.after, "diff": c.detail}
            for c in changes
        ]
    return record


# ---------------------------------------------------------------------------------------------
# `judge_version` on imported and posted rows


@dataclass(frozen=True)
class VersionRef:
    """A row's `judge_version`: a name, and optionally some of the configuration's fields."""

    name: str
    config: JudgeConfig

    @property
    def key(self) -> tuple[str, str]:
        return self.name, content_hash(self.config, self.name)


_INT_FIELDS = ("history_entries", "notes_limit", "max_tokens_judge", "max_tokens_mentor")
_FLOAT_FIELDS = ("history_ratio", "temperature")


def option_range(option: str) -> tuple[float, float]:
    """The bounds of a version's numeric option: its setting's (`OPTION_SETTINGS`), except that a
    version may use no notes at all (the alignment lab's arms without notes), which the server's
    setting does not allow."""
    low, high = setting_range(OPTION_SETTINGS[option])
    return (0, high) if option == "notes_limit" else (low, high)


def parse_version_ref(raw: Any) -> VersionRef | None:
    """A row's `judge_version` (a name, or {name, ...fields}); None when absent; ValueError says what is wrong."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return VersionRef(check_name(raw), JudgeConfig())
    if not isinstance(raw, Mapping):
        raise ValueError("must be a version name or an object with 'name' and optional fields")
    unknown = sorted(set(raw) - {"name", *FIELD_LABELS})
    if unknown:
        raise ValueError(
            f"unknown field(s) {', '.join(map(repr, unknown))}; known: name, {', '.join(FIELD_LABELS)}"
        )
    name = raw.get("name")
    if not isinstance(name, str):
        raise ValueError("'name' is required and must be text")
    values: dict[str, Any] = {}
    for key in _INT_FIELDS:
        value = raw.get(key)
        if value is not None:
            low, high = option_range(key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{key!r} must be a whole number from {low} to {high}")
            values[key] = value
    for key in _FLOAT_FIELDS:
        value = raw.get(key)
        if value is not None:
            lo, hi = option_range(key)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or not lo <= value <= hi:
                raise ValueError(f"{key!r} must be a number from {lo:g} to {hi:g}")
            values[key] = float(value)
    for key in ("judge_model", "prompt_hash"):
        value = raw.get(key)
        if value is not None:
            if (
                not isinstance(value, str)
                or not value.strip()
                or len(value) > (200 if key == "judge_model" else 64)
            ):
                raise ValueError(
                    f"{key!r} must be non-empty text (at most {200 if key == 'judge_model' else 64} characters)"
                )
            values[key] = value.strip()
    relevance = raw.get("relevance")
    if relevance is not None:
        if not isinstance(relevance, bool):
            raise ValueError("'relevance' must be true or false")
        values["relevance"] = relevance
    rubric = raw.get("rubric")
    if rubric is not None:
        values["rubric"] = _parse_rubric(rubric)
    return VersionRef(check_name(name), JudgeConfig(**values))


def _parse_rubric(raw: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("'rubric' must be a non-empty list of {slug, display_name, min, max, description}")
    specs = []
    for i, entry in enumerate(raw, start=1):
        if not isinstance(entry, Mapping):
            raise ValueError(f"rubric item {i} must be an object")
        try:
            specs.append(parse_metric_definition({"product": "-", **entry}))
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"rubric item {i}: {exc}") from None
    slugs = [s.slug for s in specs]
    if len(set(slugs)) != len(slugs):
        raise ValueError("rubric: a metric slug appears twice")
    assert SCALE_BOUND  # the scale bounds are parse_metric_definition's
    return rubric_entries(specs)


def resolve_ref(*, session: Session, product: str, ref: VersionRef, created_by: str, origin: str) -> int:
    """The id of the product's version a row names, made when new; VersionError when it cannot be.

    A name already stored is that version; fields given with it must be its fields. A new name
    with a complete configuration that is already stored under another name is refused (the same
    configuration is one version): name that version instead.
    """
    stored = version_by_name(session, product, ref.name)
    if stored is not None:
        if not ref.config.empty and ref.config != _named_fields(JudgeConfig.of(stored), ref.config):
            raise VersionError(
                f"judge version {ref.name!r} of product {product!r} is stored with other fields; "
                "name it alone, or give its fields as stored"
            )
        assert stored.id is not None
        return stored.id
    if ref.config.complete:
        same = find_version(session, product, ref.config)
        if same is not None:
            raise VersionError(
                f"judge version {ref.name!r} has exactly the configuration of version {same.name!r} of "
                f"product {product!r}; name that version instead"
            )
    return ensure_version(
        session=session,
        product=product,
        config=ref.config,
        name=ref.name,
        created_by=created_by,
        origin=origin,
    ).id


def _named_fields(stored: JudgeConfig, given: JudgeConfig) -> JudgeConfig:
    """The stored configuration reduced to the fields `given` names (so a partial reference matches)."""
    return replace(
        JudgeConfig(),
        **{f.name: getattr(stored, f.name) for f in fields(given) if getattr(given, f.name) is not None},
    )


class RefResolver:
    """Resolves the `judge_version` of many rows (an import) with one lookup per (product, reference)."""

    def __init__(self, session: Session, *, created_by: str, origin: str) -> None:
        self.session = session
        self.created_by = created_by
        self.origin = origin
        self._ids: dict[tuple[str, tuple[str, str]], int] = {}

    def id_for(self, product: str, ref: VersionRef | None) -> int | None:
        """The version id for a row of `product`, or None for a row that names none."""
        if ref is None:
            return None
        key = (product, ref.key)
        if key not in self._ids:
            self._ids[key] = resolve_ref(
                session=self.session, product=product, ref=ref, created_by=self.created_by, origin=self.origin
            )
        return self._ids[key]


def version_id_or_unversioned(value: int | None) -> int:
    """A judgment's version id as counts and verdicts key it (0 for unversioned)."""
    return int(value) if value else UNVERSIONED


def names_of(session: Session) -> dict[int, str]:
    """Every version's name by id (a CSV or an API answer names the version of each judgment)."""
    return {int(i): str(n) for i, n in session.exec(select(JudgeVersion.id, JudgeVersion.name)).all()}


def label_map(session: Session, ids: Iterable[int | None]) -> dict[int, str]:
    """{id: name} for these ids, with 0 → "unversioned"."""
    found = versions_by_id(session, [i for i in ids if i])
    return {UNVERSIONED: UNVERSIONED_NAME, **{i: v.name for i, v in found.items()}}


def created_label(version: JudgeVersion) -> str:
    """Says "by ayse on 2026-11-02": who made a version and when, for captions."""
    at: datetime = version.created_at
    return f"by {version.created_by} on {at:%Y-%m-%d}"
