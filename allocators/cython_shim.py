"""A stand-in for Cython's pure-Python `cython` module, for an install without Cython.

Why: the compiled core's typed kernels (allocators/seq_kernels.py) declare C types with Cython's
pure-Python mode (`@cython.locals(i=cython.Py_ssize_t, lengths=cython.longlong[:])`), which only
Cython reads. Where Cython is installed, `import cython` gives its own shadow module; without it this
one gives the same names, as no-ops, so the kernels run as the plain Python they are. Only what the
kernels and the extension types (allocators/paged.py `PagedState`, sim/core's per-request classes:
`cclass`, `declare`, `ccall`) use is here (a test checks the kernels import with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

compiled = False


class _CType:
    """A C type name: `longlong`, and `longlong[:]` (a typed memoryview) as itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, _dims: object) -> _CType:
        return self

    def __repr__(self) -> str:
        return self.name


Py_ssize_t = _CType("Py_ssize_t")
longlong = _CType("long long")
double = _CType("double")
int = _CType("int")  # Cython's name; nothing in this module uses the builtin int
bint = _CType("bint")
uchar = _CType("unsigned char")  # uint8 views of bool arrays: uchar[:]
schar = _CType("signed char")  # int8 views of array("b") columns: schar[:]
const_longlong = _CType("const long long")  # read-only memoryviews: const_longlong[:]
const_double = _CType("const double")


def locals(**_types: _CType) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`@cython.locals(...)`: the function unchanged."""
    return lambda function: function


def cfunc(function: Callable[..., Any]) -> Callable[..., Any]:
    """`@cython.cfunc` (a C function, called from the kernels only): the function unchanged."""
    return function


def cclass(cls: type) -> type:
    """`@cython.cclass` (an extension type, fields declared with `declare`): the class unchanged."""
    return cls


def declare(_type: _CType | None = None, value: Any = None, **_kwargs: Any) -> Any:
    """`cython.declare(...)`: `value` (None when not given): a field's default, which `__init__` sets."""
    return value


def ccall(function: Callable[..., Any]) -> Callable[..., Any]:
    """`@cython.ccall` (a method callable from C and from Python): the function unchanged."""
    return function


def returns(_type: _CType) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`@cython.returns(...)`: the function unchanged."""
    return lambda function: function
