// npm run bench:dawn -- --model PATH [--prompt-tokens 256] [--gen-tokens 128] [--runs 3] [--dawn OPT]...
//                        [--out FILE]
//
// `cera bench`, but through the npm package running in node on Dawn (Chrome's WebGPU
// implementation, from the npm package `webgpu`): the browser's GPU path without a browser. It
// prints one JSON object with the fields `cera bench` prints (same prompt text, same warm-up run,
// medians of the timed runs), plus what only this path has: load time, the wasm heap and Dawn's
// adapter. The figures it cannot measure from JS (the output head timed alone) are null.
//
// It is also the reference for using cera-web from node: `setupDawn` is all the set-up the
// package needs there, and the rest goes through the package's own `Engine` (js/index.js).
//
// Exit codes: 0 ok, 1 the run failed, 2 bad arguments or missing files, 3 no WebGPU adapter.
import { mkdirSync, statSync, createReadStream, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { parseArgs } from 'node:util';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

const USAGE = `usage: npm run bench:dawn -- --model PATH [--prompt-tokens N] [--gen-tokens N] [--runs N]
                           [--context N] [--batch N] [--dawn OPTION]... [--wasm PATH]
  --model PATH         the .gguf file (streamed from disk, never held in the JS heap)
  --prompt-tokens N    prompt length in tokens, BOS included (default 256, as cera bench)
  --gen-tokens N       tokens generated per run (default 128)
  --runs N             timed runs after one warm-up run; medians are reported (default 3)
  --context N          context size (default prompt + gen + 8, as cera bench)
  --batch N            prefill batch (default min(prompt, 512), as cera bench)
  --dawn OPTION        passed to Dawn's create(), e.g. 'adapter=NVIDIA H200' or 'backend=vulkan'
  --wasm PATH          the .wasm (default pkg/cera_web_bg.wasm: run npm run build first)
  --out FILE           also write the JSON to FILE (Dawn itself may print to stdout, e.g. a
                       shader compiler's warnings, before the JSON)`;

/** The prompt `cera bench` uses (src/generate/bench.rs), repeated up to the wanted length. */
const TEXT =
  'The history of the printing press begins in the fifteenth century, when movable type ' +
  'changed how books were made, how ideas travelled and who could read them. Within fifty years ' +
  'presses were running in more than two hundred cities across Europe, and the number of books grew ' +
  'from thousands to millions. ';

class UsageError extends Error {}

function fail(code, message) {
  console.error(`bench:dawn: ${message}`);
  process.exit(code);
}

function positive(name, value) {
  if (!/^[1-9][0-9]*$/.test(value)) throw new UsageError(`--${name} must be a positive integer, not ${JSON.stringify(value)}`);
  return Number(value);
}

/** Command line -> settings. Throws UsageError with a message a user can act on. */
export function parseBenchArgs(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: {
        model: { type: 'string' },
        'prompt-tokens': { type: 'string', default: '256' },
        'gen-tokens': { type: 'string', default: '128' },
        runs: { type: 'string', default: '3' },
        context: { type: 'string' },
        batch: { type: 'string' },
        dawn: { type: 'string', multiple: true, default: [] },
        wasm: { type: 'string', default: `${root}/pkg/cera_web_bg.wasm` },
        out: { type: 'string' },
        help: { type: 'boolean', short: 'h', default: false },
      },
    }).values;
  } catch (e) {
    throw new UsageError(e.message);
  }
  if (parsed.help) return { help: true };
  if (!parsed.model) throw new UsageError('--model PATH is required (a .gguf file)');
  const promptTokens = positive('prompt-tokens', parsed['prompt-tokens']);
  const genTokens = positive('gen-tokens', parsed['gen-tokens']);
  return {
    model: parsed.model,
    promptTokens,
    genTokens,
    runs: positive('runs', parsed.runs),
    context: parsed.context ? positive('context', parsed.context) : promptTokens + genTokens + 8,
    batch: parsed.batch ? positive('batch', parsed.batch) : Math.min(promptTokens, 512),
    dawn: parsed.dawn,
    wasm: parsed.wasm,
    out: parsed.out,
  };
}

