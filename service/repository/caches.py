"""Each model's response cache through the life of its versions (engine/cache.py holds it).

The repository decides, per model and at each scan, how large its cache is (serving.json's
"cache_size", else --cache-size; "off" or neither: none), gives every version that starts
serving its own view of it, and retires that view the moment the version stops serving, so no
answer of one version is ever given for another.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from textserve.service.engine.cache import CacheSize, ResponseCache
from textserve.service.repository.policy import ServingFile
from textserve.service.repository.records import ModelRecord, State

if TYPE_CHECKING:
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.metrics import Metrics

logger = logging.getLogger(__name__)


def wanted_size(default: CacheSize | None, from_file: ServingFile | None) -> CacheSize | None:
    """The model's cache size: its serving.json's, else the flag's (None: no cache)."""
    if from_file is not None and from_file.cache_off:
        return None
    if from_file is not None and from_file.cache_size is not None:
        return from_file.cache_size
    return default


def apply_size(record: ModelRecord, size: CacheSize | None, metrics: Metrics | None) -> None:
    """Make `record`'s cache `size`: created (and given to its serving versions), resized,
    or dropped (its versions then answer every text by inference)."""
    cache = record.cache
    if cache is not None and size == cache.size:
        return
    if size is None:
        if cache is not None:
            logger.info("model %s: response cache off", record.name)
            for handle in _serving(record):
                handle.use_cache(None)
            cache.clear()
            record.cache = None
        return
    if cache is not None:
        logger.info("model %s: response cache %s -> %s", record.name, cache.size, size)
        cache.resize(size)
        return
    observer = None if metrics is None else metrics.for_cache(record.name)
    record.cache = ResponseCache(size, observer)
    logger.info("model %s: response cache of %s", record.name, size)
    for handle in _serving(record):
        attach(record, handle)


def attach(record: ModelRecord, handle: ModelHandle) -> None:
    """A version about to serve answers repeated texts from the model's cache (its own view)."""
    if record.cache is not None:
        handle.use_cache(record.cache.view(handle.version, handle.max_length))


def retire(handle: ModelHandle | None) -> None:
    """The version stops serving: its cached answers are unreachable from now on."""
    if handle is not None and handle.cache is not None:
        handle.cache.retire()


def _serving(record: ModelRecord) -> list[ModelHandle]:
    return [
        v.handle
        for v in record.versions.values()
        if v.state is State.READY and v.handle is not None
    ]
