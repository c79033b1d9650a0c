"""What the model repository is given: its own settings, not the whole ServerConfig.

RepositoryConfig.of(server_config)   # the edge builds it from the serving configuration
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from textserve.service.engine.cache_size import CacheSize
from textserve.service.repository.policy import PolicySet

if TYPE_CHECKING:
    from textserve.service.config import ServerConfig


@dataclass(frozen=True)
class RepositoryConfig:
    root: Path = Path("models")  # models/<name>/<version>/
    default_model: str | None = None  # --model; None: the only model in the repository
    version_policy: PolicySet = field(default_factory=PolicySet)  # --version-policy
    poll_interval: float = 5.0  # seconds between scans; 0: no watching (reconcile by hand)
    grace_period: float = 30.0  # seconds a retired version may take to finish its requests
    cache_size: CacheSize | None = None  # --cache-size: each model's unless serving.json says

    @classmethod
    def of(cls, config: ServerConfig) -> RepositoryConfig:
        """The repository's part of the serving configuration (validated there)."""
        return cls(
            root=Path(config.repository),
            default_model=config.model,
            version_policy=config.version_policy,
            poll_interval=config.poll_interval,
            grace_period=config.grace_period,
            cache_size=config.cache_size,
        )
