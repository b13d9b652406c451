// cera-web: GGUF language models in the browser on WebGPU.
//
// The package entry: `init` (fetch + compile the .wasm once), the `Engine` class (a friendly
// wrapper over the wasm-bindgen class: generations are async iterators), `createWorkerEngine`
// (the same API with the engine in a Web Worker) and debug counters of live GPU buffers and of
// live bytes on the wasm heap.
import initWasm, { Engine as RawEngine, gpuSelfCheck, wasmHeapLiveBytes } from '../pkg/cera_web.js';
import { addOpenaiApi } from './openai.js';

export { gpuSelfCheck, wasmHeapLiveBytes };

let ready = null;

/** Fetch and compile the .wasm (once). `wasm`: a URL/Response/Module to load it from instead. */
export function init(wasm) {
  ready ??= initWasm(wasm === undefined ? undefined : { module_or_path: wasm });
  return ready;
}

/** An `Error` with a stable `code`, like the ones the engine throws. */
export function engineError(code, message) {
  const e = new Error(message);
  e.name = 'CeraError';
  e.code = code;
  return e;
}

function requireWebGPU() {
  if (!globalThis.navigator?.gpu) {
    throw engineError(
      'NO_WEBGPU',
      'WebGPU is not available here: use Chrome/Edge 113+ (on Linux start Chromium with --enable-unsafe-webgpu ' +
        '--enable-features=Vulkan), Safari 26+ or Firefox 141+ on Windows, over https or localhost',
    );
  }
}

/**
 * A running generation: an async iterator of `{text, tokenId}` with `stats` (a promise of the
 * final stats), `stop()` and `text()` (everything, concatenated). Breaking out of a `for await`
 * stops the generation too.
 * `start(onToken)` must start the generation and return a promise of its stats; `onToken`
 * returns false once the caller asked to stop.
 */
export function tokenStream(start, signal) {
  const queue = [];
  let wake = null;
  let finished = false;
  let failure = null;
  let stopped = false;
  const notify = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  const onToken = (text, tokenId) => {
    if (text !== '' || tokenId !== null) queue.push({ text, tokenId });
    notify();
    return !(stopped || signal?.aborted);
  };
  const stats = Promise.resolve()
    .then(() => start(onToken))
    .then(
      (s) => {
        finished = true;
        notify();
        return s;
      },
      (e) => {
        failure = e;
        finished = true;
        notify();
        throw e;
      },
    );
  stats.catch(() => {});
  const it = {
    stats,
    stop() {
      stopped = true;
    },
    async next() {
      for (;;) {
        if (queue.length) return { value: queue.shift(), done: false };
        if (finished) {
          if (failure) throw failure;
          return { value: undefined, done: true };
        }
        await new Promise((r) => (wake = r));
      }
    },
    async return() {
      stopped = true;
      await stats.catch(() => {});
      return { value: undefined, done: true };
    },
    [Symbol.asyncIterator]() {
      return this;
    },
    async text() {
      let s = '';
      for await (const t of this) s += t.text;
      return s;
    },
  };
  return it;
}

/** A model on the GPU. Create with `await Engine.load(source, options)`. */
export class Engine {
  #raw;

  constructor(raw) {
    this.#raw = raw;
    addOpenaiApi(this, Engine.prototype.chat);
  }

  /**
   * Load a model from a URL, File/Blob, ReadableStream, ArrayBuffer or Uint8Array. Options:
   * onProgress, signal, cache, contextSize, nKeep, nDiscard, contextShift, exactContextShift, batchSize,
   * expectedSize, expectedSha256, wasm (where the .wasm is, if not beside this file).
   */
  static async load(source, options = {}) {
    await init(options.wasm);
    requireWebGPU();
    const { wasm, ...rest } = options;
    return new Engine(await RawEngine.load(source, rest));
  }

  /** Continue raw text. Returns a token stream (async iterator; `.stats` resolves at the end). */
  generate(prompt, options = {}) {
    const { signal, onToken: _ignored, ...rest } = options;
    return tokenStream((onToken) => this.#raw.generate(prompt, { ...rest, onToken }), signal);
  }

  /** Chat (`[{role, content}]`): the template is applied, earlier turns stay in the KV cache. */
  chat(messages, options = {}) {
    const { signal, onToken: _ignored, ...rest } = options;
    return tokenStream((onToken) => this.#raw.chat(messages, { ...rest, onToken }), signal);
  }

  tokenize(text, options) {
    return Array.from(this.#raw.tokenize(text, options));
  }
  detokenize(ids, options) {
    return this.#raw.detokenize(Uint32Array.from(ids), options);
  }
  shiftContext(nKeep, nDiscard) {
    this.#raw.shiftContext(nKeep, nDiscard);
  }
  reset() {
    this.#raw.reset();
  }
  info() {
    return this.#raw.info();
  }
  get nPast() {
    return this.#raw.nPast;
  }
  get disposed() {
    return this.#raw.disposed;
  }
  dispose() {
    this.#raw.dispose();
  }
}

/**
 * Debug: count live GPU buffers (created and not destroyed, directly or by their device's
 * destroy()). Call before loading; returns `{live}`. Keeps the buffers reachable: debug only.
 */
export function countGpuBuffers() {
  if (globalThis.__ceraBufferCounter) return globalThis.__ceraBufferCounter;
  const GD = globalThis.GPUDevice;
  const GB = globalThis.GPUBuffer;
  if (!GD || !GB) return null;
  const live = new Set();
  const perDevice = new WeakMap();
  const create = GD.prototype.createBuffer;
  GD.prototype.createBuffer = function (desc) {
    const b = create.call(this, desc);
    live.add(b);
    if (!perDevice.has(this)) perDevice.set(this, new Set());
    perDevice.get(this).add(b);
    return b;
  };
  const destroy = GB.prototype.destroy;
  GB.prototype.destroy = function () {
    live.delete(this);
    return destroy.call(this);
  };
  const destroyDevice = GD.prototype.destroy;
  GD.prototype.destroy = function () {
    for (const b of perDevice.get(this) ?? []) live.delete(b);
    return destroyDevice.call(this);
  };
  const counter = {
    get live() {
      return live.size;
    },
  };
  globalThis.__ceraBufferCounter = counter;
  return counter;
}

export { createWorkerEngine, WorkerEngine } from './worker-client.js';
export { addOpenaiApi, openaiApi } from './openai.js';
