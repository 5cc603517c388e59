"""What every `infernix bench` report starts with (the bench, the command line, the machine, the
model) and where it goes (stdout, and a JSON file when asked). The model benches describe their
machine with `machine`, the grammar and client benches theirs with `host`."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.worker.runtime import ModelRuntime


def report_header(bench: str, args: argparse.Namespace, runtime: ModelRuntime) -> dict[str, Any]:
    """What every `infernix bench` report starts with: the bench, the command line, the machine,
    the model, device and dtype (each bench adds its "options")."""
    return {"bench": bench, "command": "infernix " + shlex.join(sys.argv[1:]),
            "machine": machine(args.device), "model": args.model, "device": args.device,
            "dtype": str(runtime.dtype).removeprefix("torch.")}


def package_version(name: str) -> str | None:
    """The installed version of package `name`; None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def host(*packages: str) -> dict[str, Any]:
    """The machine of a bench that runs no model: platform, Python and the named packages'
    versions (None: not installed)."""
    return {"platform": platform.platform(), "python": sys.version.split()[0],
            **{name: package_version(name) for name in packages}}


def machine(device: str) -> dict[str, Any]:
    """The machine a report was measured on: platform, CPU, Python, the packages that shape the
    timings, and on a CUDA `device` the GPU and CUDA version."""
    import torch  # the grammar and client benches, and the CLI's parser, import this module

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "transformers": package_version("transformers"),
        "xgrammar": package_version("xgrammar"),
        "torch_threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def write_report(report: dict, out: str | None) -> None:
    """Print the report as JSON and also write it to `out` when given."""
    text = json.dumps(report, indent=2, default=str)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
