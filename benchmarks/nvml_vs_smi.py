"""loadgen's NVML reading of each GPU against `nvidia-smi --query-gpu`, read back to back, N times.

Needs a machine with an NVIDIA GPU, its driver, nvidia-smi and `pip install 'loadgen[nvml]'`;
prints per GPU and field the two sources' values and their largest difference over the rounds
(static fields must be equal; power draw and clocks move between the two reads).

    python benchmarks/nvml_vs_smi.py [ROUNDS]
"""

from __future__ import annotations

import sys
import time

from loadgen.client.machine_facts import read_nvidia_smi, read_nvml

FIELDS = ("name", "driver", "pcie_gen", "pcie_max_gen", "pcie_width", "pcie_max_width", "power_limit_w",
          "power_default_limit_w", "power_draw_w", "sm_clock_mhz", "mem_clock_mhz", "temperature_c",
          "memory_used_mib", "throttle_reasons")


def main(rounds: int) -> int:
    diffs: dict[tuple[int, str], list[str]] = {}
    for _ in range(rounds):
        nvml, smi = read_nvml(), read_nvidia_smi()
        if not nvml or not smi:
            print("no GPU through NVML or nvidia-smi: run this on a GPU machine with loadgen[nvml]")
            return 1
        for a, b in zip(nvml, smi):
            for field in FIELDS:
                va, vb = getattr(a, field), getattr(b, field)
                if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                    diffs.setdefault((a.index, field), []).append(f"{va} {vb} {abs(va - vb):.3g}")
                else:
                    diffs.setdefault((a.index, field), []).append(f"{va!r} {vb!r} {'same' if va == vb else 'DIFFER'}")
        time.sleep(0.2)
    print(f"{'gpu':>3}  {'field':<22} nvml / nvidia-smi / |difference| per round")
    for (index, field), rows in sorted(diffs.items()):
        print(f"{index:>3}  {field:<22} " + " | ".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
