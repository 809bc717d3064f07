"""Small compatibility shims for running the Triton kernels under TRITON_INTERPRET=1.

Triton 3.6's interpreter turns a scalar tensor into a Python int with `int(array)` on a
one-element 1-D numpy array; numpy >= 2.4 refuses that ("only 0-dimensional arrays can be
converted to Python scalars"), which breaks every `for i in range(lo, hi)` whose bounds are
tensors. `patch_interpreter()` wraps the interpreter's tensor patching so `__index__` reads the
single element instead. It is a no-op unless TRITON_INTERPRET=1, and idempotent.
"""
from __future__ import annotations

import os

_PATCHED = False


def patch_interpreter() -> None:
    global _PATCHED
    if _PATCHED or os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import triton.runtime.interpreter as interp
    except ImportError:  # pragma: no cover
        return
    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None:  # a Triton version without this hook: nothing to fix
        _PATCHED = True
        return

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = _patch_lang_tensor
    _PATCHED = True
