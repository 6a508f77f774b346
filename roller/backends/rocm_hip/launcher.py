from __future__ import annotations
def available() -> bool:
    return False
def why_unavailable() -> str:
    return "no ROCm device"
