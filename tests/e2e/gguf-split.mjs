// Split a GGUF file like llama.cpp's gguf-split: part 1 holds every metadata key, each part holds
// split.no / split.count / split.tensors.count and a share of the tensors (each part a complete
// GGUF with its own header). Test helper for the split-load e2e test.
import { openSync, readSync, fstatSync, writeSync, closeSync } from 'node:fs';

const SIZES = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };

function headerOf(fd) {
  const size = fstatSync(fd).size;
  const buf = Buffer.alloc(Math.min(size, 64 << 20));
  readSync(fd, buf, 0, buf.length, 0);
  let o = 0;
  const u32 = () => ((o += 4), buf.readUInt32LE(o - 4));
  const u64 = () => ((o += 8), Number(buf.readBigUInt64LE(o - 8)));
  const str = () => {
    const n = u64();
    o += n;
    return buf.toString('utf8', o - n, o);
  };
  const skipValue = (t) => {
    if (t === 8) str();
    else if (t === 9) {
      const et = u32();
      const n = u64();
      if (et === 8) for (let i = 0; i < n; i++) str();
      else if (et === 9) throw new Error('nested arrays');
      else o += n * SIZES[et];
    } else o += SIZES[t];
  };
  if (buf.toString('latin1', 0, 4) !== 'GGUF') throw new Error('not a GGUF');
  o = 4;
  const version = u32();
  const nTensors = u64();
  const nKv = u64();
  const kvs = [];
  let alignment = 32;
  for (let i = 0; i < nKv; i++) {
    const start = o;
    const key = str();
    const t = u32();
    if (key === 'general.alignment') alignment = buf.readUInt32LE(o);
    skipValue(t);
    kvs.push({ key, raw: buf.subarray(start, o) });
  }
  const tensors = [];
  for (let i = 0; i < nTensors; i++) {
    const start = o;
    str();
    const nd = u32();
    o += 8 * nd + 4;
    const offPos = o;
    const offset = u64();
    tensors.push({ head: buf.subarray(start, offPos), offset });
  }
  const dataStart = Math.ceil(o / alignment) * alignment;
  const sorted = [...tensors].sort((a, b) => a.offset - b.offset);
  sorted.forEach((t, i) => (t.size = (i + 1 < sorted.length ? sorted[i + 1].offset : size - dataStart) - t.offset));
  return { version, kvs, tensors, alignment, dataStart };
}

function kv(key, type, value) {
  const k = Buffer.from(key);
  const head = Buffer.alloc(8 + k.length + 4);
  head.writeBigUInt64LE(BigInt(k.length), 0);
  k.copy(head, 8);
  head.writeUInt32LE(type, 8 + k.length);
  const v = Buffer.alloc(type === 5 ? 4 : 2);
  if (type === 5) v.writeInt32LE(value);
  else v.writeUInt16LE(value);
  return Buffer.concat([head, v]);
}

/** Write `src` as `nParts` files named by `name(i)` (i from 1). */
export function splitGguf(src, nParts, name) {
  const fd = openSync(src, 'r');
  const h = headerOf(fd);
  const per = Math.ceil(h.tensors.length / nParts);
  for (let p = 0; p < nParts; p++) {
    const ts = h.tensors.slice(p * per, (p + 1) * per);
    const kvs = [
      ...(p === 0 ? h.kvs.map((k) => k.raw) : h.kvs.filter((k) => k.key === 'general.alignment').map((k) => k.raw)),
      kv('split.no', 2, p),
      kv('split.count', 2, nParts),
      kv('split.tensors.count', 5, h.tensors.length),
    ];
    const pre = Buffer.alloc(24);
    pre.write('GGUF', 0, 'latin1');
    pre.writeUInt32LE(h.version, 4);
    pre.writeBigUInt64LE(BigInt(ts.length), 8);
    pre.writeBigUInt64LE(BigInt(kvs.length), 16);
    const infos = [];
    let off = 0;
    for (const t of ts) {
      const o = Buffer.alloc(8);
      o.writeBigUInt64LE(BigInt(off));
      infos.push(t.head, o);
      t.newOffset = off;
      off += Math.ceil(t.size / h.alignment) * h.alignment;
    }
    let header = Buffer.concat([pre, ...kvs, ...infos]);
    const pad = Math.ceil(header.length / h.alignment) * h.alignment - header.length;
    header = Buffer.concat([header, Buffer.alloc(pad)]);
    const out = openSync(name(p + 1), 'w');
    writeSync(out, header);
    let at = header.length;
    for (const t of ts) {
      const data = Buffer.alloc(Math.ceil(t.size / h.alignment) * h.alignment);
      readSync(fd, data, 0, t.size, h.dataStart + t.offset);
      // The last tensor of a part needs no padding after it.
      const bytes = t === ts[ts.length - 1] ? data.subarray(0, t.size) : data;
      writeSync(out, bytes, 0, bytes.length, header.length + t.newOffset);
      at += bytes.length;
    }
    closeSync(out);
  }
}
