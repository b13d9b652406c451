#!/usr/bin/env python3
"""Whole-sequence detokenization fixtures from llama.cpp (`llama_detokenize`).

Writes tests/fixtures/tokenizer/detokenize.json: for the committed vocab-only GGUFs llama3.gguf
(pre "llama-bpe": llama.cpp cleans up tokenization spaces) and qwen2.gguf (pre "qwen2": it does
not), per text of the corpus below the ids llama.cpp gives for tokenize(text, add_special,
parse_special=True), with and without add_special, and llama_detokenize(ids, remove_special,
unparse_special) for the four combinations of the two flags. detokenize-gemma3.json: the same for
Gemma 3's vocabulary with add_space_prefix = true (from the real model, CERA_TEST_MODEL or
models/gemma-3-270m-q4_k_m.gguf; the test rewrites the same key in the model's header). The corpus is texts around every clean-up rule (a space before
? ! . , ; a lone quote between spaces; ' s/m/re/ve/t/d/ll after a space), code, and the
tokenizer fixtures' corpus.

Usage: .oracle-venv/bin/python scripts/oracle/detokenize_fixtures.py
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tokenizer_fixtures import CORPUS  # noqa: E402  (imports llama_cpp and gguf too)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
GEMMA = Path(os.environ.get("CERA_TEST_MODEL", ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"))

RULES = [
    "Hello , world ! Is it ? Yes . Done",
    "a ? b : c",
    "x = y ? 1 : 0; print( x , y ) .",
    "It 's mine , I 'm sure , we 're here , they 've gone .",
    "don 't , I 'd , we 'll , o 'clock",
    "rock ' n ' roll",
    "a ' ' b",
    "' quoted '",
    " ?",
    " ' s",
    "end '",
    "end 's",
    "Wait...  really ?!",
    "  leading spaces , trailing   ",
    "<|im_start|>user\nHi , there !<|im_end|>",
    "<|begin_of_text|>Hello .<|eot_id|>",
    "émigré , naïve ! 中文 。",
]


def detok(vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    size = 64 + 8 * len(ids)
    for _ in range(2):
        buf = (ctypes.c_char * size)()
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        if n >= 0:
            return bytes(buf[:n])
        size = -n
    raise RuntimeError("llama_detokenize kept asking for more room")


def tokenize(vocab, text: str, add_special: bool) -> list[int]:
    b = text.encode("utf-8")
    arr = (llama_cpp.llama_token * (len(b) + 8))()
    n = llama_cpp.llama_tokenize(vocab, b, len(b), arr, len(arr), add_special, True)
    assert n >= 0, (text, n)
    return list(arr[:n])


def space_prefix_vocab(src: Path, dst: Path) -> None:
    """Gemma 3's vocabulary (SentencePiece-style) with add_space_prefix = true, vocab only: the
    space-prefix path of llama_detokenize, which Gemma itself (add_space_prefix = false) skips."""
    r = gguf.GGUFReader(str(src))

    def field(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    w = gguf.GGUFWriter(str(dst), "llama")
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list([bytes(t).decode("utf-8") for t in field("tokenizer.ggml.tokens")])
    w.add_token_scores([float(s[0]) for s in field("tokenizer.ggml.scores")])
    w.add_token_types([int(t[0]) for t in field("tokenizer.ggml.token_type")])
    w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")[0][0]))
    w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")[0][0]))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(path: Path, name: str) -> dict:
    # The low-level API only: the vocabulary, no weights, no context.
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, path
    vocab = llama_cpp.llama_model_get_vocab(model)
    cases = []
    for text in RULES + CORPUS:
        for add_special in (True, False):
            ids = tokenize(vocab, text, add_special)
            out = {}
            for remove in (False, True):
                for unparse in (False, True):
                    key = f"remove{int(remove)}_unparse{int(unparse)}"
                    out[key] = detok(vocab, ids, remove, unparse).hex()
            cases.append({"text": text, "add_special": add_special, "ids": ids, "detokenized": out})
    llama_cpp.llama_model_free(model)
    return {"name": name, "gguf": path.name, "cases": cases}


def write(name: str, vocabularies: list[dict]) -> None:
    # One case per line: compact, and a regeneration diffs by text.
    def vocab_json(v: dict) -> str:
        head = json.dumps({k: v[k] for k in ("name", "gguf")}, ensure_ascii=False)[:-1]
        cases = ",\n".join(json.dumps(c, ensure_ascii=False) for c in v["cases"])
        return f'{head}, "cases": [\n{cases}\n]}}'

    version = json.dumps(llama_cpp.__version__)
    body = ",\n".join(vocab_json(v) for v in vocabularies)
    (OUT / name).write_text(f'{{"llama_cpp_python": {version}, "vocabularies": [\n{body}\n]}}\n')
    n = sum(len(v["cases"]) for v in vocabularies)
    print(f"{name}: {n} id lists x 4 flag combinations", file=sys.stderr)


def main() -> None:
    llama_cpp.llama_backend_init()
    write("detokenize.json", [reference(OUT / f"{n}.gguf", n) for n in ("llama3", "qwen2")])
    if GEMMA.exists():
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "gemma3-space-prefix.gguf"
            space_prefix_vocab(GEMMA, path)
            write("detokenize-gemma3.json", [reference(path, "gemma3-space-prefix")])
    else:
        print(f"{GEMMA} is missing (scripts/fetch-model): detokenize-gemma3.json not written", file=sys.stderr)


if __name__ == "__main__":
    main()
