"""This machine's identity, as cached measurements and native builds are keyed: `machine()` for
measurements (costs, backend choices, probes), `cpu_key()` for builds compiled for this CPU,
and `native_flags()`, the compiler flags such builds add. The CPU changes between sessions on
the machines specwise runs on, and CPUs of one model name differ (several AMD generations all
read "AMD EPYC"), so both keys hash the CPU's family, model and instruction-set flags, not its
name alone. This module measures nothing."""

from __future__ import annotations

import hashlib
import os
import platform

__all__ = ["cpu_key", "machine", "native_flags"]


def _cpuinfo() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_key(fields: dict[str, str] | None = None) -> str:
    """This CPU's architecture, then its vendor, family, model, name and instruction-set flags
    hashed (from `fields`, the cpuinfo block, read here if not given): a native build's folder
    name."""
    fields = _cpuinfo() if fields is None else fields
    keep = ("vendor_id", "cpu family", "model", "model name", "flags")
    text = "|".join(fields.get(k, "") for k in keep) or platform.processor()
    return f"{platform.machine()}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def machine() -> str:
    """The CPU's model name, `cpu_key()` and the core count: part of every cached measurement's
    key, so a measurement is never reused on another CPU."""
    fields = _cpuinfo()
    name = fields.get("model name") or platform.processor() or platform.machine()
    return f"{name}|{cpu_key(fields)}|{os.cpu_count()}"


def native_flags() -> str:
    """Compiler flags a build for this CPU adds to `-march=native`: on x86-64, AMX kernels left
    out (on some machines that report AMX they die with SIGILL at `tilezero`; the Makefile
    builds llama-cpp-python the same way); nothing elsewhere."""
    if platform.machine() in ("x86_64", "AMD64"):
        return "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    return ""


if __name__ == "__main__":  # `python src/specwise/machine.py`: the Makefile keys its build by it
    print(cpu_key())
