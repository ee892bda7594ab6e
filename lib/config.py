"""Settings for Overrule, read once from the environment and `.streamlit/secrets.toml`.

Every tunable the seeds name (turn limit, history size and ratio, EMA constants, thresholds)
lives here so that no other module hard-codes them. Nothing is read at import time: callers use
`get_settings()`, and tests call `reset_settings()` after changing the environment.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
DEFAULT_SQLITE_PATH = DATA_DIR / "overrule.db"
SECRETS_PATH = ROOT / ".streamlit" / "secrets.toml"


LLM_PROFILES = ("default", "local")
LOCAL_MIN_TIMEOUT = 600.0


class ConfigError(ValueError):
    """A setting has a value Overrule cannot use; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """All of Overrule's configuration. Field `x` is read from `OVERRULE_X` unless noted."""

    database_url: str = f"sqlite:///{DEFAULT_SQLITE_PATH}"
    # LLM access (SPEC §7). The OpenAI variables keep their standard names.
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    judge_model: str = "gpt-4o"
    # The judge's sampling temperature (scoring and mentoring calls); part of a judge version.
    judge_temperature: float = 0.0
    coach_model: str = "gpt-4o-mini"
    eval_model: str = "gpt-4o"
    evaluator_model: str = "gpt-4o-mini"
    embedding_model: str | None = None
    llm_timeout: float = 60.0
    llm_max_retries: int = 2
    # "local" (Ollama, llama.cpp on a CPU): timeout >= 600 s, no retries, long calls streamed.
    llm_profile: str = "default"
    # Reply caps per call kind (issue 18): a runaway reply stops here instead of at the context limit.
    max_tokens_judge: int = 2048
    max_tokens_mentor: int = 1024
    max_tokens_evaluator: int = 512
    max_tokens_compare: int = 256
    max_tokens_second_opinion: int = 512
    max_tokens_coach: int = 1024
    # The server's context window; prompts are shrunk (history, then notes) to fit it with the reply.
    context_tokens: int = 8192
    judge_concurrency: int = 4
    # Coach chat (seed 002 AD-4, AD-9).
    max_chat_turns: int = 15
    chat_window: int = 6
    # Correction history (seed 004).
    history_max_entries: int = 20
    history_correction_ratio: float = 0.75
    # Tag relevance (seed 001).
    ema_alpha: float = 0.3
    score_clamp: float = 3.0
    evaluator_weight: float = 1.0
    feedback_weight: float = 2.0
    min_evals_for_filter: int = 3
    negative_score_threshold: float = -0.1
    relevance_weight: float = 0.01
    autopin_threshold: float = 0.6
    autounpin_threshold: float = 0.2
    autopin_min_evals: int = 5
    match_pin_threshold: int = 15
    # Cross-session notes (seed 000).
    notes_limit: int = 20
    notes_cache_size: int = 50
    eval_min_text_length: int = 100
    eval_min_confidence: float = 0.30
    # Precedents (seed 003).
    qa_threshold: float = 0.85
    sentence_threshold: float = 0.85
    # Auto-evaluation workers (seed 003 evalConcurrency): CPUs − 1, at least 1; 0 = serial in the caller.
    eval_concurrency: int = max(1, (os.cpu_count() or 2) - 1)
    # Identity (lib.auth): "open" trusts a typed name (as admin); "signin" uses st.login with the
    # OpenID Connect provider of `.streamlit/secrets.toml` [auth].
    auth_mode: str = "open"
    admins: str = ""  # comma-separated identities that start as admin
    default_role: str = "viewer"  # the role of a signed-in identity without a role row
    # Issuers (comma-separated `iss` URLs) whose `email` claim is trusted when they omit
    # `email_verified` (e.g. a single-tenant Entra ID); by default such an e-mail is not the identity.
    trusted_email_issuers: str = ""
    system_identity: str = "overrule-cli"  # who the CLI and the demo loader act as (role admin)
    # A signed-in browser's session ends this many hours after sign-in (issue 24.3; fractions allowed).
    session_hours: float = 12.0
    # Pipeline API (lib.api): the largest request body accepted, in MB (as Streamlit's maxUploadSize):
    # imports (files of evaluations or interactions), and every other body (one JSON object).
    api_max_body_mb: int = 200
    api_max_json_mb: int = 10
    # Foreign files (lib.source_files): the most rows a Phoenix evaluations file may hold. Each row
    # becomes Python objects in the importing process, and a compressed Parquet file of a few KB can
    # hold millions (review7 F8), so the byte limits alone do not bound the memory.
    import_max_rows: int = 100_000
    # OTLP receiver (lib.otlp): the span or resource attribute that names an evaluation's product
    # (the span's wins), and the one that names its language (default "en" when absent).
    otlp_product_attribute: str = "service.name"
    otlp_language_attribute: str = "overrule.language"
    # Host names the server answers to besides loopback and its bound address (lib.hosts: DNS
    # rebinding), comma-separated: `app.example.com`, `*.example.com`, or `*` for any.
    allowed_hosts: str = ""
    # Team review (lib.queues, lib.review_queue): how long opening an item reserves it for a
    # reviewer; every action on it renews the lease, and a lease that runs out returns the item.
    reservation_minutes: int = 15
    # Webhooks (lib.webhooks): the Fernet key that encrypts signing secrets at rest; when unset,
    # data/webhook.key (made on first use, mode 0600). `python -m lib webhooks key` makes one.
    webhook_key: str | None = None
    # Webhooks: delivered deliveries (and their attempts) older than this many days are removed
    # from the delivery log, at most hourly, by the delivery worker; 0 keeps them forever. Failed
    # and pending deliveries always stay (a lead replays them).
    webhook_log_days: int = 30
    # Evaluations CSV (lib.wide_scan): a download whose reader takes no byte for this many seconds
    # is stopped, so a stalled client cannot hold an export worker (there are two) for ever.
    export_stall_seconds: float = 300.0
    # App behaviour.
    load_demo: bool = True
    page_size: int = 25

    @property
    def llm_configured(self) -> bool:
        """True when an LLM call has a chance: a key, or a local server that needs none."""
        return bool(self.openai_api_key or self.openai_base_url)

    @property
    def streams_long_calls(self) -> bool:
        """Local profile: long calls stream, so a request the client abandons is cancelled server-side."""
        return self.llm_profile == "local"

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


