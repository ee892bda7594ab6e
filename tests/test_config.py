"""Settings: defaults from the seeds, environment overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from lib.config import ConfigError, Settings, get_settings, load_settings, reset_settings


def test_defaults_follow_the_seeds(tmp_path: Path) -> None:
    s = load_settings({}, secrets_path=tmp_path / "none.toml")
    assert (s.max_chat_turns, s.history_max_entries, s.history_correction_ratio) == (15, 20, 0.75)
    assert (s.ema_alpha, s.score_clamp, s.feedback_weight, s.evaluator_weight) == (0.3, 3.0, 2.0, 1.0)
    assert (s.judge_model, s.coach_model) == ("gpt-4o", "gpt-4o-mini")
    assert s.database_url.startswith("sqlite:///") and s.database_url.endswith("data/overrule.db")
    assert not s.llm_configured


def test_environment_overrides_defaults(tmp_path: Path) -> None:
    env = {
        "OVERRULE_MAX_CHAT_TURNS": "7",
        "OPENAI_BASE_URL": "http://localhost:1/v1",
        "OVERRULE_LOAD_DEMO": "no",
    }
    s = load_settings(env, secrets_path=tmp_path / "none.toml")
    assert s.max_chat_turns == 7 and s.llm_configured and s.load_demo is False


def test_secrets_file_is_read_after_environment(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('OPENAI_API_KEY = "sk-from-secrets"\nOVERRULE_JUDGE_MODEL = "m-secret"\n')
    s = load_settings({"OVERRULE_JUDGE_MODEL": "m-env"}, secrets_path=secrets)
    assert s.openai_api_key == "sk-from-secrets" and s.judge_model == "m-env"


@pytest.mark.parametrize(
    ("var", "value", "fragment"),
    [
        ("OVERRULE_MAX_CHAT_TURNS", "many", "OVERRULE_MAX_CHAT_TURNS"),
        ("OVERRULE_MAX_CHAT_TURNS", "0", "out of range"),
        ("OVERRULE_HISTORY_CORRECTION_RATIO", "1.5", "out of range"),
        ("OVERRULE_EMA_ALPHA", "abc", "expected float"),
        ("OVERRULE_LOAD_DEMO", "maybe", "expected true/false"),
    ],
)
def test_invalid_values_raise_clear_errors(tmp_path: Path, var: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_settings({var: value}, secrets_path=tmp_path / "none.toml")


def test_broken_secrets_file_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "secrets.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings({}, secrets_path=bad)


def test_get_settings_is_cached_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "10")
    reset_settings()
    assert get_settings().page_size == 10
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "11")
    assert get_settings().page_size == 10
    reset_settings()
    assert get_settings().page_size == 11
    assert isinstance(get_settings(), Settings)