/**
 * Give node the globals the package (wgpu's WebGPU backend) expects of a browser, backed by Dawn.
 * `dawnOptions`: strings for Dawn's create(), e.g. ['adapter=NVIDIA H200']. Returns navigator.gpu.
 */
export async function setupDawn(dawnOptions = []) {
  let webgpu;
  try {
    webgpu = await import('webgpu');
  } catch (e) {
    throw new Error(`the npm package 'webgpu' (Dawn for node) is not installed: npm install webgpu (${e.message})`);
  }
  // The Vulkan loader wants a runtime dir; without one it prints errors (harmless, but noisy).
  if (!process.env.XDG_RUNTIME_DIR && process.getuid) {
    const dir = `/tmp/cera-xdg-${process.getuid()}`;
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    process.env.XDG_RUNTIME_DIR = dir;
  }
  // GPUBufferUsage, GPUMapMode, GPUAdapter, ...: the constants and classes wgpu refers to by name.
  Object.assign(globalThis, webgpu.globals);
  // wgpu reads navigator.gpu only in a window or a worker; it tells them apart by whether the
  // global `Window` or `WorkerGlobalScope` is defined, so node must look like a window.
  globalThis.Window ??= class Window {};
  const gpu = webgpu.create(dawnOptions);
  // node 21+ has a read-only `navigator` of its own: replace it rather than assign to it.
  Object.defineProperty(globalThis, 'navigator', { value: { gpu }, configurable: true, writable: true });
  return gpu;
}

function median(v) {
  const s = [...v].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** The longest prefix of the repeated bench text that tokenizes to at most `n` tokens. */
function promptOfLength(engine, n) {
  const count = (s) => engine.tokenize(s).length;
  let text = TEXT;
  while (count(text) < n) text += TEXT;
  let lo = 0;
  let hi = text.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (count(text.slice(0, mid)) <= n) lo = mid;
    else hi = mid - 1;
  }
  return text.slice(0, lo);
}

