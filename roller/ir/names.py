"""Which names may reach generated source: tensor, axis and op names become C identifiers."""
from __future__ import annotations

import re

from roller.ir.expr import FUNCS

_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

# C11 + C++ keywords that OpenCL C, CUDA, HIP and Poplar's C++ all reserve, plus the address-space and
# qualifier words of OpenCL/CUDA and names the generated code itself uses.
RESERVED = frozenset(["auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "bool", "true", "false", "class", "delete", "new", "namespace", "operator", "private", "protected", "public", "template", "this", "throw", "try", "catch", "virtual", "friend", "using", "typename", "explicit", "mutable", "static_cast", "dynamic_cast", "const_cast", "reinterpret_cast", "constexpr", "decltype", "noexcept", "nullptr", "alignas", "alignof", "char16_t", "char32_t", "thread_local", "static_assert", "export", "half", "float2", "float4", "float8", "float16", "int2", "int4", "uint", "uchar", "ushort", "ulong", "size_t", "ptrdiff_t", "kernel", "__kernel", "global", "__global", "local", "__local", "constant", "__constant", "private", "__private", "read_only", "write_only", "image2d_t", "image3d_t", "sampler_t", "event_t", "__device__", "__global__", "__shared__", "__host__", "__constant__", "__restrict__", "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "dim3", "main", "get_global_id", "get_local_id", "get_group_id", "get_local_size", "barrier", "poplar", "Vertex", "MultiVertex", "Input", "Output", "InOut", "Vector", "compute"]) | frozenset(FUNCS) | frozenset({"inf", "nan", "INFINITY", "NAN", "pow", "fma", "mad"})


def check_identifier(name: object) -> str | None:
    """None when ``name`` can be used in generated source, else what is wrong with it."""
    if not isinstance(name, str):
        return f"expected a name (string), got {name!r}"
    if not _IDENT.match(name):
        return f"{name!r} is not an identifier (letters, digits, '_'; starting with a letter)"
    if name in RESERVED:
        return f"{name!r} is a reserved word in C/CUDA/OpenCL"
    if name.startswith("rl_"):
        return f"{name!r} starts with 'rl_', which generated code reserves for its own names"
    if len(name) > 48:
        return f"{name!r} is longer than 48 characters"
    return None
