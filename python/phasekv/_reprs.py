"""A __repr__ for every class of the extension that has none: its read-only properties by name,
so a cache, a result or a statistic shows what it holds at the prompt instead of an address."""

import enum

import numpy as np

_LONG = 400  # a nested value whose repr is longer shows as TypeName(…)


def _short(value) -> str:
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype})"
    if isinstance(value, (list, tuple)):
        if len(value) <= 8 and all(isinstance(v, (bool, int, float, str)) for v in value):
            inner = ", ".join(_short(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        return f"[{len(value)} items]"
    if hasattr(type(value), "__members__") or isinstance(value, enum.Enum):  # a bound enum
        return str(value)
    text = repr(value)
    return text if len(text) <= _LONG else type(value).__name__ + "(…)"


def _properties(cls):
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            if isinstance(attr, property) and not name.startswith("_"):
                yield name


def _repr(self) -> str:
    parts = []
    for name in dict.fromkeys(_properties(type(self))):
        try:
            parts.append(f"{name}={_short(getattr(self, name))}")
        except Exception:  # a property that needs state the object does not have (e.g. no trace yet)
            continue
    return f"{type(self).__name__}({', '.join(parts)})"


def _paged_cache_repr(self) -> str:
    live = self.live_sequences()
    pages = ", ".join(f"{u['used_pages']}/{u['capacity']}" for u in (self.pool_usage(k) for k in range(self.stream_count)))
    return (f"PagedCache(policy={self.policy}, streams={self.stream_count}, geometry={self.geometry!r}, "
            f"sequences={len(live)}, tokens={sum(self.tokens(s) for s in live)}, "
            f"pages used per stream=[{pages}], page_size={self.config.page_size})")


def install(*modules) -> None:
    """Gives every class of `modules` without a __repr__ of its own the property listing."""
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__.startswith("phasekv") \
                    and value.__repr__ is object.__repr__ and not hasattr(value, "__members__"):
                value.__repr__ = _paged_cache_repr if value.__name__ == "PagedCache" else _repr
