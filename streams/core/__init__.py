"""The detection core: pure Python/NumPy, driven by the Faust workers and the replay."""

from stepwatch.streams.core.api import Analyzer, JobStats
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.engine import Engine

__all__ = ["Analyzer", "DetectConfig", "Engine", "JobStats"]