_ENV_NAMES = {
    "openai_api_key": "OPENAI_API_KEY",
    "openai_base_url": "OPENAI_BASE_URL",
}

# The one configuration hint every "no LLM" message ends with (pages, CLI, lib errors), so the
# reviewer is told the same variables wherever an LLM action is greyed out or refused.
LLM_SETUP_HINT = (
    "Set OPENAI_API_KEY to use OpenAI, or OPENAI_BASE_URL to use an OpenAI-compatible server such as "
    "vLLM, Ollama or llama.cpp, in the environment or in .streamlit/secrets.toml, then restart."
)


def llm_off_reason(action: str, *, plural: bool = False) -> str:
    """Why `action` (e.g. "A second opinion") cannot run without an LLM, with the one setup hint."""
    return f"{action} {'need' if plural else 'needs'} an LLM, and none is configured. {LLM_SETUP_HINT}"


_RANGES: dict[str, tuple[float, float]] = {
    "llm_timeout": (0.1, 3600),
    "judge_temperature": (0.0, 2.0),
    "llm_max_retries": (0, 20),
    "max_tokens_judge": (16, 1_000_000),
    "max_tokens_mentor": (16, 1_000_000),
    "max_tokens_evaluator": (16, 1_000_000),
    "max_tokens_compare": (16, 1_000_000),
    "max_tokens_second_opinion": (16, 1_000_000),
    "max_tokens_coach": (16, 1_000_000),
    "context_tokens": (512, 10_000_000),
    "judge_concurrency": (1, 64),
    "max_chat_turns": (1, 1000),
    "chat_window": (0, 200),
    "history_max_entries": (0, 1000),
    "history_correction_ratio": (0.0, 1.0),
    "ema_alpha": (0.0, 1.0),
    "score_clamp": (0.0, 1000.0),
    "min_evals_for_filter": (0, 1_000_000),
    "autopin_min_evals": (0, 1_000_000),
    "match_pin_threshold": (1, 1_000_000),
    "notes_limit": (1, 10_000),
    "notes_cache_size": (0, 100_000),
    "eval_min_confidence": (0.0, 1.0),
    "qa_threshold": (0.0, 1.0),
    "sentence_threshold": (0.0, 1.0),
    "eval_concurrency": (0, 64),
    "page_size": (1, 1000),
    "api_max_body_mb": (1, 100_000),
    "api_max_json_mb": (1, 1000),
    "import_max_rows": (1, 100_000_000),
    "reservation_minutes": (1, 24 * 60),
    "session_hours": (0.01, 8760),
    "export_stall_seconds": (0.01, 86_400),
}


