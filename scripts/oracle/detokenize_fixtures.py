#!/usr/bin/env python3
"""Whole-sequence detokenization fixtures from llama.cpp (`llama_detokenize`).

Writes tests/fixtures/tokenizer/detokenize.json: for the committed vocab-only GGUFs llama3.gguf
(pre "llama-bpe": llama.cpp cleans up tokenization spaces) and qwen2.gguf (pre "qwen2": it does
not), per text of the corpus below the ids llama.cpp gives for tokenize(text, add_special=True,
parse_special=True) and llama_detokenize(ids, remove_special, unparse_special) for the four
combinations of the two flags. The corpus is texts around every clean-up rule (a space before
? ! . , ; a lone quote between spaces; ' s/m/re/ve/t/d/ll after a space), code, and the
tokenizer fixtures' corpus.

Usage: .oracle-venv/bin/python scripts/oracle/detokenize_fixtures.py
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tokenizer_fixtures import CORPUS  # noqa: E402  (imports llama_cpp and gguf too)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "tokenizer"

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


def tokenize(vocab, text: str) -> list[int]:
    b = text.encode("utf-8")
    arr = (llama_cpp.llama_token * (len(b) + 8))()
    n = llama_cpp.llama_tokenize(vocab, b, len(b), arr, len(arr), True, True)
    assert n >= 0, (text, n)
    return list(arr[:n])


def reference(path: Path, name: str) -> dict:
    # The low-level API only: the vocabulary, no weights, no context.
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, path
    vocab = llama_cpp.llama_model_get_vocab(model)
    cases = []
    for text in RULES + CORPUS:
        ids = tokenize(vocab, text)
        out = {}
        for remove in (False, True):
            for unparse in (False, True):
                key = f"remove{int(remove)}_unparse{int(unparse)}"
                out[key] = detok(vocab, ids, remove, unparse).hex()
        cases.append({"text": text, "ids": ids, "detokenized": out})
    llama_cpp.llama_model_free(model)
    return {"name": name, "gguf": path.name, "cases": cases}


def main() -> None:
    llama_cpp.llama_backend_init()
    fixture = {
        "llama_cpp_python": llama_cpp.__version__,
        "vocabularies": [reference(OUT / f"{n}.gguf", n) for n in ("llama3", "qwen2")],
    }
    (OUT / "detokenize.json").write_text(json.dumps(fixture, ensure_ascii=False, indent=0) + "\n")
    n = sum(len(v["cases"]) for v in fixture["vocabularies"])
    print(f"detokenize.json: {n} texts x 4 flag combinations", file=sys.stderr)


if __name__ == "__main__":
    main()
