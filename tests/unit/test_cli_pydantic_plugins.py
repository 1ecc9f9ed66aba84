"""The command line's stand-in for pydantic's plugin loader (cli/pydantic_plugins.py): no plugin
search, pydantic models still validate, anything else comes from the real loader, and a real
loader already in use is left alone. Each case runs in a fresh interpreter: this one has
pydantic's loader loaded already."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_models_validate_without_searching_for_plugins() -> None:
    done = run_python(
        """
        import sys
        from hpctrain.cli.pydantic_plugins import skip_plugin_search
        skip_plugin_search()
        from pydantic import BaseModel, ValidationError
        class Spec(BaseModel):
            epochs: int
        assert Spec(epochs=3).epochs == 3
        try:
            Spec(epochs="many")
        except ValidationError as exc:
            assert exc.errors()[0]["loc"] == ("epochs",)
        else:
            raise AssertionError("not validated")
        assert "importlib.metadata" not in sys.modules, "searched for plugins"
        print("ok")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_anything_else_comes_from_pydantics_own_loader() -> None:
    done = run_python(
        """
        import sys
        from hpctrain.cli.pydantic_plugins import LOADER, NoPluginLoader, skip_plugin_search
        skip_plugin_search()
        import pydantic.plugin._loader as stand_in
        assert isinstance(stand_in, NoPluginLoader) and list(stand_in.get_plugins()) == []
        print(stand_in.PYDANTIC_ENTRY_POINT_GROUP)  # not the stand-in's: the real loader answers
        assert not isinstance(sys.modules[LOADER], NoPluginLoader)
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "pydantic", done.stderr


def test_a_loader_already_in_use_is_kept() -> None:
    done = run_python(
        """
        import sys
        import pydantic.plugin._loader
        from hpctrain.cli.pydantic_plugins import LOADER, NoPluginLoader, skip_plugin_search
        skip_plugin_search()
        assert not isinstance(sys.modules[LOADER], NoPluginLoader)
        print("ok")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
