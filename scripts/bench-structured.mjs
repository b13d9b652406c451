// npm run bench:structured -- [--runs 5] [--gen-tokens 24] [--native target/release/cera] [--no-browser]
// Constrained decoding's cost on the real model: the CPU time of llguidance's token mask per token
// (over Gemma 3's 262,144-token vocabulary) and the decode tok/s of the same greedy chat answer
// with and without a JSON schema, natively (the `cera` binary, when --native names one) and in
// headless Chromium. Each figure is the median of --runs runs; one JSON object is printed.
// For the browser it sets up and builds what it needs first (scripts/prepare.mjs).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launchChromium, root, startServer } from './browser.mjs';
import { prepare } from './prepare.mjs';

const { values: a } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/gemma-3-270m-q4_k_m.gguf' },
    runs: { type: 'string', default: '5' },
    'gen-tokens': { type: 'string', default: '24' },
    native: { type: 'string' },
    'no-browser': { type: 'boolean', default: false },
    port: { type: 'string', default: process.env.CERA_PORT || '18797' },
  },
});
if (!a['no-browser']) prepare({ model: a.model === 'models/gemma-3-270m-q4_k_m.gguf' });
const runs = Number(a.runs);
const nGen = Number(a['gen-tokens']);
// Nested object, enum, array, required fields; compact so the answer is short.
const schema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    role: { enum: ['admin', 'user', 'guest'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 3 },
    address: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, zip: { type: 'integer' } }, required: ['city', 'zip'] },
  },
  required: ['name', 'role', 'tags', 'address'],
  'x-guidance': { whitespace_flexible: false },
};
const prompt = 'Describe a user of a web shop as JSON with name, role, tags and address.';
const median = (xs) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length ? (s[(s.length - 1) >> 1] + s[s.length >> 1]) / 2 : null;
};
const summary = (list) => ({
  decode_tok_s: Number(median(list.map((s) => s.decode)).toFixed(3)),
  mask_ms_per_token: Number(median(list.map((s) => s.mask)).toFixed(3)),
  generated_tokens: median(list.map((s) => s.tokens)),
  runs: list.length,
});
const out = { model: a.model, runs, gen_tokens: nGen, prompt };

if (a.native) {
  const dir = mkdtempSync(join(tmpdir(), 'cera-bench-'));
  const file = join(dir, 'schema.json');
  writeFileSync(file, JSON.stringify(schema));
  const one = (extra) => {
    const args = ['generate', '--model', a.model, '--prompt', prompt, '--chat', '--temperature', '0', '--max-tokens', String(nGen), '--ctx', '256', '--json', ...extra];
    const r = spawnSync(a.native, args, { cwd: root, encoding: 'utf8', maxBuffer: 1 << 26 });
    if (r.status !== 0) throw new Error(`${a.native} ${args.join(' ')}: ${r.stderr}`);
    const s = JSON.parse(r.stdout.trim().split('\n').at(-1));
    return { decode: s.decode_tok_s, mask: s.mask_ms_per_token, tokens: s.generated_tokens };
  };
  const free = [];
  const constrained = [];
  for (let i = 0; i < runs; i++) {
    free.push(one([]));
    constrained.push(one(['--json-schema', file]));
  }
  out.native = { free: summary(free), json_schema: summary(constrained) };
}

if (!a['no-browser']) {
  const server = await startServer(Number(a.port));
  const browser = await launchChromium();
  try {
    const page = await browser.newPage();
    await page.goto(`${server.url}/headless.html`);
    out.browser = await page.evaluate(
      async ({ model, schema, prompt, nGen, runs }) => {
        const m = await import('/js/index.js');
        const engine = await m.Engine.load(model, { contextSize: 256 });
        const one = async (extra) => {
          engine.reset();
          const s = engine.chat([{ role: 'user', content: prompt }], { temperature: 0, maxTokens: nGen, ...extra });
          await s.text();
          const st = await s.stats;
          return { decode: st.decodeTokS, mask: st.maskMsPerToken, tokens: st.generatedTokens };
        };
        const free = [];
        const constrained = [];
        for (let i = 0; i < runs; i++) {
          free.push(await one({}));
          constrained.push(await one({ responseFormat: { type: 'json_schema', schema } }));
        }
        const info = await engine.info();
        await engine.dispose();
        return { adapter: info.adapter, free, constrained };
      },
      { model: `/${a.model}`, schema, prompt, nGen, runs },
    );
    out.browser = { adapter: out.browser.adapter, free: summary(out.browser.free), json_schema: summary(out.browser.constrained) };
  } finally {
    await browser.close();
    server.stop();
  }
}
console.log(JSON.stringify(out, null, 1));
process.exit(0);
