// npm run generate -- --prompt "..." [--model URL-or-path] [--max-tokens N] [--temperature T]
//   [--top-k K] [--top-p P] [--context N] [--seed S] [--chat] [--worker] [--port P]
// Runs the engine inside headless Chromium (real WebGPU) against the local server and streams
// the tokens to the terminal; the stats go to stderr at the end. It first sets up and builds
// what it needs (scripts/prepare.mjs), and its server and browser end with it on any exit.
import { parseArgs } from 'node:util';
import { launchChromium, startServer } from './browser.mjs';
import { prepare } from './prepare.mjs';

const DEFAULT_MODEL = '/models/gemma-3-270m-q4_k_m.gguf';

const { values: a } = parseArgs({
  options: {
    prompt: { type: 'string', short: 'p' },
    model: { type: 'string', default: DEFAULT_MODEL },
    'max-tokens': { type: 'string', short: 'n', default: '32' },
    temperature: { type: 'string', default: '0' },
    'top-k': { type: 'string' },
    'top-p': { type: 'string' },
    seed: { type: 'string' },
    context: { type: 'string', default: '512' },
    chat: { type: 'boolean', default: false },
    worker: { type: 'boolean', default: false },
    port: { type: 'string', default: process.env.CERA_PORT || '18795' },
  },
});
if (a.prompt === undefined) {
  console.error('usage: npm run generate -- --prompt "The capital of France is" [--max-tokens 32] [--chat] [--worker]');
  process.exit(2);
}
prepare({ model: a.model === DEFAULT_MODEL });
const num = (v) => (v === undefined ? undefined : Number(v));
const server = await startServer(Number(a.port));
const browser = await launchChromium();
let code = 0;
try {
  const page = await browser.newPage();
  page.on('pageerror', (e) => console.error('[page error]', e.message));
  await page.exposeFunction('__emit', (t) => process.stdout.write(t));
  await page.exposeFunction('__progress', (s) => process.stderr.write(`\r${s}`));
  await page.goto(`${server.url}/headless.html`);
  const t0 = Date.now();
  const out = await page.evaluate(
    async ({ model, prompt, chat, worker, opts, contextSize }) => {
      const t0 = performance.now();
      const onProgress = (p) =>
        window.__progress(`[load] ${p.phase} ${(p.loadedBytes / 1e6).toFixed(0)}/${((p.totalBytes ?? 0) / 1e6).toFixed(0)} MB   `);
      try {
        const m = await import('/js/index.js');
        const load = worker ? m.createWorkerEngine : (s, o) => m.Engine.load(s, o);
        const engine = await load(model, { contextSize, onProgress });
        const loadMs = performance.now() - t0;
        window.__progress('\n');
        const stream = chat ? engine.chat([{ role: 'user', content: prompt }], opts) : engine.generate(prompt, opts);
        if (!chat) window.__emit(prompt);
        for await (const t of stream) window.__emit(t.text);
        const stats = await stream.stats;
        const info = await engine.info();
        return { ok: true, loadMs, stats, adapter: info.adapter, peakWasmHeapBytes: info.load.peakWasmHeapBytes };
      } catch (e) {
        return { ok: false, code: e.code ?? e.name, message: e.message };
      }
    },
    {
      model: a.model,
      prompt: a.prompt,
      chat: a.chat,
      worker: a.worker,
      contextSize: Number(a.context),
      opts: {
        maxTokens: Number(a['max-tokens']),
        temperature: Number(a.temperature),
        topK: num(a['top-k']),
        topP: num(a['top-p']),
        seed: num(a.seed),
      },
    },
  );
  process.stdout.write('\n');
  if (!out.ok) {
    console.error(`error ${out.code}: ${out.message}`);
    code = 1;
  } else {
    console.error(JSON.stringify({ loadMs: Math.round(out.loadMs), ...out.stats, adapter: out.adapter, peakWasmHeapBytes: out.peakWasmHeapBytes, wallMs: Date.now() - t0 }));
  }
} finally {
  await browser.close();
  server.stop();
}
process.exit(code);
