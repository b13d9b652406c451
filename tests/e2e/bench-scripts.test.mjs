// The benchmark scripts without a GPU: bench:dawn's arguments and its "no adapter" exit, the
// package loading a model in node on Dawn (SwiftShader), and the table of scripts/bench-nvidia
// from stand-in benches (fake `cera` and `llama-bench` that print the JSON the real ones print).
// About 5 s in all, most of it the model load.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { root } from '../../scripts/browser.mjs';
import { parseBenchArgs } from '../../scripts/bench-dawn.mjs';
import { benchTable } from '../../scripts/bench-table.mjs';

const benchDawn = (args, env = {}) =>
  spawnSync(process.execPath, [`${root}/scripts/bench-dawn.mjs`, ...args], {
    cwd: root,
    encoding: 'utf8',
    env: { ...process.env, ...env },
    timeout: 60_000,
  });

test('bench:dawn arguments: the defaults follow cera bench', () => {
  const a = parseBenchArgs(['--model', 'm.gguf']);
  assert.deepEqual(
    { p: a.promptTokens, g: a.genTokens, runs: a.runs, ctx: a.context, batch: a.batch },
    { p: 256, g: 128, runs: 3, ctx: 392, batch: 256 },
  );
  const b = parseBenchArgs(['--model', 'm.gguf', '--prompt-tokens', '4000', '--gen-tokens', '64', '--dawn', 'backend=vulkan', '--dawn', 'adapter=X']);
  assert.equal(b.batch, 512, 'the prefill batch is capped at 512, as cera bench');
  assert.equal(b.context, 4072);
  assert.deepEqual(b.dawn, ['backend=vulkan', 'adapter=X']);
  assert.equal(parseBenchArgs(['--help']).help, true);
  for (const bad of [[], ['--model', 'm', '--runs', '0'], ['--model', 'm', '--gen-tokens', '2x'], ['--model', 'm', '--bogus']]) {
    assert.throws(() => parseBenchArgs(bad), (e) => e.constructor.name === 'UsageError', JSON.stringify(bad));
  }
});

test('bench:dawn exits 2 with the problem named: bad arguments, no model file', () => {
  const r = benchDawn(['--model', 'package.json', '--prompt-tokens', 'many']);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--prompt-tokens must be a positive integer/);
  const m = benchDawn(['--model', `${root}/no-such-model.gguf`]);
  assert.equal(m.status, 2);
  assert.match(m.stderr, /no model file at .*no-such-model\.gguf/);
});

test('bench:dawn exits 3 when Dawn finds no adapter (here: lavapipe, which Dawn rejects)', () => {
  // lavapipe when it is installed (Dawn's own reason is then printed too), else no driver at all.
  const lvp = '/usr/share/vulkan/icd.d/lvp_icd.x86_64.json';
  const icd = existsSync(lvp) ? lvp : '/nonexistent/icd.json';
  const r = benchDawn(['--model', 'package.json'], { VK_DRIVER_FILES: icd, VK_ICD_FILENAMES: '' });
  assert.equal(r.status, 3, r.stderr);
  assert.match(r.stderr, /Dawn found no WebGPU adapter/);
  assert.equal(r.stdout, '', 'no report on stdout');
});

// The package in node on Dawn, set up as bench:dawn does it (and as the README shows), loading the
// real model as a stream from disk. SwiftShader is Dawn's adapter here (it rejects lavapipe); a
// token costs ~20 s there, so this loads and tokenizes only (~3 s).
test('node + Dawn (SwiftShader): the package loads the model as a ReadableStream', (t) => {
  const icd = '/usr/lib/chromium/vk_swiftshader_icd.json';
  const model = process.env.CERA_TEST_MODEL || `${root}/models/gemma-3-270m-q4_k_m.gguf`;
  for (const [path, why] of [[icd, "Chromium's SwiftShader"], [`${root}/pkg/cera_web_bg.wasm`, 'the package build'], [model, 'the test model']]) {
    if (!existsSync(path)) return t.skip(`needs ${why} (${path})`);
  }
  const script = `
    import { createReadStream } from 'node:fs';
    import { readFile } from 'node:fs/promises';
    import { Readable } from 'node:stream';
    import { setupDawn } from '${root}/scripts/bench-dawn.mjs';
    import { init, Engine } from '${root}/js/index.js';
    await setupDawn();
    const wasm = await init(await readFile('${root}/pkg/cera_web_bg.wasm'));
    const engine = await Engine.load(Readable.toWeb(createReadStream(process.argv[1], { highWaterMark: 1 << 20 })));
    const info = engine.info();
    const ids = engine.tokenize('The capital of France is');
    engine.dispose();
    console.log(JSON.stringify({ ids, origin: info.load.origin, bytes: info.load.bytes, backend: info.adapter.backend, heap: wasm.memory.buffer.byteLength }));
    process.exit(0);`;
  const t0 = Date.now();
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script, model], {
    cwd: root,
    encoding: 'utf8',
    env: { ...process.env, VK_DRIVER_FILES: icd, VK_ICD_FILENAMES: '' },
    timeout: 120_000,
  });
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout.trim().split('\n').pop());
  console.log(`[bench-scripts] node + Dawn load: ${Date.now() - t0} ms, wasm heap ${(out.heap / 2 ** 20).toFixed(1)} MiB`);
  assert.deepEqual(out.ids, [2, 818, 5279, 529, 7001, 563], "llama.cpp's tokens for the prompt");
  assert.equal(out.origin, 'stream');
  assert.equal(out.bytes, 253113024);
  assert.equal(out.backend, 'BrowserWebGpu');
  assert.ok(out.heap < 64 * 2 ** 20, `the 253 MB model streams through the wasm heap (${out.heap} bytes)`);
});

