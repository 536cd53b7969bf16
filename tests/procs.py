"""Test helper: the processes whose command line holds a marker (for tests that check nothing outlives its run)."""
from __future__ import annotations

import os
from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Process ids whose /proc command line contains ``marker`` (processes gone mid-scan are skipped)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
    return found
