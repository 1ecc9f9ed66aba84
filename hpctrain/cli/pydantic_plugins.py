"""Login-node commands skip pydantic's search for plugins.

Before it builds its first validator, pydantic looks for plugins: it imports
``importlib.metadata`` (and with it email, zipfile, csv...) and reads the entry
points of every installed distribution. That is about 35 ms, an eighth of
``hpctrain validate``, spent looking for plugins that could only watch
hpctrain's own spec models. ``PYDANTIC_DISABLE_PLUGINS`` skips the reading but
not the import, so the command line puts a loader that finds no plugins where
pydantic will look for its own (``pydantic.plugin._loader``), before pydantic
needs it. Nothing is replaced when pydantic has loaded its loader already;
anything else pydantic asks of the stand-in comes from the real loader, so a
pydantic that uses more of it keeps working. Only processes started as
``hpctrain ...`` do this: the tasks of a job (and any code they import) see
pydantic as installed.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterable
from typing import Any

LOADER = "pydantic.plugin._loader"


class NoPluginLoader(types.ModuleType):
    """Stands in for pydantic's plugin loader: no plugins; everything else from the real one."""

    def get_plugins(self) -> Iterable[Any]:
        return ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if sys.modules.get(LOADER) is self:
            del sys.modules[LOADER]  # the import below then loads (and registers) the real one
        return getattr(importlib.import_module(LOADER), name)


def skip_plugin_search() -> None:
    """Install the stand-in unless pydantic's own loader is already in use."""
    if LOADER in sys.modules:
        return
    package = importlib.import_module(LOADER.rpartition(".")[0])  # pydantic.plugin: light, and pydantic comes anyway
    stand_in = NoPluginLoader(LOADER, __doc__)
    sys.modules[LOADER] = stand_in
    package._loader = stand_in  # type: ignore[attr-defined]
