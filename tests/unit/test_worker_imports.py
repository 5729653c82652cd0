"""What a worker process imports: every worker pays it at each start, on every core it
shares with the plugin (docs/naive.md counts it in the workers' CPU a record)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_worker_does_not_import_the_settings_models() -> None:
    """runtime.config builds pydantic models at import: ~0.2 s of CPU, half of a worker's
    start. A worker gets its WorkerSpec ready-made and never needs them."""
    code = ("import sys, runtime.worker.process; "
            "print(sorted(m for m in ('pydantic', 'runtime.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         check=True)
    assert out.stdout.strip() == "[]"
