#!/usr/bin/env python3
"""Tiny random-weight GGUF models, one per (architecture, weight type), for the forward-pass tests.

Writes tests/fixtures/models/{name}-{type}.gguf. Weights come from a fixed seed (numpy PCG64),
so regenerating gives byte-identical F32/Q8_0/Q4_0/Q5_0 files (K-quants come from llama.cpp's
quantizer, deterministic for a given llama.cpp build).

Two shapes keep the committed files small:
  * "small" (F32, Q8_0, Q4_0, Q5_0): n_embd 64, n_ff 128 — rows are multiples of 32.
  * "kq" (Q4_K, Q6_K): n_embd 256, n_ff 512 — K-quant rows must be multiples of 256. Written as
    F32 to a temporary file, then requantized by llama.cpp (`llama_model_quantize`, pure=True so
    every 2-D tensor gets the one type; 1-D norms/biases/rope_freqs stay F32).
Both: 2 layers, n_head 4, n_head_kv 2 (GQA), head_dim 64 (so n_head*head_dim = 256 != n_embd in
the small shape, as in Gemma 3 270M where 4*256 != 640), n_vocab 512, context 128. Exception:
llama.cpp's qwen2 insists on n_head*head_dim == n_embd, so small qwen2 files have head_dim 16.
lfm2 has 3 layers (short convolution, attention, short convolution: `head_count_kv` [0, 2, 0]),
a convolution of width `shortconv.l_cache` 3 and its final norm under `token_embd_norm`; as for
qwen2, llama.cpp requires n_head*head_dim == n_embd (head_dim 16 in the small shape).
phi3 is written as llama.cpp's converter writes Phi-3.5 / Phi-4-mini: q, k, v in one `attn_qkv`,
gate and up in one `ffn_up` (gate rows first), LongRoPE `rope_factors_long`/`rope_factors_short`
with `rope.scaling.attn_factor` and `rope.scaling.original_context_length`, and a sliding window
key that llama.cpp ignores for this family. Like qwen2 it needs n_head*head_dim == n_embd. "phi3"
has Phi-4-mini's partial rotary (3/4 of head_dim) and an original context of 32, below the
scoring context (llama.cpp rounds it up to 256), so the long factors apply; "phi3-short" rotates
whole heads and has an original context of 256, so the short ones apply.
qwen35 (Qwen3.5 dense, as llama.cpp's converter writes it): 4 layers, `full_attention_interval`
2 (layers 0 and 2 gated delta-net, 1 and 3 gated attention), delta-net heads of 16 (2 key heads,
4 value heads), conv kernel 4, attention head_dim 16 with 8 rotary dimensions (IMROPE sections
[2, 1, 1, 0]); the attention's q projection carries a per-head output gate beside q.
The tokenizer is `tokenizer.ggml.model = "none"` with `{arch}.vocab_size`: there is no vocabulary,
the tests feed token ids.

Usage: .oracle-venv/bin/python scripts/oracle/models_synthetic.py [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "models"

N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 64
N_VOCAB = 512
N_CTX = 128

SHAPES = {
    "small": dict(n_embd=64, n_ff=128),
    "kq": dict(n_embd=256, n_ff=512),
}
# weight type -> (shape, gguf-py quant type or None for llama.cpp requantization, general.file_type)
TYPES = {
    "F32": ("small", QT.F32, 0),
    "Q8_0": ("small", QT.Q8_0, 7),
    "Q4_0": ("small", QT.Q4_0, 2),
    "Q5_0": ("small", QT.Q5_0, 8),
    "Q4_K": ("kq", None, 14),  # LLAMA_FTYPE_MOSTLY_Q4_K_S with pure=True: every matrix Q4_K
    "Q6_K": ("kq", None, 18),  # LLAMA_FTYPE_MOSTLY_Q6_K
}

# Per architecture: the hyperparameters written beyond the common ones. Values differ from
# llama.cpp's defaults on purpose, so an engine that ignores a key fails the comparison.
ARCHS = {
    "llama": dict(arch="llama", rope_base=500000.0, eps=1e-5),
    # llama with a Llama-3-style `rope_freqs.weight` (per-dimension-pair frequency divisors).
    "llama-rope-freqs": dict(arch="llama", rope_base=500000.0, eps=1e-5, rope_freqs=True),
    # llama.cpp's qwen2 requires attn_q to be (n_embd, n_embd), i.e. n_head*head_dim == n_embd:
    # in the small shape its head_dim is 16 (4 heads x 16 = 64), in the K-quant shape 64.
    "qwen2": dict(arch="qwen2", rope_base=1000000.0, eps=1e-6, qkv_bias=True,
                  head_dim={"small": 16}),
    "qwen3": dict(arch="qwen3", rope_base=1000000.0, eps=1e-6, qk_norm=True),
    "granite": dict(arch="granite", rope_base=10000000.0, eps=1e-5,
                    embedding_scale=12.0, residual_scale=0.22, logit_scale=4.0,
                    attention_scale=0.2),
    "gemma3": dict(arch="gemma3", rope_base=1000000.0, rope_base_swa=20000.0, eps=1e-6,
                   qk_norm=True, post_norms=True, tied=True,
                   sliding_window=8, sliding_window_pattern=2),
    # SmolLM3: llama with no rope on layer 3 (every fourth layer: 4 layers needed).
    "smollm3": dict(arch="smollm3", rope_base=500000.0, eps=1e-5, n_layer=4),
    # Gemma 2: post-norms, alternating window, and soft-capping far below llama.cpp's defaults
    # (50 and 30) so that both caps change these small logits.
    "gemma2": dict(arch="gemma2", rope_base=50000.0, eps=1e-6, post_norms=True, tied=True,
                   sliding_window=8, sliding_window_pattern=2, attn_softcap=3.0, final_softcap=2.5),
    # Phi-3 / Phi-4-mini (see the module doc): long factors, partial rotary.
    "phi3": dict(arch="phi3", rope_base=10000.0, eps=1e-5, fused=True, head_dim={"small": 16},
                 rot_pct=0.75, longrope=True, n_ctx_train=128, n_ctx_orig=32, sliding_window=8),
    # Phi-3.5-mini's form: whole heads rotate, the short factors apply.
    "phi3-short": dict(arch="phi3", rope_base=10000.0, eps=1e-5, fused=True, head_dim={"small": 16},
                       longrope=True, n_ctx_train=1024, n_ctx_orig=256, sliding_window=8),
    # Qwen3.5 dense (see the module doc).
    "qwen35": dict(arch="qwen35", rope_base=10000000.0, eps=1e-6, head_dim={"small": 16}, n_layer=4,
                   full_attention_interval=2, rot=8, rope_sections=[2, 1, 1, 0],
                   ssm=dict(d_conv=4, d_state=16, n_group=2, dt_rank=4)),
    # LFM2: per-layer head_count_kv (0 = gated short convolution), QK-norm, tied head.
    "lfm2": dict(arch="lfm2", rope_base=1000000.0, eps=1e-5, qk_norm=True, tied=True,
                 head_dim={"small": 16}, n_layer=3, layer_kv=[0, N_HEAD_KV, 0], l_cache=3),
}
# Which types each model gets (the rope_freqs variant only needs one small and one K-quant file).
MODEL_TYPES = {name: list(TYPES) for name in ARCHS}
MODEL_TYPES["llama-rope-freqs"] = ["F32", "Q4_K"]
MODEL_TYPES["phi3-short"] = ["F32", "Q4_K"]


def seed_for(name: str, shape: str) -> int:
    # Stable across Python runs (no hash()): same weights for every type of one shape.
    return sum((i + 1) * b for i, b in enumerate(f"{name}/{shape}".encode())) * 7919 + 12345


def head_dim(cfg: dict, n_embd: int) -> int:
    shape = next(k for k, v in SHAPES.items() if v["n_embd"] == n_embd)
    return cfg.get("head_dim", {}).get(shape, HEAD_DIM)


def n_rot(cfg: dict, n_embd: int) -> int:
    if "rot" in cfg:
        return cfg["rot"]
    # The converter's rope_dims = int(partial_rotary_factor * n_embd) // n_head.
    return int(cfg.get("rot_pct", 1.0) * N_HEAD * head_dim(cfg, n_embd)) // N_HEAD


def make_weights(name: str, cfg: dict, n_embd: int, n_ff: int, rng: np.random.Generator):
    """Tensors as numpy arrays, shape (rows, cols) = (n_out, n_in): GGUF ne = [n_in, n_out]."""
    hd = head_dim(cfg, n_embd)
    q_dim, kv_dim = N_HEAD * hd, N_HEAD_KV * hd

    def mat(n_out, n_in, gain=1.0):
        return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)

    def norm(n, spread=0.1):
        return (1.0 + spread * rng.standard_normal(n)).astype(np.float32)

    t = {}
    # Embedding entries of std 2/sqrt(n_embd): gemma3's tied head then gives logits of std about
    # 2 (peaked enough to compare, not saturated); the untied heads are scaled to match.
    t["token_embd.weight"] = (rng.standard_normal((N_VOCAB, n_embd)) * 2.0 / np.sqrt(n_embd)).astype(np.float32)
    for il in range(cfg.get("n_layer", N_LAYER)):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(n_embd)
        if cfg["arch"] == "qwen35":
            qwen35_layer(t, p, il, cfg, n_embd, n_ff, mat, norm, rng)
            continue
        if "layer_kv" in cfg and cfg["layer_kv"][il] == 0:
            # LFM2 short convolution: in_proj -> B, C, x; conv kernel (n_embd, L) kept F32 by
            # llama.cpp's quantizer; taps of std 0.6 so the convolution's output matters.
            t[p + "shortconv.in_proj.weight"] = mat(3 * n_embd, n_embd, 1.5)
            t[p + "shortconv.conv.weight"] = (0.6 * rng.standard_normal((n_embd, cfg["l_cache"]))).astype(np.float32)
            t[p + "shortconv.out_proj.weight"] = mat(n_embd, n_embd)
            t[p + "ffn_norm.weight"] = norm(n_embd)
            t[p + "ffn_gate.weight"] = mat(n_ff, n_embd)
            t[p + "ffn_up.weight"] = mat(n_ff, n_embd)
            t[p + "ffn_down.weight"] = mat(n_embd, n_ff)
            continue
        if cfg.get("fused"):
            # Phi-3: q, k, v rows in one tensor; gate and up rows in one `ffn_up` (below).
            t[p + "attn_qkv.weight"] = np.concatenate(
                [mat(q_dim, n_embd), mat(kv_dim, n_embd), mat(kv_dim, n_embd)])
        else:
            t[p + "attn_q.weight"] = mat(q_dim, n_embd)
            t[p + "attn_k.weight"] = mat(kv_dim, n_embd)
            t[p + "attn_v.weight"] = mat(kv_dim, n_embd)
        t[p + "attn_output.weight"] = mat(n_embd, q_dim)
        if cfg.get("qkv_bias"):
            t[p + "attn_q.bias"] = (0.3 * rng.standard_normal(q_dim)).astype(np.float32)
            t[p + "attn_k.bias"] = (0.3 * rng.standard_normal(kv_dim)).astype(np.float32)
            t[p + "attn_v.bias"] = (0.3 * rng.standard_normal(kv_dim)).astype(np.float32)
        if cfg.get("qk_norm"):
            t[p + "attn_q_norm.weight"] = norm(hd, 0.3)
            t[p + "attn_k_norm.weight"] = norm(hd, 0.3)
        if cfg.get("post_norms"):
            # Gain ~8: the blocks' outputs must outweigh the embedding in the residual stream,
            # or the tied head just predicts the input token at every position.
            t[p + "post_attention_norm.weight"] = 8.0 * norm(n_embd)
            t[p + "post_ffw_norm.weight"] = 8.0 * norm(n_embd)
        t[p + "ffn_norm.weight"] = norm(n_embd)
        if cfg.get("fused"):
            t[p + "ffn_up.weight"] = np.concatenate([mat(n_ff, n_embd), mat(n_ff, n_embd)])
        else:
            t[p + "ffn_gate.weight"] = mat(n_ff, n_embd)
            t[p + "ffn_up.weight"] = mat(n_ff, n_embd)
        t[p + "ffn_down.weight"] = mat(n_embd, n_ff)
    t["token_embd_norm.weight" if cfg["arch"] == "lfm2" else "output_norm.weight"] = norm(n_embd)
    if not cfg.get("tied"):
        gain = 2.0 * cfg.get("logit_scale", 1.0)  # granite divides the logits by logit_scale
        t["output.weight"] = mat(N_VOCAB, n_embd, gain)
    if cfg.get("rope_freqs"):
        # Divisors of each pair's frequency (theta_i = pos * base^(-2i/d) / f_i), like Llama 3's
        # but random in [1, 4] so that every pair is affected at short positions.
        t["rope_freqs.weight"] = rng.uniform(1.0, 4.0, hd // 2).astype(np.float32)
    if cfg.get("longrope"):
        # LongRoPE divisors per rotary pair: the long ones large (as in Phi-3.5's, up to ~60),
        # the short ones near 1, so that taking the wrong set changes every position.
        half = n_rot(cfg, n_embd) // 2
        t["rope_factors_long.weight"] = rng.uniform(2.0, 12.0, half).astype(np.float32)
        t["rope_factors_short.weight"] = rng.uniform(1.0, 1.6, half).astype(np.float32)
    return t


def qwen35_layer(t, p, il, cfg, n_embd, n_ff, mat, norm, rng):
    """One Qwen3.5 block: gated delta-net (recurrent) or gated attention, then the SwiGLU FFN."""
    hd = head_dim(cfg, n_embd)
    ssm = cfg["ssm"]
    key_dim = ssm["d_state"] * ssm["n_group"]
    value_dim = ssm["d_state"] * ssm["dt_rank"]
    t[p + "post_attention_norm.weight"] = norm(n_embd)
    if (il + 1) % cfg["full_attention_interval"] != 0:
        t[p + "attn_qkv.weight"] = mat(2 * key_dim + value_dim, n_embd)
        t[p + "attn_gate.weight"] = mat(value_dim, n_embd)
        # Depthwise causal conv over q|k|v, (channels, d_conv), kept F32 like LFM2's.
        t[p + "ssm_conv1d.weight"] = (0.5 * rng.standard_normal((2 * key_dim + value_dim, ssm["d_conv"]))).astype(np.float32)
        t[p + "ssm_dt.bias"] = (0.5 * rng.standard_normal(ssm["dt_rank"])).astype(np.float32)
        # The converter writes A = -exp(A_log): negative decay rates.
        t[p + "ssm_a"] = (-np.exp(rng.uniform(-1.0, 1.0, ssm["dt_rank"]))).astype(np.float32)
        t[p + "ssm_beta.weight"] = mat(ssm["dt_rank"], n_embd)
        t[p + "ssm_alpha.weight"] = mat(ssm["dt_rank"], n_embd)
        t[p + "ssm_norm.weight"] = norm(ssm["d_state"])
        t[p + "ssm_out.weight"] = mat(n_embd, value_dim)
    else:
        # q and its output gate, per head side by side: (2 * head_dim * n_head) rows.
        t[p + "attn_q.weight"] = mat(2 * hd * N_HEAD, n_embd)
        t[p + "attn_k.weight"] = mat(hd * N_HEAD_KV, n_embd)
        t[p + "attn_v.weight"] = mat(hd * N_HEAD_KV, n_embd)
        t[p + "attn_output.weight"] = mat(n_embd, hd * N_HEAD)
        t[p + "attn_q_norm.weight"] = norm(hd, 0.3)
        t[p + "attn_k_norm.weight"] = norm(hd, 0.3)
    t[p + "ffn_gate.weight"] = mat(n_ff, n_embd)
    t[p + "ffn_up.weight"] = mat(n_ff, n_embd)
    t[p + "ffn_down.weight"] = mat(n_embd, n_ff)


def hparams(name: str, cfg: dict, n_embd: int, n_ff: int) -> dict:
    """The metadata keys written (without the `{arch}.` prefix), for the manifest."""
    hd = head_dim(cfg, n_embd)
    h = {
        "context_length": cfg.get("n_ctx_train", N_CTX),
        "embedding_length": n_embd,
        "block_count": cfg.get("n_layer", N_LAYER),
        "feed_forward_length": n_ff,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": cfg.get("layer_kv", N_HEAD_KV),
        "attention.key_length": hd,
        "attention.value_length": hd,
        "attention.layer_norm_rms_epsilon": cfg["eps"],
        "rope.dimension_count": n_rot(cfg, n_embd),
        "rope.freq_base": cfg["rope_base"],
        "vocab_size": N_VOCAB,
    }
    if "ssm" in cfg:
        ssm = cfg["ssm"]
        h.update({"ssm.conv_kernel": ssm["d_conv"], "ssm.state_size": ssm["d_state"],
                  "ssm.group_count": ssm["n_group"], "ssm.time_step_rank": ssm["dt_rank"],
                  "ssm.inner_size": ssm["d_state"] * ssm["dt_rank"],
                  "full_attention_interval": cfg["full_attention_interval"],
                  "rope.dimension_sections": cfg["rope_sections"]})
    if cfg.get("longrope"):
        # The converter's LongRoPE attention factor: sqrt(1 + ln(scale) / ln(original context)).
        scale = h["context_length"] / cfg["n_ctx_orig"]
        h["rope.scaling.original_context_length"] = cfg["n_ctx_orig"]
        h["rope.scaling.attn_factor"] = float(np.sqrt(1 + np.log(scale) / np.log(cfg["n_ctx_orig"])))
    for k, key in [("embedding_scale", "embedding_scale"), ("residual_scale", "residual_scale"),
                   ("logit_scale", "logit_scale"), ("attention_scale", "attention.scale"),
                   ("sliding_window", "attention.sliding_window"),
                   ("sliding_window_pattern", "attention.sliding_window_pattern"),
                   ("rope_base_swa", "rope.freq_base_swa"), ("l_cache", "shortconv.l_cache"),
                   ("attn_softcap", "attn_logit_softcapping"), ("final_softcap", "final_logit_softcapping")]:
        if k in cfg:
            h[key] = cfg[k]
    return h


def write_gguf(path: Path, name: str, cfg: dict, shape: str, qtype, file_type: int) -> dict:
    dims = SHAPES[shape]
    n_embd, n_ff = dims["n_embd"], dims["n_ff"]
    rng = np.random.Generator(np.random.PCG64(seed_for(name, shape)))
    tensors = make_weights(name, cfg, n_embd, n_ff, rng)
    arch = cfg["arch"]
    h = hparams(name, cfg, n_embd, n_ff)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"cera-web synthetic {name} ({shape})")
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, val in h.items():
        full = f"{arch}.{key}"
        if isinstance(val, float):
            w.add_float32(full, val)
        elif isinstance(val, list):  # per-layer values (lfm2's head_count_kv), as INT32 like the converter
            w.add_array(full, val)
        else:
            w.add_uint32(full, int(val))
    w.add_tokenizer_model("none")
    for tname, arr in tensors.items():
        if arr.ndim == 2 and qtype not in (None, QT.F32) and "shortconv.conv" not in tname \
                and "ssm_conv1d" not in tname:
            w.add_tensor(tname, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return h


def llama_quantize(src: Path, dst: Path, ftype: int) -> None:
    import llama_cpp
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from logits_common import quiet_llama
    quiet_llama()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = ftype
    params.pure = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({dst.name}) returned {rc}")


def tensor_types(path: Path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in r.tensors}


def build(names: list[str]) -> dict:
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            cfg = ARCHS[name]
            f32_kq = None
            for typ in MODEL_TYPES[name]:
                shape, qtype, ftype = TYPES[typ]
                dst = OUT / f"{name}-{typ}.gguf"
                if qtype is None:
                    if f32_kq is None:
                        f32_kq = Path(tmp) / f"{name}-kq-F32.gguf"
                        write_gguf(f32_kq, name, cfg, shape, QT.F32, 0)
                    llama_quantize(f32_kq, dst, ftype)
                    h = hparams(name, cfg, **SHAPES[shape])
                else:
                    h = write_gguf(dst, name, cfg, shape, qtype, ftype)
                types = sorted(set(tensor_types(dst).values()))
                manifest[f"{name}-{typ}"] = dict(
                    file=dst.name, arch=cfg["arch"], model=name, type=typ, shape=shape,
                    bytes=dst.stat().st_size, tensor_types=types,
                    seed=seed_for(name, shape), hparams=h)
                print(f"  {dst.relative_to(ROOT)}  {dst.stat().st_size:>9,} B  {types}", file=sys.stderr)
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=list(ARCHS), help="models to (re)build")
    args = ap.parse_args()
    names = args.only or list(ARCHS)
    manifest = build(names)
    path = OUT / "synthetic-models.json"
    if args.only and path.exists():  # a partial rebuild updates its models' entries only
        manifest = {**json.loads(path.read_text()), **manifest}
    path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
