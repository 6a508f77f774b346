"""Run one op's top-1 OpenCL kernel on the Oclgrind simulator and check it (used by test_oclgrind.py in a
subprocess, because Oclgrind reports invalid accesses and races on stderr)."""
from __future__ import annotations

import json
import sys

import numpy as np

import roller.hw as H
from roller.backends import get
from roller.compiler.check import check_against
from roller.construction import construct
from roller.errors import CheckError
from roller.ir import load_op
from roller.ir.reference import random_inputs

op = load_op(json.loads(sys.argv[1]))
hw = H.load(sys.argv[2])
be = get("opencl")
x = random_inputs(op, seed=3)
prog = construct(op, hw)[0]
art = be.render(prog, hw)
if "--drop-barriers" in sys.argv:  # negative control: the simulator must then report a race
    art.files[art.main_file] = "\n".join(line for line in art.source.splitlines() if "barrier(" not in line)
if "--widen-guards" in sys.argv:  # negative control: bounds tests that let every index of X through
    art.files[art.main_file] = art.source.replace(f"< {op.inputs[0].shape[0]}u", "< 999999999999u")
if "--no-clamp" in sys.argv:  # negative control: run-time indices used as they come
    art.files[art.main_file] = art.source.replace("return x < 0 ? 0 : x >= n ? n - 1 : x;", "return x;")
    assert art.source.count("return x;") == 1
y = be.compile(art, hw)([x[t.name] for t in op.inputs])
try:
    check_against(op.name, op, x, np.asarray(y))
    ok = True
except CheckError:
    ok = False
print(json.dumps({"ok": ok, "program": prog.line()}))
