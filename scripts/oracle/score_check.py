#!/usr/bin/env python3
"""Check `cera score` on any GPU against llama.cpp's teacher-forced logits of the real model.

  scripts/oracle/score_check.py [--cera BIN] [--model M.gguf] [--batch 1,32] [--prompts short,code]
                                [--fixture tests/fixtures/oracle/gemma3-270m.teacher.json]
                                [--greedy tests/fixtures/oracle/gemma3-270m.greedy.json]

The native test (`tests/model_gemma.rs`) does this on the CPU-emulated adapter; this script is the
same comparison for a machine that has the GPU and the `cera` binary but no Rust toolchain (a GPU
host for the benchmarks): it runs `cera score --tokens IDS --batch N` on each prompt of the
fixture (batch 1 is the decode path, one forward pass a token; larger batches the prefill path)
and applies the test's rules to every position (row i is the output after token i):
  - where llama.cpp's top-1 leads its second by more than 0.5 (a clear position), our argmax is its;
  - each top-1 is among the other's top 5;
  - |our top-1 logit - llama.cpp's|, mean and max over a prompt's positions, within (0.35, 3.1):
    llama.cpp's own batched-vs-sequential noise on these prompts.
With --greedy it also runs `cera generate --temperature 0` (the chained decode, its argmax on the
GPU) on each prompt of that fixture and compares the ids with llama.cpp's greedy ids up to the
first step whose margin is 0.5 or less (a near-tie may go either way; after it the texts differ).
It prints one line a prompt and batch, and exits 1 if any rule fails (2 on bad arguments).
Needs only the Python standard library.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLEAR = 0.5
TOP1_TOL = (0.35, 3.1)  # (mean, max), as tests/model_gemma.rs


def score(cera, model, tokens, batch):
    """`cera score`'s rows: [(id, logit)] best first, one list a position."""
    out = subprocess.run(
        [cera, "score", "--model", model, "--tokens", ",".join(map(str, tokens)), "--batch", str(batch)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"score_check: cera score failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [[(int(i), float(v)) for i, v in r["top"]] for r in sorted(rows, key=lambda r: r["pos"])]


def check(name, batch, ours, ref):
    """Apply the rules to one prompt; returns (ok, summary line)."""
    problems, diffs, clear = [], [], 0
    n = len(ref["tokens"])
    if len(ours) != n:
        return False, f"{name} batch {batch}: {len(ours)} rows for {n} tokens"
    for i in range(n):
        ids, logits, margin = ref["top_ids"][i], ref["top_logits"][i], ref["margin"][i]
        mine = ours[i]
        if margin > CLEAR:
            clear += 1
            if mine[0][0] != ids[0]:
                problems.append(f"pos {i}: argmax {mine[0][0]} vs llama.cpp {ids[0]} (margin {margin:.2f})")
        k = min(5, len(mine), len(ids))
        if mine[0][0] not in ids[:k] or ids[0] not in [t for t, _ in mine[:k]]:
            problems.append(f"pos {i}: top-1 not in the other's top {k}")
        diffs.append(abs(mine[0][1] - logits[0]))
    mean, top = sum(diffs) / len(diffs), max(diffs)
    if mean > TOP1_TOL[0] or top > TOP1_TOL[1]:
        problems.append(f"|top-1 logit diff| mean {mean:.3f} max {top:.3f} past {TOP1_TOL}")
    line = (
        f"{name} batch {batch}: {n} positions, {clear} clear, "
        f"|top-1 logit diff| mean {mean:.3f} max {top:.3f}: " + ("ok" if not problems else "FAILED")
    )
    return not problems, "\n".join([line] + [f"  {p}" for p in problems[:10]])


def greedy(cera, model, name, p):
    """`cera generate` greedy against llama.cpp's greedy ids; returns (ok, summary line)."""
    n = len(p["ids"])
    out = subprocess.run(
        [cera, "generate", "--model", model, "--prompt", p["prompt"], "--max-tokens", str(n),
         "--temperature", "0", "--json"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return False, f"{name} greedy: cera generate failed ({out.returncode}): {out.stderr.strip()[-300:]}"
    ids = [json.loads(line)["id"] for line in out.stdout.splitlines() if line.startswith('{"id"')]
    upto = next((i for i, m in enumerate(p["margin"]) if m <= CLEAR), n)
    same = next((i for i in range(min(len(ids), n)) if ids[i] != p["ids"][i]), min(len(ids), n))
    ok = same >= upto
    line = (f"{name} greedy: {len(ids)} ids, equal to llama.cpp's for the first {same}; "
            f"compared up to {upto} (the first near-tie): " + ("ok" if ok else "FAILED"))
    return ok, line


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cera", default=str(ROOT / "target/release/cera"))
    ap.add_argument("--model", default=str(ROOT / "models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--fixture", default=str(ROOT / "tests/fixtures/oracle/gemma3-270m.teacher.json"))
    ap.add_argument("--batch", default="1,32", help="comma-separated batch sizes")
    ap.add_argument("--prompts", default="", help="comma-separated prompt names (default: all)")
    ap.add_argument("--greedy", default="", help="a greedy fixture: also compare `cera generate`")
    a = ap.parse_args()
    try:
        batches = [int(b) for b in a.batch.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batch {a.batch!r}: want integers such as 1,32")
    fx = json.loads(Path(a.fixture).read_text())
    names = [p for p in a.prompts.split(",") if p] or list(fx["prompts"])
    unknown = [p for p in names if p not in fx["prompts"]]
    if unknown:
        ap.error(f"no prompt {unknown} in {a.fixture}: it has {list(fx['prompts'])}")
    ok = True
    for name in names:
        ref = fx["prompts"][name]
        for b in batches:
            good, line = check(name, b, score(a.cera, a.model, ref["tokens"], b), ref)
            ok &= good
            print(line, flush=True)
    if a.greedy:
        for name, p in json.loads(Path(a.greedy).read_text())["prompts"].items():
            good, line = greedy(a.cera, a.model, name, p)
            ok &= good
            print(line, flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
