"""Recorded kernel calls run back to back by one C loop, for a replay that would otherwise spend
~2 us a call between them in Python and ctypes (0.5 ms of a batch-1 decode step of SmolLM2-135M,
271 calls).

The loop calls each function through its own prototype: a C file generated for the signatures
(argtypes) of the calls, one typed call for each, compiled and cached as the kernels are. Each
call's arguments are converted once, when the list is built, into slots of one array:

    calls: [fn, signature, first slot, status]  ...  one per call, in order
    slots: | call 0's arguments | call 1's | ...    a union of int64, double, float, pointer
"""

import ctypes
import functools
from collections.abc import Callable, Sequence

from pagedgen.kernels.cpu_build import c_compiler, compile_source

SOURCE_NAME = "call_list.c"
CFLAGS = ("-O2", "-fPIC", "-shared")
# ctypes argument type -> (its C type, the slot member that holds it)
C_TYPES: dict[type, tuple[str, str]] = {
    ctypes.c_void_p: ("void *", "p"),
    ctypes.c_int: ("int", "i"),
    ctypes.c_int64: ("int64_t", "i"),
    ctypes.c_size_t: ("size_t", "i"),
    ctypes.c_float: ("float", "f"),
    ctypes.c_double: ("double", "d"),
}
Signature = tuple[type, ...]


class _Slot(ctypes.Union):
    _fields_ = [
        ("i", ctypes.c_int64),
        ("d", ctypes.c_double),
        ("f", ctypes.c_float),
        ("p", ctypes.c_void_p),
    ]


class _Call(ctypes.Structure):
    _fields_ = [
        ("fn", ctypes.c_void_p),
        ("signature", ctypes.c_int64),
        ("first_slot", ctypes.c_int64),
        ("status", ctypes.c_int64),
    ]


def can_list(fn: Callable[..., int]) -> bool:
    """Whether a ctypes function's calls can go in a CallList: argtypes all of C_TYPES and an
    int result."""
    argtypes = getattr(fn, "argtypes", None)
    return (
        argtypes is not None
        and getattr(fn, "restype", None) is ctypes.c_int
        and all(t in C_TYPES for t in argtypes)
    )


class CallList:
    """Calls of ctypes functions (each can_list) with recorded arguments and the status each
    returned; calling it makes them again, in order, and raises at the first other status."""

    def __init__(self, calls: Sequence[tuple[Callable[..., int], tuple, int]]) -> None:
        self.fns = [fn for fn, _, _ in calls]
        signatures = sorted({tuple(fn.argtypes) for fn in self.fns}, key=_signature_key)
        index = {signature: i for i, signature in enumerate(signatures)}
        self.calls = (_Call * len(calls))()
        self.slots = (_Slot * max(1, sum(len(args) for _, args, _ in calls)))()
        slot = 0
        for call, (fn, args, status) in zip(self.calls, calls):
            assert can_list(fn) and len(args) == len(fn.argtypes), fn
            address = ctypes.cast(fn, ctypes.c_void_p).value
            call.fn, call.first_slot, call.status = address, slot, status
            call.signature = index[tuple(fn.argtypes)]
            for argtype, value in zip(fn.argtypes, args):
                setattr(self.slots[slot], C_TYPES[argtype][1], value)
                slot += 1
        self.run_calls = _library(tuple(signatures)).run_calls
        self.failed_status = ctypes.c_int64()
        self.arguments = (self.calls, self.slots, len(calls), ctypes.byref(self.failed_status))

    def __call__(self) -> None:
        failed = self.run_calls(*self.arguments)
        if failed >= 0:
            name = self.fns[failed].__name__
            status = self.failed_status.value
            raise RuntimeError(f"{name} returned {status} in a CPU graph replay")


def _signature_key(signature: Signature) -> list[str]:
    return [C_TYPES[t][0] for t in signature]


def call_list_source(signatures: Sequence[Signature]) -> str:
    """The C loop over calls of these signatures (signature i: case i)."""
    cases = []
    for i, signature in enumerate(signatures):
        prototype = ", ".join(C_TYPES[t][0] for t in signature) or "void"
        values = ", ".join(f"a[{j}].{C_TYPES[t][1]}" for j, t in enumerate(signature))
        cases.append(f"    case {i}: return ((int (*)({prototype}))c->fn)({values});")
    return "\n".join(
        [
            "#include <stddef.h>",
            "#include <stdint.h>",
            "typedef union { int64_t i; double d; float f; void *p; } Slot;",
            "typedef struct { void *fn; int64_t signature, first_slot, status; } Call;",
            "static int call(const Call *c, const Slot *a) {",
            "  switch (c->signature) {",
            *cases,
            "  }",
            "  return -1;",
            "}",
            "// The index of the first call whose status is not the recorded one (that status in",
            "// *failed_status), or -1 when every call returned its own.",
            "int64_t run_calls(const Call *calls, const Slot *slots, int64_t n,",
            "                  int64_t *failed_status) {",
            "  for (int64_t k = 0; k < n; k++) {",
            "    const int status = call(&calls[k], slots + calls[k].first_slot);",
            "    if (status != calls[k].status) {",
            "      *failed_status = status;",
            "      return k;",
            "    }",
            "  }",
            "  return -1;",
            "}",
            "",
        ]
    )


@functools.cache
def _library(signatures: tuple[Signature, ...]) -> ctypes.CDLL:
    source = call_list_source(signatures)
    lib = ctypes.CDLL(str(compile_source(c_compiler(), SOURCE_NAME, source, CFLAGS)))
    lib.run_calls.restype = ctypes.c_int64
    p = ctypes.c_void_p
    lib.run_calls.argtypes = [p, p, ctypes.c_int64, p]
    return lib
