// A tiny llama-architecture GGUF written here from a seed (test helper for the fault tests): the
// same shapes as the native tests' tiny model (tests/common/mod.rs, `tiny_llama_gguf`): F32,
// n_vocab 256 with SentencePiece pieces "▁w{i}", n_embd 64, 4 heads (2 KV heads) of 16, n_ff 128.
// About 0.7 MB: a load, a generation and a dispose take milliseconds on SwiftShader, so fault
// tests can run a hundred of them. Token 2 (</s>) is the end-of-generation token; its output row
// is zero, so its logit (0) stays below the best ones and generations run to their length.

const GGUF_UINT32 = 4;
const GGUF_INT32 = 5;
const GGUF_FLOAT32 = 6;
const GGUF_STRING = 8;
const GGUF_ARRAY = 9;
const ALIGN = 32;

/** xorshift64* in BigInt, uniform in [-1, 1): deterministic weights from a seed. */
function rng(seed) {
  let s = (BigInt(seed) * 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn;
  s |= 1n;
  const M = 0xffffffffffffffffn;
  return () => {
    s ^= s >> 12n;
    s ^= (s << 25n) & M;
    s ^= s >> 27n;
    const v = (s * 0x2545f4914f6cdd1dn) & M;
    return Number(v >> 40n) / 2 ** 23 - 1;
  };
}

class Bytes {
  parts = [];
  u32(v) {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.parts.push(b);
  }
  i32(v) {
    const b = Buffer.alloc(4);
    b.writeInt32LE(v);
    this.parts.push(b);
  }
  f32(v) {
    const b = Buffer.alloc(4);
    b.writeFloatLE(v);
    this.parts.push(b);
  }
  u64(v) {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.parts.push(b);
  }
  str(s) {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.parts.push(b);
  }
  get length() {
    return this.parts.reduce((n, b) => n + b.length, 0);
  }
  concat() {
    return Buffer.concat(this.parts);
  }
}

/** The GGUF bytes (a Uint8Array). */
export function tinyLlamaGguf(seed = 11, nLayer = 2) {
  const [nVocab, nEmbd, nHead, nHeadKv, headDim, nFf] = [256, 64, 4, 2, 16, 128];
  const next = rng(seed);
  const kv = [
    ['general.architecture', GGUF_STRING, 'llama'],
    ['llama.context_length', GGUF_UINT32, 4096],
    ['llama.embedding_length', GGUF_UINT32, nEmbd],
    ['llama.block_count', GGUF_UINT32, nLayer],
    ['llama.feed_forward_length', GGUF_UINT32, nFf],
    ['llama.attention.head_count', GGUF_UINT32, nHead],
    ['llama.attention.head_count_kv', GGUF_UINT32, nHeadKv],
    ['llama.rope.freq_base', GGUF_FLOAT32, 10000],
    ['llama.attention.layer_norm_rms_epsilon', GGUF_FLOAT32, 1e-5],
    ['tokenizer.ggml.model', GGUF_STRING, 'llama'],
    ['tokenizer.ggml.tokens', [GGUF_ARRAY, GGUF_STRING], ['<unk>', '<s>', '</s>', ...Array.from({ length: nVocab - 3 }, (_, i) => `\u2581w${i + 3}`)]],
    ['tokenizer.ggml.scores', [GGUF_ARRAY, GGUF_FLOAT32], Array.from({ length: nVocab }, (_, i) => -i)],
    ['tokenizer.ggml.token_type', [GGUF_ARRAY, GGUF_INT32], Array.from({ length: nVocab }, (_, i) => (i < 3 ? 3 : 1))],
  ];
  const tensors = [];
  const ones = (n) => new Float32Array(n).fill(1);
  // Uniform with the variance of N(0, scale^2 / n_in), so activations stay O(1).
  const mat = (name, nIn, nOut, scale) => {
    const s = scale * Math.sqrt(3 / nIn);
    const v = new Float32Array(nIn * nOut);
    for (let i = 0; i < v.length; i++) v[i] = next() * s;
    tensors.push([name, [nIn, nOut], v]);
  };
  mat('token_embd.weight', nEmbd, nVocab, 8);
  for (let l = 0; l < nLayer; l++) {
    tensors.push([`blk.${l}.attn_norm.weight`, [nEmbd], ones(nEmbd)]);
    mat(`blk.${l}.attn_q.weight`, nEmbd, nHead * headDim, 1);
    mat(`blk.${l}.attn_k.weight`, nEmbd, nHeadKv * headDim, 1);
    mat(`blk.${l}.attn_v.weight`, nEmbd, nHeadKv * headDim, 1);
    mat(`blk.${l}.attn_output.weight`, nHead * headDim, nEmbd, 1);
    tensors.push([`blk.${l}.ffn_norm.weight`, [nEmbd], ones(nEmbd)]);
    mat(`blk.${l}.ffn_gate.weight`, nEmbd, nFf, 1);
    mat(`blk.${l}.ffn_up.weight`, nEmbd, nFf, 1);
    mat(`blk.${l}.ffn_down.weight`, nFf, nEmbd, 1);
  }
  tensors.push(['output_norm.weight', [nEmbd], ones(nEmbd)]);
  mat('output.weight', nEmbd, nVocab, 2);
  tensors.at(-1)[2].fill(0, 2 * nEmbd, 3 * nEmbd);

  const h = new Bytes();
  h.parts.push(Buffer.from('GGUF', 'latin1'));
  h.u32(3);
  h.u64(tensors.length);
  h.u64(kv.length);
  for (const [key, type, value] of kv) {
    h.str(key);
    if (Array.isArray(type)) {
      h.u32(GGUF_ARRAY);
      h.u32(type[1]);
      h.u64(value.length);
      for (const x of value) ({ [GGUF_STRING]: () => h.str(x), [GGUF_FLOAT32]: () => h.f32(x), [GGUF_INT32]: () => h.i32(x) })[type[1]]();
    } else {
      h.u32(type);
      ({ [GGUF_STRING]: () => h.str(value), [GGUF_FLOAT32]: () => h.f32(value), [GGUF_UINT32]: () => h.u32(value) })[type]();
    }
  }
  let offset = 0;
  for (const [name, dims, data] of tensors) {
    h.str(name);
    h.u32(dims.length);
    for (const d of dims) h.u64(d);
    h.u32(0); // GGML_TYPE_F32
    h.u64(offset);
    offset += Math.ceil(data.byteLength / ALIGN) * ALIGN;
  }
  const header = h.concat();
  const dataStart = Math.ceil(header.length / ALIGN) * ALIGN;
  const out = new Uint8Array(dataStart + offset);
  out.set(header, 0);
  let at = dataStart;
  for (const [, , data] of tensors) {
    out.set(new Uint8Array(data.buffer), at);
    at += Math.ceil(data.byteLength / ALIGN) * ALIGN;
  }
  return out;
}