def setting_range(name: str) -> tuple[float, float]:
    """The bounds a setting's value must keep (KeyError for a setting without any)."""
    return _RANGES[name]


def env_name(field_name: str) -> str:
    """The environment variable that sets a field."""
    return _ENV_NAMES.get(field_name, f"OVERRULE_{field_name.upper()}")


def _read_secrets(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return {str(k).upper(): v for k, v in data.items() if not isinstance(v, dict)}


def _coerce(name: str, raw: Any, default: Any) -> Any:
    var = env_name(name)
    kind = type(default) if default is not None else str
    text = str(raw).strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off"}:
                return False
            raise ValueError("expected true/false")
        if kind is int:
            value: Any = int(text)
        elif kind is float:
            value = float(text)
        else:
            return (text or None) if default is None else text
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r} is invalid: expected {kind.__name__} ({exc})") from exc
    if name in _RANGES:
        low, high = _RANGES[name]
        if not low <= value <= high:
            raise ConfigError(f"{var}={raw!r} is out of range: must be between {low} and {high}")
    return value


AUTH_MODES = ("open", "signin")


def _check_choice(values: dict[str, Any], name: str, choices: tuple[str, ...]) -> None:
    if name in values:
        values[name] = str(values[name]).strip().lower()
        if values[name] not in choices:
            raise ConfigError(
                f"{env_name(name)}={values[name]!r} is invalid: choose one of {', '.join(choices)}"
            )


def load_settings(environ: dict[str, str] | None = None, secrets_path: Path = SECRETS_PATH) -> Settings:
    """Build settings from the environment first, then secrets.toml, then the seeds' defaults."""
    env = os.environ if environ is None else environ
    secrets = _read_secrets(secrets_path)
    values: dict[str, Any] = {}
    for f in fields(Settings):
        var = env_name(f.name)
        raw = env.get(var)
        if raw is None or raw == "":
            raw = secrets.get(var)
        if raw is None or raw == "":
            continue
        values[f.name] = _coerce(f.name, raw, f.default)
    _check_choice(values, "auth_mode", AUTH_MODES)
    _check_choice(values, "default_role", ("viewer", "reviewer", "lead", "admin"))
    if "allowed_hosts" in values:
        from lib.hosts import parse_host_list

        try:
            values["allowed_hosts"] = ",".join(parse_host_list(values["allowed_hosts"]))
        except ValueError as exc:
            raise ConfigError(
                f"OVERRULE_ALLOWED_HOSTS={values['allowed_hosts']!r} is invalid: {exc}"
            ) from None
    if values.get("autounpin_threshold", 0.2) > values.get("autopin_threshold", 0.6):
        raise ConfigError("OVERRULE_AUTOUNPIN_THRESHOLD must not exceed OVERRULE_AUTOPIN_THRESHOLD")
    profile = str(values.get("llm_profile", "default")).strip().lower()
    if profile not in LLM_PROFILES:
        raise ConfigError(
            f"OVERRULE_LLM_PROFILE={profile!r} is invalid: expected one of {', '.join(LLM_PROFILES)}"
        )
    values["llm_profile"] = profile
    if profile == "local":
        # A CPU model reads a 4k-token prompt for minutes; a retry would queue behind the request
        # the server is still working on, so the local profile waits long and never retries.
        values["llm_timeout"] = max(float(values.get("llm_timeout", LOCAL_MIN_TIMEOUT)), LOCAL_MIN_TIMEOUT)
        values["llm_max_retries"] = 0
    return Settings(**values)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read on first use."""
    return load_settings()


def reset_settings() -> None:
    """Forget cached settings so the next `get_settings()` re-reads the environment."""
    get_settings.cache_clear()
