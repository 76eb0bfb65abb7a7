"""Where each part of the one ``stepwatch`` package lives (docs/architecture.md,
"One identity per module").

The core is ``stepwatch/``; each service folder holds its subpackage in the
OpenTelemetry layout, ``<folder>/src/stepwatch/<folder>/`` (agents, streams,
exporters, alerts), mapped here to ``stepwatch.<folder>``. Everything else
(metadata, extras, package data) is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup

SERVICES = sorted(p.parent.name for p in Path().glob("*/src/stepwatch/*/__init__.py"))

package_dir = {f"stepwatch.{s}": f"{s}/src/stepwatch/{s}" for s in SERVICES}
# Namespace discovery below the service roots takes in the data-only folders
# (alerts/.../rules, exporters/.../schema) so that package-data ships them.
packages = find_packages(include=["stepwatch", "stepwatch.*"])
for s in SERVICES:
    packages += find_namespace_packages(f"{s}/src", include=[f"stepwatch.{s}", f"stepwatch.{s}.*"])

setup(packages=packages, package_dir=package_dir)
