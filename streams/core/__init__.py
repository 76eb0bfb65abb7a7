"""The detection core: pure Python/NumPy, driven by the Faust workers and the replay."""

from streams.core.api import Analyzer, JobStats
from streams.core.config import DetectConfig
from streams.core.engine import Engine

__all__ = ["Analyzer", "DetectConfig", "Engine", "JobStats"]
