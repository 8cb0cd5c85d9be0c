"""Modules that answer a call: `placeflow.plan(...)` and `placeflow.export(...)`.

The library API's verbs `plan` and `export` share their names with modules
(the plan spec `placeflow.plan`, the exporters `placeflow.export`), and Python
binds a package's attribute to its submodule once the submodule is imported. So
those two modules are made callable: calling one calls the API's verb of the
same name (`placeflow.api`), and `from placeflow.plan import Plan` still works.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def answer_calls(module_name: str, verb: str) -> None:
    """Make the module `module_name` callable as `placeflow.api.<verb>`."""

    class _Verb(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            from placeflow import api

            return getattr(api, verb)(*args, **kwargs)

    sys.modules[module_name].__class__ = _Verb
