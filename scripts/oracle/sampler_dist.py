#!/usr/bin/env python3
"""llama.cpp's sampler chain as the reference distribution for our sampler.

For each configuration (temperature / top-k / top-p / min-p / penalties over a fixed history),
this builds llama.cpp's chain in its order (penalties, top_k, top_p, min_p, temp, dist) through
llama-cpp-python's low-level sampler API, applies it DRAWS times to the same logits, and counts
the tokens it picks. It also records the support: the ids left after every sampler but `dist`.
No model is needed: the logits are seeded here and written to the fixture.

Writes tests/fixtures/oracle/sampler-dist.json, which tests/sampler_dist.rs compares with the
tokens our sampler draws from the same logits.
"""
from __future__ import annotations

import ctypes
import json
import time

import numpy as np

from logits_common import FIXTURES, llama_version

N_VOCAB = 512
DRAWS = 100_000
SEED = 20261203

# (name, params). Every configuration keeps at most 64 candidates after truncation (asserted
# below), where our GPU top-64 candidates make the chain exact (see src/generate/sampler.rs).
CONFIGS = [
    ("defaults", dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)),
    ("top_k_64_hot", dict(temperature=1.5, top_k=64, top_p=1.0, min_p=0.0)),
    ("top_p_only", dict(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0)),
    ("min_p_only", dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.1)),
    ("cold_top_k_10", dict(temperature=0.3, top_k=10, top_p=1.0, min_p=0.0)),
    ("penalties", dict(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05,
                       repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.5,
                       penalty_last_n=64)),
]


def logits_for(rng: np.random.Generator) -> np.ndarray:
    # Gaussian logits with a spread of 2.5: a few dozen tokens carry most of the mass, and a long
    # tail that top-k / top-p / min-p must cut.
    return (rng.standard_normal(N_VOCAB) * 2.5).astype(np.float32)


def run_config(L, logits: np.ndarray, history: list[int], p: dict, seed: int):
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    rep = p.get("repeat_penalty", 1.0)
    freq = p.get("frequency_penalty", 0.0)
    pres = p.get("presence_penalty", 0.0)
    last_n = p.get("penalty_last_n", 64)
    # common_sampler_init's order: penalties, top_k, top_p, min_p, temp_ext, dist (dry,
    # top_n_sigma, typical, xtc off).
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(N_VOCAB, last_n, rep, freq, pres))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(p["top_k"]))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(p["top_p"], 1))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(p["min_p"], 1))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(p["temperature"]))
    n_pre = L.llama_sampler_chain_n(chain)
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed))
    for t in history:
        L.llama_sampler_accept(chain, t)

    template = (L.llama_token_data * N_VOCAB)()
    for i, x in enumerate(logits.tolist()):
        template[i] = L.llama_token_data(i, x, 0.0)
    work = (L.llama_token_data * N_VOCAB)()
    nbytes = ctypes.sizeof(template)

    def fresh():
        ctypes.memmove(work, template, nbytes)
        arr = L.llama_token_data_array(work, N_VOCAB, -1, False)
        return arr

    # The support: every sampler but dist, applied once.
    arr = fresh()
    for i in range(n_pre):
        L.llama_sampler_apply(L.llama_sampler_chain_get(chain, i), ctypes.byref(arr))
    support = sorted(int(arr.data[i].id) for i in range(arr.size))

    counts = np.zeros(N_VOCAB, dtype=np.int64)
    for _ in range(DRAWS):
        arr = fresh()
        L.llama_sampler_apply(chain, ctypes.byref(arr))
        counts[arr.data[arr.selected].id] += 1
    L.llama_sampler_free(chain)
    return support, counts


def main() -> None:
    import llama_cpp as L
    rng = np.random.default_rng(SEED)
    out = {"llama_cpp": llama_version(), "n_vocab": N_VOCAB, "draws": DRAWS, "configs": []}
    t_all = time.time()
    for k, (name, p) in enumerate(CONFIGS):
        logits = logits_for(rng)
        order = np.argsort(-logits, kind="stable")
        # History for the penalties: the top 3 tokens, the first twice (count 2), and a mid one.
        history = [int(order[0]), int(order[0]), int(order[1]), int(order[2]), int(order[20])]
        if "repeat_penalty" not in p:
            history = []
        t0 = time.time()
        support, counts = run_config(L, logits, history, p, SEED + k)
        assert 1 < len(support) <= 64, (name, len(support))
        drawn = {int(i): int(c) for i, c in enumerate(counts) if c > 0}
        assert set(drawn) <= set(support), name
        print(f"{name}: support {len(support)}, {len(drawn)} drawn, {time.time() - t0:.1f} s")
        out["configs"].append({
            "name": name,
            "params": p,
            "history": history,
            "logits": [float(x) for x in logits],
            "support": support,
            "counts": drawn,
        })
    path = FIXTURES / "oracle" / "sampler-dist.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path} in {time.time() - t_all:.1f} s")


if __name__ == "__main__":
    main()
