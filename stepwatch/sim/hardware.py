"""Constants of the simulated hardware: an HGX H100 node with 8 ConnectX-7 NICs."""

from __future__ import annotations

import hashlib

GPU_NAME = "NVIDIA H100 80GB HBM3"
SM_CLOCK_MAX_MHZ = 1980.0
SM_CLOCK_IDLE_MHZ = 345.0
MEM_CLOCK_MHZ = 2619.0
FB_TOTAL_MIB = 81559.0
POWER_LIMIT_W = 700.0
POWER_IDLE_W = 72.0
POWER_SPIN_W = 185.0  # NCCL kernels spinning in a collective
POWER_CKPT_W = 120.0
TEMP_AMBIENT_C = 33.0
TEMP_THROTTLE_C = 87.0
NVLINK_BYTES_PER_STEP = 30e9  # per GPU, both directions each
NIC_RATE_GBPS = 400.0
MTU_BYTES = 4096

# NVML clocks-event reasons
IDLE = 0x1
SW_POWER_CAP = 0x4
SW_THERMAL = 0x20
HW_THERMAL = 0x40

# PCI bus ids of the eight GPUs of a DGX/HGX H100 board
PCI_BUS_IDS = (
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
)


def pci_bus_id(gpu: int) -> str:
    if gpu < len(PCI_BUS_IDS):
        return PCI_BUS_IDS[gpu]
    return f"00000000:{0x18 + 0x10 * gpu:02X}:00.0"


def gpu_uuid(host: str, gpu: int) -> str:
    """A stable UUID in NVML's format, derived from the host name and index."""
    h = hashlib.sha256(f"{host}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def nic_device(nic: int) -> str:
    return f"mlx5_{nic}"


def nic_netdev(nic: int) -> str:
    return f"rdma{nic}"
