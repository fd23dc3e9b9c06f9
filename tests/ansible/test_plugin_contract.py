"""The two controller-side plugins that apply the secret rule (the stdout callback specab_redact and the collect
role's collect_scrub action) load specab/vocab/contract.py of this checkout under ONE module name, so a process that
runs both has one secret rule; each says what failed when the file cannot be loaded."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
CALLBACK = REPO / "plugins" / "callback" / "specab_redact.py"
ACTION = REPO / "roles" / "collect" / "action_plugins" / "collect_scrub.py"


def _plugin(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"test_plugin_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    callback, action = _plugin(CALLBACK), _plugin(ACTION)
    assert callback.CONTRACT_MODULE == action.CONTRACT_MODULE
    monkeypatch.delitem(sys.modules, callback.CONTRACT_MODULE, raising=False)
    return callback, action


@pytest.mark.parametrize("first", ["callback", "action"])
def test_both_plugins_share_one_contract_module_from_this_checkout(plugins, first: str) -> None:
    callback, action = plugins
    a, b = (callback, action) if first == "callback" else (action, callback)
    mod = a.load_contract()
    assert Path(mod.__file__).resolve() == REPO / "specab" / "vocab" / "contract.py"
    assert b.load_contract() is mod and sys.modules[callback.CONTRACT_MODULE] is mod
    assert mod.is_secret_name("HF_TOKEN") and not mod.is_secret_name("NCCL_PROTO")


def test_a_missing_contract_is_named_by_each_plugin_and_leaves_nothing_half_loaded(
        plugins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible.errors import AnsibleActionFail
    callback, action = plugins
    gone = tmp_path / "contract.py"
    for plugin, error, name in ((callback, ImportError, "specab_redact"), (action, AnsibleActionFail, "collect_scrub")):
        monkeypatch.setattr(plugin, "CONTRACT", gone)
        with pytest.raises(error, match=f"{name}: cannot load the secret rule from {gone}"):
            plugin.load_contract()
        assert callback.CONTRACT_MODULE not in sys.modules        # the next call tries again, not a broken module
