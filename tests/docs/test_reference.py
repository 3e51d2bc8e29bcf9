"""The reference pages generated at build time (docs/hooks/reference.py) cover the code they are generated from."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

from service.observability.metrics import ServiceMetrics
from service.settings import ENV_PREFIX, Settings
from tests.docs.markdown import DOCS


def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_is_documented_once_with_a_description() -> None:
    table = hook().settings_table().replace("<wbr>", "")
    rows = re.findall(r"^\| <code>(ATTN_[A-Z0-9_]+)</code><br>", table, flags=re.M)
    assert rows == [ENV_PREFIX + name.upper() for name in Settings.model_fields]
    assert all(field.description for field in Settings.model_fields.values())


def test_the_settings_table_says_types_defaults_and_ranges() -> None:
    table = hook().settings_table().replace("<wbr>", "").replace("<code>", "`").replace("</code>", "`")
    assert "| `ATTN_PORT`<br><small>int, >= 0, <= 65535</small> | `8000` |" in table
    assert "| `ATTN_LOG_FORMAT`<br><small>one of `json`, `text`</small> | `json` |" in table
    assert "| `ATTN_API_KEYS`<br><small>list of str (secret), optional</small> | unset |" in table
    assert "| `ATTN_MAX_WORK_FLOPS`<br><small>float, > 0</small> | `2e+11` |" in table
    grpc = hook().settings_table("grpc_")
    assert grpc.count("\n| <code>ATTN_<wbr>GRPC_") == sum(name.startswith("grpc_") for name in Settings.model_fields)


def test_the_generated_tables_have_their_markers() -> None:
    assert "<!-- settings-table -->" in (DOCS / "reference" / "settings.md").read_text()
    assert '<!-- settings-table prefix="grpc_" -->' in (DOCS / "guides" / "grpc.md").read_text()
    assert "<!-- metrics-table -->" in (DOCS / "reference" / "metrics.md").read_text()


def test_every_metric_family_is_documented() -> None:
    table = hook().metrics_table()
    families = {m.name for m in ServiceMetrics().registry.collect() if m.name.startswith("attn_")}
    documented = {name.removesuffix("_total") for name in re.findall(r"^\| `(attn_[a-z_]+)` \|", table, flags=re.M)}
    assert documented == families
