// The engine inside a Web Worker: runs the messages WorkerEngine (worker-client.js) posts.
// Protocol: in {id, op, args}; out {id, type: 'progress' | 'token' | 'result' | 'error', ...}.
import { Engine, countGpuBuffers } from './index.js';

let engine = null;
/** id -> what an 'abort' message stops: an AbortController (load) or a token stream. */
const running = new Map();

const post = (msg) => self.postMessage(msg);
const fail = (id, e) =>
  post({ id, type: 'error', error: { message: String(e?.message ?? e), code: e?.code ?? 'INTERNAL', name: e?.name ?? 'Error' } });

async function handle(id, op, args) {
  switch (op) {
    case 'load': {
      const [source, options = {}] = args;
      if (options.debugBuffers) countGpuBuffers();
      const ctl = new AbortController();
      running.set(id, ctl);
      engine?.dispose();
      engine = null;
      const { debugBuffers, ...rest } = options;
      engine = await Engine.load(source, {
        ...rest,
        signal: ctl.signal,
        onProgress: (progress) => post({ id, type: 'progress', progress }),
      });
      return null;
    }
    case 'generate':
    case 'chat': {
      if (!engine) throw Object.assign(new Error('no model is loaded'), { code: 'INVALID_ARGUMENT' });
      const stream = engine[op](args[0], args[1] ?? {});
      running.set(id, stream);
      for await (const t of stream) post({ id, type: 'token', token: t });
      return await stream.stats;
    }
    case 'abort': {
      const r = running.get(args[0]);
      if (r instanceof AbortController) r.abort();
      else r?.stop();
      return null;
    }
    case 'liveBuffers':
      return globalThis.__ceraBufferCounter?.live ?? null;
    case 'dispose':
      engine?.dispose();
      return null;
    case 'nPast':
      return engine?.nPast ?? 0;
    case 'tokenize':
    case 'detokenize':
    case 'shiftContext':
    case 'reset':
    case 'info':
      if (!engine) throw Object.assign(new Error('no model is loaded'), { code: 'INVALID_ARGUMENT' });
      return engine[op](...args);
    default:
      throw Object.assign(new Error(`unknown operation ${op}`), { code: 'INVALID_ARGUMENT' });
  }
}

self.onmessage = async (e) => {
  const { id, op, args } = e.data;
  try {
    const value = await handle(id, op, args ?? []);
    if (op !== 'abort') post({ id, type: 'result', value });
  } catch (err) {
    fail(id, err);
  } finally {
    if (op !== 'abort') running.delete(id);
  }
};
