"""Parse each config YAML file once per process: Hydra re-reads every file of the defaults list on each compose.

Composing the trainer config reads ``ppo_trainer.yaml`` (~700 lines) and the files it names; OmegaConf's YAML
loader (pure-Python PyYAML plus OmegaConf's node wrapping) takes ~85 ms for that file alone on a 2-core CPU,
a third of a whole ``load_config``.  A process that loads many configurations (the tests, a sweep script, a
notebook) paid it every time.

:func:`install` puts a subclass of Hydra's ``FileConfigSource`` in Hydra's registry of config sources for the
``file://`` scheme; it keeps the parsed ``DictConfig`` of each file keyed by (source, real path, mtime, size) and hands
Hydra a deep copy (~20 ms), since Hydra merges into what it loads.  An edited file has a new stamp and is parsed
again.  If Hydra's internals are not where this expects them (another Hydra version), nothing is installed and
composition works as before, only slower.
"""

from __future__ import annotations

import copy
import os
import threading

__all__ = ["install"]

_installed = False
_lock = threading.Lock()


def install() -> bool:
    """Register the caching source for ``file://`` (idempotent); False where Hydra's layout is unknown."""
    global _installed
    if _installed:
        return True
    try:
        from hydra._internal.core_plugins.file_config_source import FileConfigSource
        from hydra._internal.sources_registry import SourcesRegistry
        from hydra.plugins.config_source import ConfigResult
    except ImportError:
        return False
    registry = SourcesRegistry.instance()
    if registry.types.get("file") is not FileConfigSource:  # someone else's source: leave it alone
        return False

    class CachedFileConfigSource(FileConfigSource):
        _cache: dict[tuple[str, str, str, int, int], ConfigResult] = {}

        def load_config(self, config_path: str) -> ConfigResult:
            full = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
            try:
                st = os.stat(full)
            except OSError:
                return super().load_config(config_path)  # Hydra's own "not found" error
            key = (self.provider, self.path, full, st.st_mtime_ns, st.st_size)
            with _lock:
                hit = self._cache.get(key)
            if hit is None:
                hit = super().load_config(config_path)
                with _lock:
                    self._cache[key] = hit
            return ConfigResult(config=copy.deepcopy(hit.config), path=hit.path, provider=hit.provider,
                                header=dict(hit.header))

    registry.types["file"] = CachedFileConfigSource
    _installed = True
    return True