async function main() {
  let args;
  try {
    args = parseBenchArgs(process.argv.slice(2));
  } catch (e) {
    if (e instanceof UsageError) fail(2, `${e.message}\n${USAGE}`);
    throw e;
  }
  if (args.help) {
    console.log(USAGE);
    return 0;
  }
  let modelBytes;
  try {
    modelBytes = statSync(args.model).size;
  } catch {
    fail(2, `no model file at ${args.model}`);
  }
  // Set-up and the package build, as `npm start` does (after the arguments are checked, so a
  // typo is reported at once).
  const { prepare } = await import('./prepare.mjs');
  prepare({ model: false });

  let gpu;
  try {
    gpu = await setupDawn(args.dawn);
  } catch (e) {
    fail(2, e.message);
  }
  // Ask once up front, so "no GPU" gets its own message before the model is read.
  const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) {
    fail(
      3,
      'Dawn found no WebGPU adapter (its own reason, if any, is printed above). Dawn needs a GPU driver it ' +
        'accepts: Mesa lavapipe is rejected (it lacks shaderUniform*ArrayDynamicIndexing). On a GPU host check ' +
        'that Vulkan sees the GPU (an NVIDIA container may need VK_DRIVER_FILES=.../nvidia_icd.json and the GL ' +
        'vendor-neutral libraries, see docs/benchmarking.md); on a CPU-only Linux machine SwiftShader works: ' +
        'VK_DRIVER_FILES=/usr/lib/chromium/vk_swiftshader_icd.json.',
    );
  }
  let wasmBytes;
  try {
    wasmBytes = await readFile(args.wasm);
  } catch {
    fail(2, `no .wasm at ${args.wasm}: build the package first (npm run build)`);
  }

  const dawnAdapter = {
    vendor: adapter.info.vendor,
    architecture: adapter.info.architecture,
    device: adapter.info.device,
    description: adapter.info.description,
  };

  const { init, Engine } = await import('../js/index.js');
  // node's fetch() has no file: URLs, so the .wasm goes to wasm-bindgen's init as bytes.
  const wasm = await init(wasmBytes);
  const heap = () => wasm.memory.buffer.byteLength;

  // The file as a ReadableStream: 1 MiB reads go straight through the wasm heap to the GPU, so a
  // model of any size needs no more JS or wasm memory than that.
  const stream = Readable.toWeb(createReadStream(args.model, { highWaterMark: 1 << 20 }));
  const t0 = performance.now();
  let lastPhase = '';
  const engine = await Engine.load(stream, {
    contextSize: args.context,
    batchSize: args.batch,
    onProgress: (p) => {
      if (p.phase !== lastPhase) console.error(`[bench:dawn] ${p.phase} ${Math.round(p.loadedBytes / 1e6)} MB`);
      lastPhase = p.phase;
    },
  });
  const loadMs = performance.now() - t0;
  const info = engine.info();
  const loadHeap = heap();

  const prompt = promptOfLength(engine, args.promptTokens);
  const pre = [];
  const dec = [];
  const generated = [];
  let promptTokens = 0;
  let last = null;
  // One warm-up run (pipelines compile, buffers settle), then the timed ones: as `cera bench`.
  for (let run = 0; run <= args.runs; run++) {
    engine.reset();
    const s = engine.generate(prompt, { temperature: 0, maxTokens: args.genTokens });
    for await (const _ of s);
    const st = await s.stats;
    promptTokens = st.promptTokens;
    console.error(
      `[bench:dawn] ${run ? `run ${run}` : 'warm-up'}: prefill ${st.prefillTokS.toFixed(1)} tok/s, ` +
        `decode ${st.decodeTokS.toFixed(1)} tok/s (${st.generatedTokens} tokens, ${st.finishReason})`,
    );
    if (run === 0) continue;
    last = st;
    pre.push(st.prefillTokS);
    dec.push(st.decodeTokS);
    generated.push(st.generatedTokens);
  }
  if (generated.some((g) => g < args.genTokens)) {
    console.error('[bench:dawn] warning: the model ended a run early (an end-of-generation token): decode covers fewer tokens');
  }
  engine.dispose();

  const report = {
    adapter: info.adapter.name || dawnAdapter.description || `${dawnAdapter.vendor} ${dawnAdapter.architecture}`.trim(),
    backend: info.adapter.backend,
    model: info.model.name ?? '?',
    prompt_tokens: promptTokens,
    gen_tokens: args.genTokens,
    runs: args.runs,
    prefill_tok_s: median(pre),
    decode_tok_s: median(dec),
    prefill_tok_s_runs: pre,
    decode_tok_s_runs: dec,
    // Timed natively by dispatching the output head alone; the JS API has no such entry point.
    head_gemv_ms: null,
    head_share_of_decode: null,
    // The engine's own counts over the last timed run's decode steps, as `cera bench` counts them.
    dispatches_per_token: last.dispatchesPerToken,
    passes_per_token: last.passesPerToken,
    submits_per_token: last.submitsPerToken,
    runner: 'node-dawn',
    dawn_adapter: dawnAdapter,
    generated_tokens_runs: generated,
    model_bytes: modelBytes,
    load_ms: Math.round(loadMs),
    load_mb_s: Number((modelBytes / 1e6 / (loadMs / 1000)).toFixed(1)),
    // WebAssembly memory only grows, so its size now is the peak of the whole run.
    wasm_heap_bytes_after_load: loadHeap,
    peak_wasm_heap_bytes: heap(),
    node: process.version,
  };
  const text = JSON.stringify(report, null, 2);
  if (args.out) writeFileSync(args.out, `${text}\n`);
  console.log(text);
  return 0;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().then(
    (code) => process.exit(code),
    (e) => fail(1, `${e.code ? `${e.code}: ` : ''}${e.message ?? e}`),
  );
}
