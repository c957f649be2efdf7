"""The head of a small GPU script's result file: the device line (nvidia-smi: name, driver), the library versions and
the command, so that every number traces to the machine and the code that made it."""
import subprocess
import sys

import torch
import triton

import ula


def smi_line():
    """nvidia-smi's name and driver of the GPU(s), one line each."""
    return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


def header():
    return dict(device=smi_line(), torch=torch.__version__, triton=triton.__version__, ula=ula.__version__,
                command=" ".join(sys.argv), results=[])
