"""Benchmark the agent's contract fit of its own readings (``stepwatch/contract/fit.py``).

Every GPU and port message the agent's collectors build goes through
:func:`stepwatch.contract.fit.fit_message` before it is stamped and sent, so that
one value the contract refuses costs that value, not the host's message. The
baseline, measured in the same run, is what the agent does with each message
anyway: encoding it (``stepwatch.contract.encode``). Messages: 8 GPUs and 8 ports
with every value in bounds (the usual case), and 8 GPUs of which one has an ECC
count beyond the contract's ceiling.

Run: ``python bench/bench_agent_fit.py [--repeat 2000]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from stepwatch.contract import GpuMessage, GpuReading, Message, PortMessage, PortReading, encode
from stepwatch.contract.fit import fit_message

T0 = 1_767_225_600.0


def gpus(odd: bool = False) -> GpuMessage:
    readings = [
        GpuReading(
            index=i,
            uuid=f"GPU-{i:032x}",
            name="NVIDIA H100 80GB HBM3",
            power_w=300.0,
            temp_gpu_c=60.0,
            sm_clock_mhz=1980.0,
            energy_mj_total=10**9,
            ecc_sbe_total=2**41 if odd and i == 3 else 3,
        )
        for i in range(8)
    ]
    return GpuMessage(host="node01", ts=T0, gpus=readings)


def ports() -> PortMessage:
    readings = [
        PortReading(
            device=f"mlx5_{i}",
            port=1,
            state="ACTIVE",
            xmit_bytes_total=10**12,
            rcv_bytes_total=10**12,
            link_downed_total=0,
        )
        for i in range(8)
    ]
    return PortMessage(host="node01", ts=T0, ports=readings)


def per_call_us(fn: Callable[[Message], object], message: Message, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn(message)
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    print(f"{'message':<28}{'fit us':>10}{'encode us':>12}{'fit/encode':>12}")
    for name, message in (
        ("8 GPUs", gpus()),
        ("8 ports", ports()),
        ("8 GPUs, one odd", gpus(True)),
    ):
        fit = per_call_us(fit_message, message, args.repeat)
        base = per_call_us(encode, message, args.repeat)
        print(f"{name:<28}{fit:>10.1f}{base:>12.1f}{fit / base:>12.1f}")


if __name__ == "__main__":
    main()
