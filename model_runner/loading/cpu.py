"""What this CPU is, as /proc/cpuinfo says: its vendor, model name and vector and matrix extensions. A figure
measured on one CPU is not another's, so the bench names them and the engine chooses by them."""

from __future__ import annotations

import platform
from pathlib import Path


def cpuinfo(field: str) -> str | None:
    """The first /proc/cpuinfo line's value for `field`, or None where there is none (not Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (a figure from one CPU is not another's)."""
    return cpuinfo("model name") or platform.processor() or "?"


def cpu_vendor() -> str:
    """The CPU's vendor id (GenuineIntel, AuthenticAMD, …), or "?" where /proc/cpuinfo has none."""
    return cpuinfo("vendor_id") or "?"


def isa_flags() -> list[str]:
    """The CPU's vector and matrix extensions as /proc/cpuinfo lists them (avx*, amx*, fma, f16c)."""
    flags = (cpuinfo("flags") or "").split()
    return sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
