"""Roller: construct tensor kernels from a hardware description instead of searching for them."""
from __future__ import annotations

__version__ = "0.1.0"
