"""Helpers the tools share: loading a module by path, writing a result file whole.

The audit and bench workers run under both torches; the stock one lacks the new
upstream modules, so they load the repo's copies by path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType
    from pathlib import Path


def load_by_path(name: str, path: Path) -> ModuleType:
    """Import the file at ``path`` as module ``name`` (registered in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_json_atomically(path: Path, doc: object) -> None:
    """Write ``doc`` as JSON so that a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)
