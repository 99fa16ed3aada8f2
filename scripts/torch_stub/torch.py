# Minimal stand-in so zipnn imports without torch; only its byte-input path is used.
import sys, types
from unittest.mock import MagicMock
class _Jit:
    @staticmethod
    def script(f): return f
jit = _Jit()
Tensor = type("Tensor", (), {})
tensor = Tensor
def is_floating_point(x): return False
_cache = {}
def __getattr__(name):
    if name not in _cache:
        _cache[name] = MagicMock(name=name)
    return _cache[name]
