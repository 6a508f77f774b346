"""Regenerate roller/ir/reserved_names.txt: the names the target languages' headers declare or define.

Generated kernels name tensors and kernels after the user's tensors and ops, so a tensor called ``fmax``,
``FLT_MAX``, ``NULL``, ``CLK_LOCAL_MEM_FENCE`` or ``half2`` breaks the compile of some target. This script
preprocesses what the generated sources include, for every target whose toolchain is installed here:

* OpenCL C: clang's opencl-c.h (OpenCL C 2.0, a superset of the 1.2 kernels use);
* CUDA: cuda_runtime.h (implicit), cuda_fp16.h, cuda_bf16.h and mma.h through nvcc;
* HIP: hip_runtime.h and hip_fp16.h through hipcc;
* C++ (Poplar codelets, host stand-ins): <cmath>, <cfloat>, <climits>, <cstddef>, <cstdint>, <algorithm>;

and collects every macro and every declared name (functions, types, templates, enumerators) that a user
could write: names starting with a letter. Run it where the toolchains are (it skips a missing one and says
so); the list is committed, so a checkout without them still rejects the same names.

    python scripts/reserved_names.py [--check]
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "roller" / "ir" / "reserved_names.txt"
USER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_MACRO = re.compile(r"^#define\s+([A-Za-z_]\w*)", re.MULTILINE)
_TOKEN = re.compile(r"extern\s*\"C(?:\+\+)?\"|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|[A-Za-z_]\w*|::|\S")
_TAGS = ("struct", "class", "union", "enum")

def _run(cmd: list[str], cwd: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}).stdout


def targets(work: str) -> dict[str, tuple[str, str]]:
    """target -> (preprocessed text, macro definitions), for every toolchain found."""
    out: dict[str, tuple[str, str]] = {}
    heads = sorted(glob.glob("/usr/lib/llvm-*/lib/clang/*/include/opencl-c.h"))
    clang = shutil.which("clang-15") or shutil.which("clang")
    if heads and clang:
        base = ["-x", "cl", "-cl-std=CL2.0", heads[-1]]
        out["opencl"] = (_run([clang, "-E", "-Xclang", "-fdeclare-opencl-builtins", *base], work),
                         _run([clang, "-E", "-dM", *base], work))
    else:
        print("reserved_names: no clang with opencl-c.h; OpenCL names not collected", file=sys.stderr)
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc:
        Path(work, "e.cu").write_text("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <mma.h>\n")
        out["cuda"] = (_run([nvcc, "-arch=sm_80", "-E", "e.cu"], work),
                       _run([nvcc, "-arch=sm_80", "-E", "-Xcompiler", "-dM", "e.cu"], work))
    else:
        print("reserved_names: no nvcc; CUDA names not collected", file=sys.stderr)
    hipcc = shutil.which("hipcc")
    if hipcc:
        Path(work, "e.hip").write_text("#include <hip/hip_runtime.h>\n#include <hip/hip_fp16.h>\n")
        cmd = [hipcc, "-x", "hip", "--cuda-device-only", "--offload-arch=gfx906", "-E", "e.hip"]
        env = {"HIP_PLATFORM": "amd"}
        out["hip"] = (_run(cmd, work, env), _run(cmd + ["-dM"], work, env))
    else:
        print("reserved_names: no hipcc; HIP names not collected", file=sys.stderr)
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx:
        Path(work, "e.cpp").write_text("".join(f"#include <{h}>\n" for h in
                                               ("cmath", "cfloat", "climits", "cstddef", "cstdint", "algorithm")))
        out["c++"] = (_run([cxx, "-std=c++17", "-E", "e.cpp"], work), _run([cxx, "-std=c++17", "-E", "-dM", "e.cpp"], work))
    return out


def _strip_attributes(code: str) -> str:
    """``code`` without ``__attribute__((...))`` and ``__declspec(...)``: they hide the shape of a declaration."""
    out = []
    pos = 0
    for m in re.finditer(r"\b(?:__attribute__|__declspec)\s*\(", code):
        if m.start() < pos:
            continue
        out.append(code[pos:m.start()])
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[j], 0)
            j += 1
        pos = j
    out.append(code[pos:])
    return " ".join(out)


def names(text: str, macros: str) -> dict[str, str]:
    """name -> kind (macro, type, function, enumerator) of what a translation unit defines at global scope:
    macros, and the declarations outside any class, function or named namespace (``extern "C"`` blocks are
    global; ``std::`` and ``nvcuda::`` names are not, unless a using-declaration brings them in)."""
    found: dict[str, str] = {m: "macro" for m in _MACRO.findall(macros)}
    code = _strip_attributes("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    toks = _TOKEN.findall(code)
    stack: list[str] = []  # per open brace: "global" (extern "C"), "enum" or "other"
    stmt: list[str] = []  # tokens since the last ';', '{' or '}' at this level

    def add(name: str, kind: str) -> None:
        if USER_NAME.fullmatch(name) and found.get(name) != "macro":
            found.setdefault(name, kind)

    for i, tok in enumerate(toks):
        at_global = all(k == "global" for k in stack)
        in_enum = bool(stack) and stack[-1] == "enum" and all(k == "global" for k in stack[:-1])
        if tok == "{":
            if stmt and stmt[0].startswith("extern") and '"C' in stmt[0]:
                kind = "global"
            elif at_global and "(" not in stmt and (stmt[:1] == ["enum"] or stmt[:2] == ["typedef", "enum"]) \
                    and "class" not in stmt[:3] and "struct" not in stmt[:3]:
                kind = "enum"  # an unscoped enum's body: its enumerators are global names
            else:
                kind = "other"
            if at_global:
                tagged = [stmt[j + 1] for j, t in enumerate(stmt[:-1]) if t in _TAGS and stmt[j + 1] != "class"]
                for name in tagged:
                    add(name, "type")
            stack.append(kind)
            stmt = []
            continue
        if tok == "}":
            if stack:
                stack.pop()
            stmt = []
            continue
        if in_enum:
            if (not stmt or stmt[-1] == ",") and USER_NAME.fullmatch(tok):
                add(tok, "enumerator")
            stmt.append(tok)
            continue
        if tok == ";":
            if at_global and stmt:
                if stmt[0] == "typedef":
                    # typedef R (*NAME)(params): the name is inside the first parentheses, not the last word
                    star = [stmt[j + 2] for j in range(len(stmt) - 2) if stmt[j] == "(" and stmt[j + 1] == "*"]
                    words = [t for t in stmt if re.fullmatch(r"[A-Za-z_]\w*", t)]
                    if star:
                        add(star[0], "type")
                    elif words:
                        add(words[-1], "type")
                elif stmt[0] == "using" and len(stmt) >= 3 and stmt[2] == "=":
                    add(stmt[1], "type")
                elif stmt[0] == "using" and "::" in stmt:
                    add(stmt[-1], "function")
                for j, t in enumerate(stmt[:-1]):
                    if t in _TAGS and stmt[j + 1] != "class":
                        add(stmt[j + 1], "type")
            stmt = []
            continue
        if at_global and tok == "(" and stmt and re.fullmatch(r"[A-Za-z_]\w*", stmt[-1]) \
                and not (len(stmt) >= 2 and stmt[-2] == "::"):
            add(stmt[-1], "function")
        stmt.append(tok)
    return found


def collect() -> dict[str, dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="roller-names-") as work:
        return {t: names(text, macros) for t, (text, macros) in targets(work).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed list lacks a collected name")
    args = ap.parse_args()
    by_target = collect()
    every: dict[str, set[str]] = {}
    for found in by_target.values():
        for name, kind in found.items():
            every.setdefault(name, set()).add(kind)
    # One kind per name, the one that restricts most: a macro anywhere breaks any use of the name.
    rank = ("macro", "type", "function", "enumerator")
    kinds = {n: min(k, key=rank.index) for n, k in every.items()}
    if args.check:
        have = {line.split()[0] for line in OUT.read_text().splitlines() if line and not line.startswith("#")} \
            if OUT.exists() else set()
        missing = sorted(set(kinds) - have)
        print(f"{len(missing)} collected names missing from {OUT.name}: {' '.join(missing[:40])}")
        return 1 if missing else 0
    lines = [f"{n} {kinds[n]}" for n in sorted(kinds)]
    header = ("# Names the target languages define at global scope: NAME KIND (macro, type, function, enumerator),\n"
              "# generated by scripts/reserved_names.py from " + ", ".join(sorted(by_target)) + ".\n")
    OUT.write_text(header + "\n".join(lines) + "\n")
    print(f"wrote {OUT} ({len(lines)} names: " + ", ".join(f"{t} {len(v)}" for t, v in sorted(by_target.items()))
          + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
