// The page side of the worker engine: the Engine API over postMessage, so the page's UI never
// blocks on the GPU. Tokens stream as messages; abort signals and stop() cross as messages too.
import { engineError, tokenStream } from './index.js';
import { addOpenaiApi } from './openai.js';

function rebuild(e) {
  return engineError(e.code, e.message);
}

/** The same API as `Engine`, with the engine in a dedicated worker (methods return promises). */
export class WorkerEngine {
  #worker;
  #next = 1;
  #pending = new Map();
  #disposed = false;

  constructor(worker) {
    this.#worker = worker;
    addOpenaiApi(this, WorkerEngine.prototype.chat);
    worker.onmessage = (e) => {
      const m = e.data;
      const p = this.#pending.get(m.id);
      if (!p) return;
      if (m.type === 'progress') p.onProgress?.(m.progress);
      else if (m.type === 'token') p.onToken?.(m.token.text, m.token.tokenId);
      else {
        this.#pending.delete(m.id);
        if (m.type === 'error') p.reject(rebuild(m.error));
        else p.resolve(m.value);
      }
    };
    worker.onerror = (e) => {
      for (const p of this.#pending.values()) p.reject(engineError('INTERNAL', `the engine worker failed: ${e.message ?? e}`));
      this.#pending.clear();
    };
  }

  #call(op, args = [], hooks = {}, transfer = []) {
    if (this.#disposed) return Promise.reject(engineError('INVALID_ARGUMENT', 'this engine was disposed; load the model again'));
    const id = this.#next++;
    const promise = new Promise((resolve, reject) => this.#pending.set(id, { resolve, reject, ...hooks }));
    this.#worker.postMessage({ id, op, args }, transfer);
    return { id, promise };
  }

  /**
   * Start a worker and load a model in it. Same options as `Engine.load`, plus `worker` (a
   * Worker to use) and `debugBuffers` (count live GPU buffers in the worker).
   */
  static async load(source, options = {}) {
    const { worker, onProgress, signal, ...rest } = options;
    const w = worker ?? new Worker(new URL('./worker.js', import.meta.url), { type: 'module', name: 'cera-web' });
    const engine = new WorkerEngine(w);
    const transfer = source instanceof ArrayBuffer || (globalThis.ReadableStream && source instanceof ReadableStream) ? [source] : [];
    if (signal?.aborted) throw engineError('ABORTED', 'the load was aborted before it started');
    const { id, promise } = engine.#call('load', [source, rest], { onProgress }, transfer);
    const onAbort = () => engine.#worker.postMessage({ id: 0, op: 'abort', args: [id] });
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      await promise;
    } catch (e) {
      if (!worker) w.terminate();
      throw e;
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
    return engine;
  }

  #stream(op, input, options = {}) {
    const { signal, onToken: _ignored, ...rest } = options;
    let id = 0;
    const onAbort = () => this.#worker.postMessage({ id: 0, op: 'abort', args: [id] });
    const s = tokenStream((onToken) => {
      const call = this.#call(op, [input, rest], { onToken });
      id = call.id;
      signal?.addEventListener('abort', onAbort, { once: true });
      return call.promise.finally(() => signal?.removeEventListener('abort', onAbort));
    }, signal);
    const stop = s.stop;
    s.stop = () => {
      stop();
      if (id) onAbort();
    };
    const ret = s.return;
    s.return = () => {
      if (id) onAbort();
      return ret.call(s);
    };
    return s;
  }

  generate(prompt, options) {
    return this.#stream('generate', prompt, options);
  }
  chat(messages, options) {
    return this.#stream('chat', messages, options);
  }
  tokenize(text, options) {
    return this.#call('tokenize', [text, options]).promise;
  }
  detokenize(ids, options) {
    return this.#call('detokenize', [Array.from(ids), options]).promise;
  }
  shiftContext(nKeep, nDiscard) {
    return this.#call('shiftContext', [nKeep, nDiscard]).promise;
  }
  reset() {
    return this.#call('reset').promise;
  }
  info() {
    return this.#call('info').promise;
  }
  nPast() {
    return this.#call('nPast').promise;
  }
  /** Debug: live GPU buffers in the worker (needs `debugBuffers: true` at load). */
  liveBuffers() {
    return this.#call('liveBuffers').promise;
  }
  get disposed() {
    return this.#disposed;
  }
  /** Free the GPU and end the worker. */
  async dispose() {
    if (this.#disposed) return;
    try {
      await this.#call('dispose').promise;
    } finally {
      this.#disposed = true;
      this.#worker.terminate();
    }
  }
}

/** `WorkerEngine.load(source, options)`: the engine in a Web Worker. */
export function createWorkerEngine(source, options) {
  return WorkerEngine.load(source, options);
}
