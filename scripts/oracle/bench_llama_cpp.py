#!/usr/bin/env python3
"""llama.cpp's CPU speed on a GGUF, as a peer for `cera bench` on the same machine.

Usage: .oracle-venv/bin/python scripts/oracle/bench_llama_cpp.py MODEL.gguf [--prompt-tokens 64]
       [--gen-tokens 16] [--threads 2] [--runs 3]
Prints JSON: prefill and decode tok/s (medians), same prompt construction as `cera bench`.
"""
import argparse, json, statistics, time

import llama_cpp
import llama_cpp.llama as _high

# llama.cpp's extra CPU buffer types (AMX tiles, REPACK) crash on this machine kind (see
# scripts/oracle/README.md): force the plain CPU kernels, as the fixture scripts do.
_default_params = llama_cpp.llama_model_default_params


def _params():
    p = _default_params()
    p.use_extra_bufts = False
    return p


llama_cpp.llama_model_default_params = _params
_high.llama_cpp.llama_model_default_params = _params

TEXT = ("The history of the printing press begins in the fifteenth century, when movable type "
        "changed how books were made, how ideas travelled and who could read them. Within fifty years "
        "presses were running in more than two hundred cities across Europe, and the number of books grew "
        "from thousands to millions. ")

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--prompt-tokens", type=int, default=64)
ap.add_argument("--gen-tokens", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--runs", type=int, default=3)
a = ap.parse_args()

llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.prompt_tokens + a.gen_tokens + 8, n_batch=512,
                      n_threads=a.threads, n_threads_batch=a.threads, verbose=False, logits_all=False)
prompt = llm.tokenize(TEXT.encode(), add_bos=True)
body = prompt[1:]
while len(prompt) < a.prompt_tokens:
    prompt += body
prompt = prompt[: a.prompt_tokens]
pre, dec = [], []
for run in range(a.runs + 1):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
    t1 = time.perf_counter()
    for _ in range(a.gen_tokens - 1):
        llm.eval([tok])
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
    t2 = time.perf_counter()
    if run > 0:
        pre.append(len(prompt) / (t1 - t0))
        dec.append((a.gen_tokens - 1) / (t2 - t1))
print(json.dumps({"engine": "llama.cpp (CPU, llama-cpp-python %s)" % llama_cpp.__version__, "threads": a.threads,
                  "prompt_tokens": len(prompt), "gen_tokens": a.gen_tokens, "runs": a.runs,
                  "prefill_tok_s": statistics.median(pre), "decode_tok_s": statistics.median(dec),
                  "prefill_tok_s_runs": pre, "decode_tok_s_runs": dec}, indent=1))
