"""Framework integrations for the step SDK (PyTorch DDP / FSDP): see docs/sdk.md."""
