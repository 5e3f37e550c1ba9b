"""Lazy imports of optional dependencies with an error that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from agentcheck._errors import MissingExtraError


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised without the extra
        raise MissingExtraError(extra, module) from exc