const native = (p, g, prefill, decode) => ({
  adapter: 'GPU', backend: 'Vulkan', model: 'm', prompt_tokens: p, gen_tokens: g, runs: 3,
  prefill_tok_s: prefill, decode_tok_s: decode,
});
const llama = (p, n, d, pp, tg) => [
  { gpu_info: 'GPU', backends: 'CUDA', model_type: 'm', flash_attn: 1, build_commit: 'c', n_prompt: p, n_gen: 0, n_depth: d, avg_ts: pp, stddev_ts: 10 },
  { gpu_info: 'GPU', backends: 'CUDA', model_type: 'm', flash_attn: 1, build_commit: 'c', n_prompt: 0, n_gen: n, n_depth: d, avg_ts: tg, stddev_ts: 0 },
];

test('bench table: figures, ratios, and n/a for what did not run', () => {
  const t = benchTable({
    native: { short: native(256, 128, 6197, 87), long: null },
    dawn: { short: { ...native(256, 128, 3879, 62.1), load_ms: 900, peak_wasm_heap_bytes: 29 * 2 ** 20 }, long: null },
    llama: { short: llama(256, 128, 0, 38460, 990.7), long: llama(512, 64, 4000, 43176, 977) },
  });
  const rows = t.split('\n');
  assert.equal(rows[0], '| figure | cera-web native | cera-web Dawn | llama.cpp CUDA | ratio |');
  assert.equal(
    rows[2],
    '| prefill, 256-token prompt (tok/s) | 6,197 | 3,879 | 38,460 ± 10.0 (pp256) | native 0.16x, Dawn 0.1x, Dawn/native 0.63x |',
  );
  assert.equal(rows[3], '| decode, 128 tokens after 256 (tok/s) | 87.0 | 62.1 | 991 (tg128) | native 0.088x, Dawn 0.063x, Dawn/native 0.71x |');
  assert.equal(rows[4], '| prefill, 4000-token prompt (tok/s) | n/a | n/a | 43,176 ± 10.0 (pp512 @ d4000) | n/a |');
  assert.match(t, /Dawn: GPU \(Vulkan\), load 0\.9 s, peak wasm heap 29\.0 MiB/);
  const empty = benchTable({});
  assert.equal(empty.split('\n').filter((r) => r.includes('n/a | n/a | n/a | n/a')).length, 4);
});

test('bench-nvidia: runs each part it finds and tabulates their JSON (stand-in benches)', () => {
  const dir = mkdtempSync(`${tmpdir()}/cera-bench-nvidia-`);
  try {
    // Stand-ins that print what `cera bench` and `llama-bench -o json` print, from their arguments.
    writeFileSync(
      `${dir}/cera`,
      `#!/usr/bin/env bash
while [ $# -gt 0 ]; do case "$1" in --prompt-tokens) p=$2; shift 2;; --gen-tokens) g=$2; shift 2;; *) shift;; esac; done
echo "log line on stderr" >&2
printf '{"adapter": "GPU", "backend": "Vulkan", "model": "m", "prompt_tokens": %d, "gen_tokens": %d, "prefill_tok_s": %d, "decode_tok_s": 80.5}\\n' $p $g $((p * 10))
`,
    );
    writeFileSync(
      `${dir}/llama-bench`,
      `#!/usr/bin/env bash
d=0; while [ $# -gt 0 ]; do case "$1" in -p) p=$2; shift 2;; -n) n=$2; shift 2;; -d) d=$2; shift 2;; *) shift;; esac; done
printf '[{"n_prompt": %d, "n_gen": 0, "n_depth": %d, "avg_ts": 40000}, {"n_prompt": 0, "n_gen": %d, "n_depth": %d, "avg_ts": 805}]\\n' $p $d $n $d
`,
    );
    chmodSync(`${dir}/cera`, 0o755);
    chmodSync(`${dir}/llama-bench`, 0o755);
    const r = spawnSync('bash', [`${root}/scripts/bench-nvidia`, '--model', `${root}/package.json`, '--only', 'native,llama',
      '--llama-bench', `${dir}/llama-bench`, '--out', `${dir}/out`, '--runs', '1'], {
      cwd: root,
      encoding: 'utf8',
      env: { ...process.env, CERA_BIN: `${dir}/cera` },
      timeout: 60_000,
    });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /\| prefill, 256-token prompt \(tok\/s\) \| 2,560 \| n\/a \| 40,000 \(pp256\) \| native 0\.064x \|/);
    assert.match(r.stdout, /\| decode, 64 tokens after 4000 \(tok\/s\) \| 80\.5 \| n\/a \| 805 \(tg64 @ d4000\) \| native 0\.1x \|/);
    assert.match(r.stderr, /llama long: .* -p 512 -n 64 -d 4000 /);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
