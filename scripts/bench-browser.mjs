// npm run bench:browser -- [--prompt-tokens 32] [--gen-tokens 8] [--model URL] [--worker]
// Prefill and decode timing of the real model inside headless Chromium (WebGPU; SwiftShader on a
// machine without a GPU). Prints one JSON object: the "cera bench in headless Chrome" figure.
// Sets up and builds what it needs first (scripts/prepare.mjs).
import { parseArgs } from 'node:util';
import { launchChromium, startServer } from './browser.mjs';
import { prepare } from './prepare.mjs';

const DEFAULT_MODEL = '/models/gemma-3-270m-q4_k_m.gguf';

const { values: a } = parseArgs({
  options: {
    model: { type: 'string', default: DEFAULT_MODEL },
    'prompt-tokens': { type: 'string', default: '32' },
    'gen-tokens': { type: 'string', default: '8' },
    worker: { type: 'boolean', default: false },
    port: { type: 'string', default: process.env.CERA_PORT || '18796' },
  },
});
prepare({ model: a.model === DEFAULT_MODEL });
const server = await startServer(Number(a.port));
const browser = await launchChromium();
let code = 0;
try {
  const page = await browser.newPage();
  await page.goto(`${server.url}/headless.html`);
  const out = await page.evaluate(
    async ({ model, nPrompt, nGen, worker }) => {
      const m = await import('/js/index.js');
      const t0 = performance.now();
      const engine = worker ? await m.createWorkerEngine(model, { contextSize: 512 }) : await m.Engine.load(model, { contextSize: 512 });
      const loadMs = performance.now() - t0;
      // A prompt of exactly nPrompt tokens (BOS + repeated words), so the figure is comparable.
      const words = 'the quick brown fox jumps over the lazy dog and runs far away into the green forest near a river '.repeat(8);
      let prompt = '';
      for (const w of words.split(' ')) {
        const next = prompt ? `${prompt} ${w}` : w;
        if ((await engine.tokenize(next)).length > nPrompt) break;
        prompt = next;
      }
      const s = engine.generate(prompt, { temperature: 0, maxTokens: nGen });
      for await (const _ of s);
      const stats = await s.stats;
      const info = await engine.info();
      await engine.dispose();
      return { loadMs, stats, info };
    },
    { model: a.model, nPrompt: Number(a['prompt-tokens']), nGen: Number(a['gen-tokens']), worker: a.worker },
  );
  const { stats, info } = out;
  console.log(
    JSON.stringify(
      {
        runner: 'headless-chromium',
        adapter: info.adapter,
        model: info.model.name,
        worker: a.worker,
        load_ms: Math.round(out.loadMs),
        load_origin: info.load.origin,
        peak_wasm_heap_bytes: info.load.peakWasmHeapBytes,
        prompt_tokens: stats.promptTokens,
        generated_tokens: stats.generatedTokens,
        first_token_ms: Math.round(stats.firstTokenMs),
        prefill_tok_s: Number(stats.prefillTokS.toFixed(3)),
        decode_tok_s: Number(stats.decodeTokS.toFixed(3)),
      },
      null,
      1,
    ),
  );
} catch (e) {
  console.error(e);
  code = 1;
} finally {
  await browser.close();
  server.stop();
}
process.exit(code);
