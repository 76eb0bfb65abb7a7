"""stepwatch: observability for distributed training.

``import stepwatch`` gives the step SDK a training script uses (see docs/sdk.md).
"""

__version__ = "0.1.0"
