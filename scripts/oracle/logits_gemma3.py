#!/usr/bin/env python3
"""llama.cpp references for the real Gemma 3 270M Q4_K_M (models/gemma-3-270m-q4_k_m.gguf).

Writes, under tests/fixtures/oracle/:
  gemma3-270m.teacher.json  teacher-forced: for every position of 4 prompts (short, code,
                            medium, long > the 512 sliding window) the top 10 (id, logit), the
                            margin top1 - top2 and log-sum-exp; plus llama.cpp's batched vs
                            token-by-token self-noise on the same prompts.
  gemma3-270m.greedy.json   greedy continuations (32 tokens or up to an end-of-generation token)
                            of 4 prompts, raw and with the Gemma chat template: ids, per-step
                            margins and top 5.
  gemma3-270m.shift.json    context shift (n_keep 4, n_discard 16) on a 40-token sequence:
                            `fresh` = a fresh evaluation of tokens [0,4) + [20,40) at positions
                            0..23; `llama_shift` = llama.cpp's own shift (seq_rm + seq_add, K
                            re-rotated) followed by 16 greedy steps, and the same steps evaluated
                            fresh (teacher-forced) for comparison.
Logits are rounded to 4 decimals. Positions: row i is the output after token i (predicts i+1).

Usage: .oracle-venv/bin/python scripts/oracle/logits_gemma3.py
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from logits_common import FIXTURES, ROOT, Ctx, llama_version, sha256, top_k  # noqa: E402
import logits_gemma3_prompts as P  # noqa: E402

MODEL = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
OUT = FIXTURES / "oracle"
N_CTX = 1024
N_BATCH = 128
GREEDY_STEPS = 32
N_KEEP, N_DISCARD, SHIFT_LEN, SHIFT_STEPS = 4, 16, 40, 16


def r4(x) -> float:
    return round(float(x), 4)


def lse(row: np.ndarray) -> float:
    m = row.max()
    return float(m + np.log(np.exp(row.astype(np.float64) - m).sum()))


def summarize(rows: np.ndarray, k: int = 10) -> dict:
    ids, vals, margins, lses = [], [], [], []
    for row in rows:
        i, v = top_k(row, k)
        ids.append(i)
        vals.append([r4(x) for x in v])
        margins.append(r4(v[0] - v[1]))
        lses.append(r4(lse(row)))
    return dict(top_ids=ids, top_logits=vals, margin=margins, lse=lses)


def dump(obj, path: Path) -> None:
    """JSON with one line per innermost numeric list (compact, still diffable)."""
    s = json.dumps(obj, indent=1, ensure_ascii=False)
    s = re.sub(r"\[\s+([-+0-9.eE,\s]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", s)
    path.write_text(s + "\n")
    print(f"  {path.relative_to(ROOT)}  {path.stat().st_size:,} B", file=sys.stderr)


def teacher(ctx: Ctx) -> dict:
    prompts, noise = {}, {}
    for name, text in P.TEACHER.items():
        toks = ctx.tokenize(text, add_bos=True, special=False)
        ctx.clear()
        t0 = time.time()
        batched = ctx.decode(toks, 0)
        dt_batched = time.time() - t0
        ctx.clear()
        t0 = time.time()
        seq = np.concatenate([ctx.decode([t], i) for i, t in enumerate(toks)])
        dt_seq = time.time() - t0
        d = np.abs(batched - seq)
        srt = np.sort(batched, axis=1)
        margin = srt[:, -1] - srt[:, -2]
        flips = np.nonzero(batched.argmax(1) != seq.argmax(1))[0]
        noise[name] = dict(
            n_tokens=len(toks), max_abs_diff=r4(d.max()), mean_abs_diff=float(f"{d.mean():.3g}"),
            argmax_flips=[dict(pos=int(p), margin=r4(margin[p])) for p in flips],
            seconds_batched=round(dt_batched, 2), seconds_token_by_token=round(dt_seq, 2))
        prompts[name] = dict(text=text, tokens=toks, **summarize(batched))
        print(f"  teacher {name:7s} {len(toks):4d} tokens: batched {dt_batched:.1f} s, "
              f"token-by-token {dt_seq:.1f} s, self-noise max {d.max():.3f} mean {d.mean():.4f} "
              f"flips {len(flips)}", file=sys.stderr)
    return dict(prompts=prompts, self_noise=noise)


def greedy(ctx: Ctx, prompt_tokens: list[int], steps: int, pos0: int = 0, first_logits=None):
    """Greedy decoding: returns ids and per-step summaries (the logits each token came from)."""
    ids, margins, top5_ids, top5_logits = [], [], [], []
    row = first_logits
    pos = pos0
    if row is None:
        row = ctx.decode(prompt_tokens, pos0)[-1]
        pos = pos0 + len(prompt_tokens)
    stopped = False
    for _ in range(steps):
        i, v = top_k(row, 5)
        ids.append(i[0])
        margins.append(r4(v[0] - v[1]))
        top5_ids.append(i)
        top5_logits.append([r4(x) for x in v])
        if ctx.L.llama_vocab_is_eog(ctx.vocab, i[0]):
            stopped = True
            break
        row = ctx.decode([i[0]], pos)[0]
        pos += 1
    return dict(ids=ids, margin=margins, top5_ids=top5_ids, top5_logits=top5_logits,
                stopped_at_eog=stopped)


def greedy_all(ctx: Ctx) -> dict:
    out = {}
    for name, text in P.GREEDY.items():
        toks = ctx.tokenize(text, add_bos=True, special=True)
        ctx.clear()
        t0 = time.time()
        g = greedy(ctx, toks, GREEDY_STEPS)
        near = next((k for k, m in enumerate(g["margin"]) if m < 0.5), None)
        out[name] = dict(prompt=text, prompt_tokens=toks, **g,
                         text="".join(ctx.piece(t) for t in g["ids"]),
                         first_near_tie_step=near)
        print(f"  greedy {name:13s} {len(g['ids'])} tokens in {time.time() - t0:.1f} s, "
              f"first margin < 0.5 at step {near}: {out[name]['text']!r}", file=sys.stderr)
    return out


def shift(ctx: Ctx) -> dict:
    seq = ctx.tokenize(P.SHIFT_TEXT, add_bos=True, special=False)[:SHIFT_LEN]
    kept = seq[:N_KEEP] + seq[N_KEEP + N_DISCARD:]
    # (1) fresh evaluation of the retained tokens at rebased positions 0..23.
    ctx.clear()
    fresh = summarize(ctx.decode(kept, 0))
    # (2) llama.cpp's own context shift, as its examples do it: prefill 40 tokens, greedy token
    # from the last logits, then drop cells [n_keep, n_keep + n_discard) and move the rest back.
    ctx.clear()
    pre = ctx.decode(seq, 0)
    assert ctx.L.llama_memory_can_shift(ctx.mem)
    ok = ctx.L.llama_memory_seq_rm(ctx.mem, 0, N_KEEP, N_KEEP + N_DISCARD)
    assert ok
    ctx.L.llama_memory_seq_add(ctx.mem, 0, N_KEEP + N_DISCARD, SHIFT_LEN, -N_DISCARD)
    pos_max = ctx.L.llama_memory_seq_pos_max(ctx.mem, 0)
    assert pos_max == SHIFT_LEN - N_DISCARD - 1, pos_max
    g = greedy(ctx, None, SHIFT_STEPS, pos0=SHIFT_LEN - N_DISCARD, first_logits=pre[-1])
    # (3) the same continuation teacher-forced on a fresh cache (what an exact shift of an
    # exactly recomputed cache would give; differs because the retained cells' K/V were
    # computed while the discarded tokens were still visible).
    ctx.clear()
    fresh_cont = ctx.decode(kept + g["ids"][:-1], 0)[len(kept) - 1:]
    fc = summarize(fresh_cont, 5)
    diffs = [abs(a[0] - b[0]) for a, b in zip(g["top5_logits"], fc["top_logits"])]
    return dict(
        n_keep=N_KEEP, n_discard=N_DISCARD, tokens=seq, kept_tokens=kept,
        kept_positions=list(range(len(kept))),
        fresh=dict(about="fresh evaluation of kept_tokens at positions 0..23 (top 10 per "
                         "position)", **fresh),
        prefill_last=dict(about="logits after the 40 tokens, before the shift",
                          **{k: v[0] for k, v in summarize(pre[-1:]).items()}),
        llama_shift=dict(
            about="prefill tokens at 0..39, argmax of the last logits = ids[0]; then "
                  "seq_rm [4,20) + seq_add [20,40) by -16 (llama.cpp re-rotates K); then ids[k] "
                  "decoded at position 24+k, each step's top 5 came from the previous token",
            **g),
        fresh_continuation=dict(
            about="kept_tokens + llama_shift.ids[:-1] evaluated fresh at positions 0..; rows "
                  "from the last kept token on, aligned with llama_shift steps",
            argmax=[i[0] for i in fc["top_ids"]], top5_ids=fc["top_ids"],
            top5_logits=fc["top_logits"], margin=fc["margin"]),
        shift_vs_fresh_top1_logit_abs_diff=[r4(x) for x in diffs],
    )


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    ctx = Ctx(MODEL, n_ctx=N_CTX, n_batch=N_BATCH)
    common = dict(model="models/gemma-3-270m-q4_k_m.gguf", model_sha256=sha256(MODEL),
                  llama_cpp=llama_version(), context=ctx.cparams, n_vocab=ctx.n_vocab)
    t0 = time.time()
    tf = teacher(ctx)
    dump(dict(about="Teacher-forced llama.cpp logits (top 10 per position) of Gemma 3 270M "
                    "Q4_K_M; regenerate with scripts/oracle/logits_all.py",
              positions="row i = output after token i (predicts token i+1); tokens include "
                        "BOS as llama.cpp adds it",
              **common, seconds=round(time.time() - t0, 1), **tf),
         OUT / "gemma3-270m.teacher.json")
    t0 = time.time()
    gr = greedy_all(ctx)
    dump(dict(about="Greedy continuations by llama.cpp (batched prefill, then one token per "
                    "decode); step k's margin/top5 are the logits ids[k] was chosen from. "
                    "Compare only up to the first step with margin < 0.5.",
              chat_template=P.CHAT, max_steps=GREEDY_STEPS, **common,
              seconds=round(time.time() - t0, 1), prompts=gr),
         OUT / "gemma3-270m.greedy.json")
    t0 = time.time()
    sh = shift(ctx)
    dump(dict(about="Context-shift references (n_keep 4, n_discard 16) on 40 tokens",
              **common, seconds=round(time.time() - t0, 1), **sh),
         OUT / "gemma3-270m.shift.json")
    ctx.close()
    print(f"[oracle] gemma3-270m references in {time.time() - t_all:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
