"""The machine a benchmark ran on, as every `kvscope bench` report records it: platform, processor,
threads, library versions, the device, and the load average (read at the start and at the end)."""

from __future__ import annotations

import os
import platform
from typing import Any


def machine_info(facts) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": facts.device,
        "device_name": facts.device_name,
        "load_average_start": load_average(),
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the system has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
