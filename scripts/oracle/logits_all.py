#!/usr/bin/env python3
"""Regenerate every llama.cpp oracle fixture: the tiny synthetic models, their teacher-forced
logits, the sampler chain's draw counts, and the real Gemma 3 270M references. About a minute on 2 cores.

Usage (from anywhere): scripts/oracle/logits_all.py     (builds .oracle-venv first if missing)
Environment: ORACLE_THREADS (default 2).
"""
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "scripts" / "oracle"
PY = ROOT / ".oracle-venv" / "bin" / "python"


def main() -> None:
    if Path(sys.executable).resolve() != PY.resolve() or not PY.exists():
        if not PY.exists() or subprocess.run([str(PY), "-c", "import llama_cpp"],
                                             capture_output=True).returncode != 0:
            subprocess.run([str(HERE / "setup-venv")], check=True)
        os.execv(str(PY), [str(PY), __file__, *sys.argv[1:]])
    steps = ["models_synthetic.py", "logits_synthetic.py", "sampler_dist.py"]
    if (ROOT / "models" / "gemma-3-270m-q4_k_m.gguf").exists():
        steps.append("logits_gemma3.py")
    else:
        print("[oracle] models/gemma-3-270m-q4_k_m.gguf missing (scripts/fetch-model): "
              "skipping the real-model references", file=sys.stderr)
    for step in steps:
        t0 = time.time()
        subprocess.run([str(PY), str(HERE / step)], check=True, cwd=ROOT)
        print(f"[oracle] {step}: {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
