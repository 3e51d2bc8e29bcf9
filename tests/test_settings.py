"""Settings refuse unknown ATTN_* variables with the closest valid name (service/settings/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings, unknown_env_names

ROOT = Path(__file__).resolve().parents[1]
FIELDS = set(Settings.model_fields)


def test_a_typo_names_the_closest_setting() -> None:
    problems = unknown_env_names({"ATTN_MAX_CONCURENT_REQUESTS": "1"}, FIELDS)
    assert problems == ["ATTN_MAX_CONCURENT_REQUESTS is not a setting (did you mean ATTN_MAX_CONCURRENT_REQUESTS?)"]


def test_known_names_other_prefixes_and_case_pass() -> None:
    env = {"ATTN_PORT": "1", "attn_log_level": "info", "PATH": "/bin", "ATTNX": "1", "PROMETHEUS_MULTIPROC_DIR": "/t"}
    assert unknown_env_names(env, FIELDS) == []


def test_nothing_close_points_at_the_readme() -> None:
    (problem,) = unknown_env_names({"ATTN_ZZZZZZZZ": "1"}, FIELDS)
    assert problem.startswith("ATTN_ZZZZZZZZ is not a setting") and "did you mean" not in problem


def test_settings_refuse_an_unknown_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTN_MAX_QUEUED_REQUEST", "3")
    with pytest.raises(ValidationError, match="did you mean ATTN_MAX_QUEUED_REQUESTS"):
        Settings()
    monkeypatch.delenv("ATTN_MAX_QUEUED_REQUEST")
    assert Settings().max_queued_requests == Settings.model_fields["max_queued_requests"].default


def test_serve_exits_2_naming_the_typo() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_")}
    env["ATTN_MAX_CONCURENT_REQUESTS"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "service", "serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "ATTN_MAX_CONCURENT_REQUESTS is not a setting (did you mean ATTN_MAX_CONCURRENT_REQUESTS?)" in done.stderr


def test_sessions_with_several_workers_are_refused_at_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A session's cache lives in one worker: ATTN_SESSIONS=true with ATTN_WORKERS > 1 cannot be honoured."""
    with pytest.raises(ValueError, match="ATTN_SESSIONS=true needs ATTN_WORKERS=1"):
        Settings(workers=2, sessions=True, metrics_dir=tmp_path)
    assert not Settings(workers=2, metrics_dir=tmp_path).sessions_served()  # unset: off with several workers
    assert Settings().sessions_served()
