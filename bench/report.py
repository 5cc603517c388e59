"""What every `infernix bench` report starts with (the bench, the command line, the machine, the
model) and where it goes (stdout, and a JSON file when asked)."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import sys
from typing import Any

import torch

from services.worker.runtime import ModelRuntime


def report_header(bench: str, args: argparse.Namespace, runtime: ModelRuntime) -> dict[str, Any]:
    """What every `infernix bench` report starts with: the bench, the command line, the machine,
    the model, device and dtype (each bench adds its "options")."""
    return {"bench": bench, "command": "infernix " + shlex.join(sys.argv[1:]),
            "machine": machine(args.device), "model": args.model, "device": args.device,
            "dtype": str(runtime.dtype).removeprefix("torch.")}


def machine(device: str) -> dict[str, Any]:
    """The machine a report was measured on: platform, CPU, Python, the packages that shape the
    timings, and on a CUDA `device` the GPU and CUDA version."""

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "transformers": version("transformers"),
        "xgrammar": version("xgrammar"),
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
