"""The detection core: pure Python/NumPy, driven by the Faust workers and the replay."""

from stepwatch.extras import require

require("numpy", what="the detection core")

from stepwatch.streams.core.api import Analyzer, JobStats  # noqa: E402
from stepwatch.streams.core.config import DetectConfig  # noqa: E402
from stepwatch.streams.core.engine import Engine  # noqa: E402

__all__ = ["Analyzer", "DetectConfig", "Engine", "JobStats"]
