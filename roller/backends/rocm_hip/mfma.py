from __future__ import annotations
def plan_for(prog, hw, plan):
    return None
