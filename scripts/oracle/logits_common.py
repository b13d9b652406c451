"""Shared helpers for the logits oracles: llama.cpp version, contexts, teacher-forced decoding.

Everything runs llama.cpp on the CPU with an F32 KV cache (type_k = type_v = 0) and flash
attention off, with 1-2 threads (the machine is shared).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
THREADS = int(os.environ.get("ORACLE_THREADS", "2"))
# llama.cpp's "extra" CPU buffer types (AMX tiles, REPACK interleaving of Q4_0/Q8_0/Q4_K...).
# Off by default: on this CPU (AMX_INT8) decoding the tiny Q8_0/Q4_0/Q4_K models with them
# segfaults, and without them every matrix goes through the plain ggml-cpu vec_dot kernels.
EXTRA_BUFTS = os.environ.get("ORACLE_EXTRA_BUFTS", "0") == "1"

_log_cb = None


def quiet_llama() -> None:
    """Silence llama.cpp's stderr logging (it prints every tensor at load)."""
    global _log_cb
    import llama_cpp
    if _log_cb is None:
        @llama_cpp.llama_log_callback
        def _cb(level, text, user_data):  # noqa: ARG001
            pass
        _log_cb = _cb
        llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))


def llama_version() -> dict:
    import llama_cpp
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    out = {"llama_cpp_python": llama_cpp.__version__}
    for fn in ("ggml_commit", "ggml_version"):
        f = getattr(lib, fn)
        f.restype = ctypes.c_char_p
        out[fn] = f().decode()
    out["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Ctx:
    """A llama.cpp model + context through the low-level API, with a batch whose every token
    requests logits. Logits come back as float32 rows (n_tokens, n_vocab)."""

    def __init__(self, model_path: Path, n_ctx: int, n_batch: int, threads: int = THREADS):
        import llama_cpp
        self.L = llama_cpp
        quiet_llama()
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = EXTRA_BUFTS
        self.model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp refused to load {model_path}")
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_seq_max = 1
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.type_k = 0  # GGML_TYPE_F32
        cp.type_v = 0
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.no_perf = True
        self.cparams = {"n_ctx": n_ctx, "n_batch": n_batch, "n_ubatch": n_batch, "threads": threads,
                        "type_k": "f32", "type_v": "f32", "flash_attn": False,
                        "swa_full": bool(cp.swa_full)}
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {model_path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_batch = n_batch
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.mem = llama_cpp.llama_get_memory(self.ctx)

    def clear(self) -> None:
        self.L.llama_memory_clear(self.mem, True)

    def decode(self, tokens, pos0: int) -> np.ndarray:
        """Decode `tokens` at positions pos0.. (in chunks of n_batch), logits for every token."""
        out = []
        for s in range(0, len(tokens), self.n_batch):
            chunk = tokens[s:s + self.n_batch]
            b = self.batch
            b.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                b.token[i] = int(t)
                b.pos[i] = pos0 + s + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1
            rc = self.L.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for i in range(len(chunk)):
                p = self.L.llama_get_logits_ith(self.ctx, i)
                out.append(np.ctypeslib.as_array(p, shape=(self.n_vocab,)).copy())
        return np.stack(out)

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        data = text.encode()
        n = len(data) + 16
        buf = (self.L.llama_token * n)()
        k = self.L.llama_tokenize(self.vocab, data, len(data), buf, n, add_bos, special)
        if k < 0:
            raise RuntimeError("tokenize buffer too small")
        return list(buf[:k])

    def piece(self, tok: int) -> str:
        buf = ctypes.create_string_buffer(256)
        k = self.L.llama_token_to_piece(self.vocab, tok, buf, 256, 0, True)
        return buf.raw[:k].decode("utf-8", errors="replace")

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def top_k(row: np.ndarray, k: int = 10):
    """(ids, values) of the k largest logits, best first (ties broken by lower id)."""
    idx = np.argpartition(-row, k)[:k]
    idx = idx[np.lexsort((idx, -row[idx]))]
    return idx.astype(int).tolist(), row[idx].astype(float).tolist()
