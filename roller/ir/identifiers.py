"""Which names may reach generated source: tensor, axis and op names become identifiers in the languages the
backends write kernels in. This module (with ``reserved_names.txt``) is the one place below the backends that
knows those languages; the IR asks it."""
from __future__ import annotations

import functools
import re
from pathlib import Path

_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

# C11 + C++ keywords that OpenCL C, CUDA, HIP and Poplar's C++ all reserve, plus the address-space and
# qualifier words of OpenCL/CUDA and names the generated code itself uses.
RESERVED = frozenset((
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern",
    "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed",
    "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "bool",
    "true", "false", "class", "delete", "new", "namespace", "operator", "private", "protected", "public",
    "template", "this", "throw", "try", "catch", "virtual", "friend", "using", "typename", "explicit", "mutable",
    "static_cast", "dynamic_cast", "const_cast", "reinterpret_cast", "constexpr", "decltype", "noexcept",
    "nullptr", "alignas", "alignof", "char16_t", "char32_t", "thread_local", "static_assert", "export", "half",
    "float2", "float4", "float8", "float16", "int2", "int4", "uint", "uchar", "ushort", "ulong", "size_t",
    "ptrdiff_t", "kernel", "__kernel", "global", "__global", "local", "__local", "constant", "__constant",
    "private", "__private", "read_only", "write_only", "image2d_t", "image3d_t", "sampler_t", "event_t",
    "__device__", "__global__", "__shared__", "__host__", "__constant__", "__restrict__", "threadIdx",
    "blockIdx", "blockDim", "gridDim", "warpSize", "dim3", "main", "get_global_id", "get_local_id",
    "get_group_id", "get_local_size", "barrier", "poplar", "Vertex", "MultiVertex", "Input", "Output", "InOut",
    "Vector", "compute", "inf", "nan", "INFINITY", "NAN", "pow", "fma", "mad",
))


@functools.lru_cache(maxsize=1)
def _reserved() -> frozenset[str]:
    """RESERVED and the index notation's functions (whose names the kernels use for their own helpers). Read
    on first use: the IR imports this module, so this module cannot import the IR at its top."""
    from roller.ir.expr import FUNCS

    return RESERVED | frozenset(FUNCS)


@functools.lru_cache(maxsize=1)
def _typed_funcs() -> frozenset[str]:
    from roller.ir.expr import TYPED_FUNCS

    return frozenset(TYPED_FUNCS)


_TARGET_NAMES = Path(__file__).with_name("reserved_names.txt")
# Functions the generated kernels call by an unqualified name: a kernel parameter (a tensor) named so would hide
# the function inside the kernel.
KERNEL_CALLS = frozenset((
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "fabs", "expf", "logf", "sqrtf", "rsqrtf", "tanhf", "erff",
    "fabsf", "isnan", "min", "max", "cos", "sin", "cosf", "sinf", "rint", "rintf", "nearbyint", "pow", "powf", "fmod",
    "fmodf", "get_group_id", "get_local_id", "barrier",
    "vload_half", "vstore_half")) | frozenset(
    f"{op}{n}" for op in ("vload", "vstore") for n in (2, 3, 4, 8, 16))


@functools.lru_cache(maxsize=1)
def target_names() -> dict[str, str]:
    """name -> kind (macro, type, function, enumerator) of what the target languages define at global scope
    (reserved_names.txt, made by scripts/reserved_names.py from the compilers' own headers)."""
    out: dict[str, str] = {}
    for line in _TARGET_NAMES.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, kind = line.split()
            out[name] = kind
    return out


def check_name(name: object, role: str) -> str | None:
    """None when ``name`` can name a tensor (``role`` "tensor": it becomes a kernel parameter) or an op
    ("op": it becomes the kernel's name) in every target language, else what is wrong with it. A parameter may
    hide a global function the kernel does not call; a kernel's name may not be any global name."""
    problem = check_identifier(name)
    if problem:
        return problem
    assert isinstance(name, str)
    kind = target_names().get(name)
    if role == "tensor" and (kind in ("macro", "type") or name in KERNEL_CALLS):
        what = f"a {kind}" if kind in ("macro", "type") else "a function generated kernels call"
        return (f"{name!r} is {what} in C, C++, OpenCL C, CUDA or HIP, and tensors name kernel parameters; "
                f"choose another name (e.g. {name}_)")
    if role == "op" and kind is not None:
        return (f"{name!r} is a {kind} in C, C++, OpenCL C, CUDA or HIP, and ops name their kernels; choose "
                f"another name (e.g. {name}_)")
    return None


def check_identifier(name: object) -> str | None:
    """None when ``name`` can be used in generated source, else what is wrong with it."""
    if not isinstance(name, str):
        return f"expected a name (string), got {name!r}"
    if not _IDENT.match(name):
        return f"{name!r} is not an identifier (letters, digits, '_'; starting with a letter)"
    if name in _typed_funcs():
        return f"{name!r} is a function of the index notation; choose another name (e.g. {name}_)"
    if name in _reserved():
        return f"{name!r} is a reserved word in C/CUDA/OpenCL"
    if name.startswith("rl_"):
        return f"{name!r} starts with 'rl_', which generated code reserves for its own names"
    if len(name) > 48:
        return f"{name!r} is longer than 48 characters"
    return None
