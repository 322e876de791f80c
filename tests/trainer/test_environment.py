"""The machine record (trainer/devices/environment.py) every summary.json and study results file carries."""

from __future__ import annotations

import torch

from trainer.devices import environment

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9654 96-Core Processor
stepping\t: 1
cpu MHz\t\t: 2400.000

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: something else
"""

CONFIG = """PyTorch built with:
  - GCC 13.3
  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64 architecture applications
  - CPU capability usage: AVX512
  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, LAPACK_INFO=mkl, TORCH_VERSION=2.13.0, USE_MKL=ON, USE_MKLDNN=ON, USE_OPENMP=ON,
"""


def test_parse_cpuinfo_reads_the_first_processor():
    assert environment.parse_cpuinfo(CPUINFO) == {
        "vendor": "AuthenticAMD",
        "family": "25",
        "model": "17",
        "model_name": "AMD EPYC 9654 96-Core Processor",
        "stepping": "1",
    }


def test_parse_build_settings_names_the_blas():
    build = environment.parse_build_settings(CONFIG)
    assert build["BLAS_INFO"] == "mkl" and build["LAPACK_INFO"] == "mkl"
    assert build["USE_MKL"] == "ON" and build["TORCH_VERSION"] == "2.13.0"
    assert build["library"].startswith("Intel(R) oneAPI Math Kernel Library Version 2024.2")
    openblas = environment.parse_build_settings(
        "  - Build settings: BLAS_INFO=open, LAPACK_INFO=open,"
    )
    assert openblas == {"BLAS_INFO": "open", "LAPACK_INFO": "open"}


def test_the_record_of_this_machine():
    record = environment.environment_record()
    assert record["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["torch"] == torch.__version__
    assert record["blas"]["BLAS_INFO"]  # this torch was built with some BLAS
    assert record["gpus"] == ([] if not torch.cuda.is_available() else record["gpus"])
    label = environment.environment_label(record)
    assert record["cpu"]["capability"] in label and torch.__version__ in label


def test_cpu_key_changes_with_the_capability_and_the_model(monkeypatch):
    base = {"vendor": "GenuineIntel", "model_name": "Xeon", "family": "6", "model": "85",
            "machine": "x86_64", "capability": "AVX512"}  # fmt: skip
    keys = set()
    for change in ({}, {"capability": "AVX2"}, {"model_name": "Xeon Gold"}, {"family": "25"}):
        monkeypatch.setattr(environment, "cpu_record", lambda c=change: {**base, **c})
        keys.add(environment.cpu_key())
    assert len(keys) == 4
    monkeypatch.setattr(environment, "cpu_record", lambda: base)
    assert environment.cpu_key().startswith("AVX512-")


def test_group_environments_names_each_machine_and_its_runs():
    here = environment.environment_record()
    other = {**here, "cpu": {**here["cpu"], "model_name": "Other CPU"}}
    groups = environment.group_environments(
        [
            ("a/seed0", here),
            ("a/seed1", {**here, "os": "Linux 9"}),
            ("b/seed0", other),
            ("b/seed1", None),
        ]
    )
    assert [g["runs"] for g in groups] == [["a/seed0", "a/seed1"], ["b/seed0"], ["b/seed1"]]
    assert groups[2]["label"] == "not recorded" and "Other CPU" in groups[1]["label"]
