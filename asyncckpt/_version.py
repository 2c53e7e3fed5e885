"""The version of asyncckpt: a leaf that the package root re-exports and the run directory's
manifest names, imported by both without importing the package."""
from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.3.0"
