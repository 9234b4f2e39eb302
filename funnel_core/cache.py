"""A small thread-safe LRU cache with a size limit (bounded memory for user-driven keys), and
the folder where funnel-rag keeps files it can rebuild (:func:`cache_root`)."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, ClassVar, Generic, Hashable, Iterator, MutableMapping, TypeVar

from funnel_core.errors import check_positive_int

__all__ = ["LRUCache", "cache_root"]



def cache_root() -> Path:
    """Where funnel-rag keeps files it can always rebuild (ONNX exports of cross-encoders, the
    demo's embeddings): ``$FUNNEL_RAG_CACHE``, else ``$XDG_CACHE_HOME/funnel-rag``, else
    ``~/.cache/funnel-rag``."""
    if os.environ.get("FUNNEL_RAG_CACHE"):
        return Path(os.environ["FUNNEL_RAG_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "funnel-rag"


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUCache(MutableMapping, Generic[K, V]):
    """A mapping that keeps at most ``maxsize`` entries, dropping the least recently used.

    Reads and writes are guarded by a lock, so one cache can be shared between threads.
    """

    def __init__(self, maxsize: int = 1024) -> None:
        self.maxsize = check_positive_int(maxsize, "maxsize (cache size)")
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        # a lock cannot be pickled or deep-copied: the copy gets its own
        with self._lock:
            return {"maxsize": self.maxsize, "_data": OrderedDict(self._data)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __getitem__(self, key: K) -> V:
        with self._lock:
            value = self._data[key]
            self._data.move_to_end(key)
            return value

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __delitem__(self, key: K) -> None:
        with self._lock:
            del self._data[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._data))

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def get_or_set(self, key: K, make: Callable[[], V]) -> V:
        """The cached value of ``key``, computed with ``make()`` (outside the lock) if missing."""
        try:
            return self[key]
        except KeyError:
            value = make()
            self[key] = value
            return value

    def __repr__(self) -> str:  # pragma: no cover
        return f"LRUCache(maxsize={self.maxsize}, size={len(self)})"


class FreshOnCopy:
    """Mixin for objects holding locks or thread-locals: pickling and deep copies drop the
    attributes named in ``_fresh_on_copy`` and the copy makes its own from the given factories."""

    _fresh_on_copy: ClassVar[dict[str, Callable[[], Any]]] = {"_write_lock": threading.Lock}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in self._fresh_on_copy:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for name, make in self._fresh_on_copy.items():
            setattr(self, name, make())
