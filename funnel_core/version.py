"""The package version, declared once (``pyproject.toml``) and read from the installed metadata."""

from __future__ import annotations

from importlib import metadata

__all__ = ["__version__"]

try:
    __version__ = metadata.version("funnel-rag")
except metadata.PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "unknown"
