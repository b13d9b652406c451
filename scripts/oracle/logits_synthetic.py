#!/usr/bin/env python3
"""Teacher-forced llama.cpp logits for every tiny synthetic model (tests/fixtures/models/*.gguf).

For each model: the fixed 24-token sequence TOKENS (longer than gemma3's window of 8) is decoded
in one batch with logits for every position; the (24, n_vocab) little-endian f32 matrix goes to
tests/fixtures/oracle/{model}-{type}.logits.f32. The same tokens decoded one at a time (a fresh
KV cache, one llama_decode per token) give llama.cpp's own batched-vs-sequential disagreement,
recorded per model as `self_noise` in tests/fixtures/oracle/synthetic.json.

Usage: .oracle-venv/bin/python scripts/oracle/logits_synthetic.py   (after models_synthetic.py)
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from logits_common import FIXTURES, ROOT, Ctx, llama_version, sha256

# Fixed sequence: ids spread over the 512-token vocabulary, with the edges (0, 511) and repeats
# (17 and 300 come back) so attention to an equal key at two positions is exercised.
TOKENS = [1, 17, 300, 42, 511, 0, 256, 99, 17, 128, 405, 7, 300, 64, 233, 470,
          12, 381, 17, 150, 299, 88, 444, 5]
N_CTX = 128


def main() -> None:
    models_json = FIXTURES / "models" / "synthetic-models.json"
    models = json.loads(models_json.read_text())
    # --only NAME...: rescore those models (model keys such as lfm2-F32, or a prefix such as
    # lfm2), keeping the other entries of synthetic.json.
    only = sys.argv[sys.argv.index("--only") + 1:] if "--only" in sys.argv else None
    old = json.loads((FIXTURES / "oracle" / "synthetic.json").read_text())["models"] if only else {}
    if only:
        models = {k: m for k, m in models.items() if any(k == o or m["model"] == o for o in only)}
    out_dir = FIXTURES / "oracle"
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = dict(old)
    cparams = None
    t0 = time.time()
    for key, m in models.items():
        path = FIXTURES / "models" / m["file"]
        ctx = Ctx(path, n_ctx=N_CTX, n_batch=N_CTX)
        cparams = ctx.cparams
        assert ctx.n_vocab == m["hparams"]["vocab_size"], (key, ctx.n_vocab)
        batched = ctx.decode(TOKENS, 0)
        ctx.clear()
        seq = np.concatenate([ctx.decode([t], i) for i, t in enumerate(TOKENS)])
        ctx.close()
        assert np.isfinite(batched).all(), key
        diff = np.abs(batched - seq)
        logits_file = f"{key}.logits.f32"
        batched.astype("<f4").tofile(out_dir / logits_file)
        srt = np.sort(batched, axis=1)
        entries[key] = dict(
            model=f"models/{m['file']}", model_sha256=sha256(path), logits=logits_file,
            arch=m["arch"], type=m["type"], shape=[len(TOKENS), ctx.n_vocab],
            tensor_types=m["tensor_types"], hparams=m["hparams"],
            argmax=batched.argmax(axis=1).tolist(),
            logit_std=round(float(batched.std()), 4),
            min_top2_margin=round(float((srt[:, -1] - srt[:, -2]).min()), 5),
            self_noise=dict(max_abs_diff=float(diff.max()),
                            mean_abs_diff=float(diff.mean()),
                            max_rel_diff=float(diff.max() / np.abs(batched).max()),
                            argmax_flips=int((batched.argmax(1) != seq.argmax(1)).sum())),
        )
        print(f"  {key:24s} std {entries[key]['logit_std']:6.3f}  self-noise max "
              f"{diff.max():.2e}  mean {diff.mean():.2e}", file=sys.stderr)
    manifest = dict(
        about="Teacher-forced llama.cpp logits of the tiny synthetic models; "
              "regenerate with scripts/oracle/logits_all.py",
        llama_cpp=llama_version(), context=cparams, tokens=TOKENS,
        positions="token i at position i (0-based), logits row i predicts token i+1",
        logits_format="little-endian float32, row-major (n_tokens, n_vocab)",
        self_noise_about="llama.cpp batched decode vs token-by-token decode of the same "
                         "tokens, same build and settings",
        models=entries)
    (out_dir / "synthetic.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"[oracle] {len(entries)} synthetic models in {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts" / "oracle"))
    main()
