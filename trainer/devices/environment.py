"""The machine a run or a study ran on: CPU model and capability, torch and BLAS build, GPUs.

A CPU run's bits depend on the CPU: torch dispatches its kernels by the CPU's
instruction set (``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2,
AVX512, ...) and MKL picks its own code path by vendor and model, so the same
config and seed train a different base on another CPU (docs/results.md: an
AMD EPYC stopped base 0's warm start at SFT step 500 where the study's
machine stopped at 550). Every summary.json and every study results file
records ``environment_record()``, and the warm-start cache key carries
``cpu_key()`` so that a shared cache never hands one CPU's base to another.
``group_environments`` says which machines a study's runs ran on. Torch is
imported only where the record is made, so study tables read records without it.

The code is part of a run's identity too: a change to the rollout engine's
reductions changes every later bit (docs/results.md, "Near the edge"), so the
record also names the trainer's source (``code_record``: the git commit where
there is one, and a hash of the trainer's Python files, which a checkout with
local edits or a copy without git still has).
"""

from __future__ import annotations

import hashlib
import platform
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
# The /proc/cpuinfo fields that name the processor (not its speed or its core).
_CPU_FIELDS = {
    "vendor_id": "vendor",
    "model name": "model_name",
    "cpu family": "family",
    "model": "model",
    "stepping": "stepping",
}
# torch.__config__.show()'s "Build settings:" entries that say which BLAS and LAPACK it calls.
_BUILD_FIELDS = ("BLAS_INFO", "LAPACK_INFO", "USE_MKL", "USE_MKLDNN", "USE_OPENMP", "TORCH_VERSION")


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor's identity in /proc/cpuinfo text: vendor, model_name,
    family, model, stepping (those present)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break  # the first processor's block ends at its blank line
            continue
        name, _, value = line.partition(":")
        key = _CPU_FIELDS.get(name.strip())
        if key and key not in out:
            out[key] = value.strip()
    return out


def parse_build_settings(config_text: str) -> dict[str, str]:
    """The BLAS entries of ``torch.__config__.show()``: BLAS_INFO, LAPACK_INFO, USE_MKL,
    ... from its "Build settings:" line, and the MKL or OpenBLAS version line."""
    out: dict[str, str] = {}
    settings = config_text.split("Build settings:", 1)[-1]
    for name in _BUILD_FIELDS:
        match = re.search(rf"\b{name}=([^,\s]*)", settings)
        if match:
            out[name] = match.group(1)
    for line in config_text.splitlines():
        text = line.strip().lstrip("- ").strip()
        if "Math Kernel Library" in text or "OpenBLAS" in text:
            out["library"] = text
            break
    return out


@lru_cache(maxsize=1)
def cpu_record() -> dict[str, str]:
    """This machine's CPU: vendor, model name, family/model/stepping (Linux), the
    platform's processor string elsewhere, and torch's dispatch capability."""
    try:
        identity = parse_cpuinfo(CPUINFO.read_text())
    except OSError:
        identity = {}
    if "model_name" not in identity:
        identity["model_name"] = platform.processor() or platform.machine()
    import torch

    identity["machine"] = platform.machine()
    identity["capability"] = torch.backends.cpu.get_cpu_capability()
    return identity


def cpu_key() -> str:
    """A short name of this CPU for cache keys: torch's capability and a fingerprint
    of the processor's identity, e.g. ``AVX512-3f2a9c1e``."""
    cpu = cpu_record()
    ident = "|".join(cpu.get(k, "") for k in ("vendor", "model_name", "family", "model", "machine"))
    return f"{cpu['capability']}-{hashlib.sha256(ident.encode()).hexdigest()[:8]}"


def gpu_records() -> list[dict[str, str]]:
    """Each visible CUDA device's name and compute capability ([] without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    records = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        records.append(
            {
                "index": str(index),
                "name": torch.cuda.get_device_name(index),
                "capability": f"sm{major}{minor}",
            }
        )
    return records


TRAINER_ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def code_record() -> dict[str, Any]:
    """The trainer's source: ``commit`` (git HEAD of its checkout, None without git),
    ``modified`` (the checkout's trainer/ differs from that commit) and ``sha256`` of
    every trainer/**/*.py file, path and bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(TRAINER_ROOT.rglob("*.py")):
        digest.update(path.relative_to(TRAINER_ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    commit = modified = None
    try:
        git = ["git", "-C", str(TRAINER_ROOT)]
        head = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode == 0:
            commit = head.stdout.strip()
            status = subprocess.run(
                [*git, "status", "--porcelain", "--", "."],
                capture_output=True,
                text=True,
                timeout=10,
            )
            modified = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        pass  # no git on this machine: the hash still names the code
    return {"commit": commit, "modified": modified, "sha256": digest.hexdigest()}


def environment_record() -> dict[str, Any]:
    """What summary.json and a study's results say about the machine and the code
    (JSON-ready)."""
    import torch

    return {
        "cpu": dict(cpu_record()),
        "torch": torch.__version__,
        "blas": parse_build_settings(torch.__config__.show()),
        "cuda": torch.version.cuda,
        "gpus": gpu_records(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "code": code_record(),
    }


def environment_label(record: dict[str, Any]) -> str:
    """One line for a table: CPU model and capability, torch, BLAS, the GPUs."""
    cpu = record.get("cpu", {})
    blas = record.get("blas", {}).get("BLAS_INFO", "?")
    gpus = ", ".join(f"{g['name']} ({g['capability']})" for g in record.get("gpus") or [])
    text = (
        f"{cpu.get('model_name', '?')} (family {cpu.get('family', '?')} model "
        f"{cpu.get('model', '?')}, {cpu.get('capability', '?')}), torch {record.get('torch')}, "
        f"BLAS {blas}"
    )
    return f"{text}, GPUs {gpus}" if gpus else text


def group_environments(records: list[tuple[str, dict[str, Any] | None]]) -> list[dict[str, Any]]:
    """(run name, its summary's environment or None) pairs -> one entry per distinct
    machine: its record, label and runs; runs without a record (run before
    summaries carried one) under ``"record": None``. A study whose runs came
    from more than one entry mixed machines, and its cells may sit on different bases."""
    groups: dict[str, dict[str, Any]] = {}
    for name, record in records:
        key = "none" if record is None else repr(sorted(_identity(record).items()))
        group = groups.setdefault(
            key,
            {
                "record": record,
                "label": "not recorded" if record is None else environment_label(record),
                "runs": [],
            },
        )
        group["runs"].append(name)
    return list(groups.values())


def _identity(record: dict[str, Any]) -> dict[str, Any]:
    """What makes two records the same machine for a run's bits (not the OS release)."""
    cpu = record.get("cpu", {})
    return {
        "cpu": tuple(sorted(cpu.items())),
        "torch": record.get("torch"),
        "blas": tuple(sorted(record.get("blas", {}).items())),
        "gpus": tuple((g.get("name"), g.get("capability")) for g in record.get("gpus") or []),
    }


def environments_line(groups: list[dict[str, Any]]) -> str:
    """Which machines ran the study's runs, one clause each (several: its cells may
    sit on different bases, since a base's bits depend on the CPU)."""
    if not groups:
        return "Machines: no finished run."
    parts = [f"{g['label']}: {len(g['runs'])} runs" for g in groups]
    warning = (
        " (more than one machine: compare cells only on the same one)" if len(groups) > 1 else ""
    )
    return "Machines: " + "; ".join(parts) + warning + "."
