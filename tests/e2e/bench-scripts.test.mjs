// The benchmark scripts without a GPU: bench:dawn's arguments and its "no adapter" exit, the
// package loading a model in node on Dawn (SwiftShader), and the table of scripts/bench-nvidia
// from stand-in benches (fake `cera` and `llama-bench` that print the JSON the real ones print).
// The scripts' own lifecycle: every headless command prepares what it needs first, and the local
// server a script starts ends on every way the script can end (also when it is killed outright);
// a port already in use is an error, not a stranger's server. About 8 s in all, most of it the
// model load.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { root, startServer } from '../../scripts/browser.mjs';
import { prepareSteps } from '../../scripts/prepare.mjs';
import { parseBenchArgs } from '../../scripts/bench-dawn.mjs';
import { benchTable } from '../../scripts/bench-table.mjs';

const benchDawn = (args, env = {}) =>
  spawnSync(process.execPath, [`${root}/scripts/bench-dawn.mjs`, ...args], {
    cwd: root,
    encoding: 'utf8',
    // The package is built already when the e2e phase runs: no set-up step here.
    env: { ...process.env, CERA_NO_PREPARE: '1', ...env },
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

test('bench:dawn on Dawn (SwiftShader): the JSON on stdout and in --out, whatever else is printed', (t) => {
  const icd = '/usr/lib/chromium/vk_swiftshader_icd.json';
  const model = process.env.CERA_TEST_MODEL || `${root}/models/gemma-3-270m-q4_k_m.gguf`;
  for (const [path, why] of [[icd, "Chromium's SwiftShader"], [`${root}/pkg/cera_web_bg.wasm`, 'the package build'], [model, 'the test model']]) {
    if (!existsSync(path)) return t.skip(`needs ${why} (${path})`);
  }
  const dir = mkdtempSync(join(tmpdir(), 'bench-dawn-'));
  const outFile = join(dir, 'dawn.json');
  const t0 = Date.now();
  const r = spawnSync(process.execPath, [`${root}/scripts/bench-dawn.mjs`, '--model', model, '--prompt-tokens', '8',
    '--gen-tokens', '2', '--runs', '1', '--out', outFile], {
    cwd: root,
    encoding: 'utf8',
    env: { ...process.env, CERA_NO_PREPARE: '1', VK_DRIVER_FILES: icd, VK_ICD_FILENAMES: '' },
    timeout: 180_000,
  });
  assert.equal(r.status, 0, r.stderr);
  const saved = JSON.parse(readFileSync(outFile, 'utf8'));
  rmSync(dir, { recursive: true, force: true });
  console.log(`[bench-scripts] bench:dawn on SwiftShader: ${Date.now() - t0} ms, decode ${saved.decode_tok_s.toFixed(2)} tok/s`);
  assert.ok(r.stdout.trimEnd().endsWith(JSON.stringify(saved, null, 2)), 'stdout ends with the same JSON');
  assert.equal(saved.runner, 'node-dawn');
  assert.equal(saved.backend, 'BrowserWebGpu');
  assert.equal(saved.prompt_tokens, 8);
  assert.deepEqual(saved.generated_tokens_runs, [2]);
  assert.ok(saved.prefill_tok_s > 0 && saved.decode_tok_s > 0, 'both speeds measured');
  // The engine's counts, as `cera bench` reports them: one pass and one submission a token.
  assert.ok(saved.dispatches_per_token >= 1, `dispatches_per_token ${saved.dispatches_per_token}`);
  assert.equal(saved.passes_per_token, 1);
  assert.equal(saved.submits_per_token, 1);
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
    // node: bench-dawn.mjs's stand-in (its JSON to --out, as the real one writes it), refusing
    // to run without CERA_NO_PREPARE=1 as the real one fails its set-up on a GPU host without a
    // package mirror; every other script goes to the real node (the table).
    writeFileSync(
      `${dir}/node`,
      `#!/usr/bin/env bash
case "$1" in
*bench-dawn.mjs)
  [ "$CERA_NO_PREPARE" = 1 ] || { echo "[prepare] bash scripts/setup failed (exit 100)" >&2; exit 100; }
  while [ $# -gt 0 ]; do case "$1" in --prompt-tokens) p=$2; shift 2;; --gen-tokens) g=$2; shift 2;; --out) o=$2; shift 2;; *) shift;; esac; done
  printf '{"adapter": "GPU", "backend": "node-dawn", "model": "m", "prompt_tokens": %d, "gen_tokens": %d, "prefill_tok_s": %d, "decode_tok_s": 40.25}\\n' $p $g $((p * 5)) > "$o" ;;
*) exec ${JSON.stringify(process.execPath)} "$@" ;;
esac
`,
    );
    chmodSync(`${dir}/cera`, 0o755);
    chmodSync(`${dir}/llama-bench`, 0o755);
    chmodSync(`${dir}/node`, 0o755);
    // Dawn runs only where the package is built and npm's webgpu is installed (the e2e phase
    // runs after the package phase).
    const dawn = existsSync(`${root}/pkg/cera_web_bg.wasm`) && existsSync(`${root}/node_modules/webgpu`);
    const r = spawnSync('bash', [`${root}/scripts/bench-nvidia`, '--model', `${root}/package.json`, '--only', 'native,dawn,llama',
      '--llama-bench', `${dir}/llama-bench`, '--out', `${dir}/out`, '--runs', '1'], {
      cwd: root,
      encoding: 'utf8',
      env: { ...process.env, CERA_BIN: `${dir}/cera`, NODE: `${dir}/node` },
      timeout: 60_000,
    });
    assert.equal(r.status, 0, r.stderr);
    assert.ok(dawn, 'pkg/ and node_modules/webgpu: run npm run build and npm install first');
    assert.doesNotMatch(r.stderr, /\[prepare\]/);
    assert.match(r.stdout, /\| prefill, 256-token prompt \(tok\/s\) \| 2,560 \| 1,280 \| 40,000 \(pp256\) \| native 0\.064x, Dawn 0\.032x, Dawn\/native 0\.5x \|/);
    assert.match(r.stdout, /\| decode, 64 tokens after 4000 \(tok\/s\) \| 80\.5 \| 40\.3 \| 805 \(tg64 @ d4000\) \| native 0\.1x, Dawn 0\.05x, Dawn\/native 0\.5x \|/);
    assert.match(r.stderr, /llama long: .* -p 512 -n 64 -d 4000 /);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

const serverPort = Number(process.env.CERA_SCRIPTS_PORT || 18797);
const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};
async function gone(pid, ms = 5000) {
  for (let t = 0; t < ms && alive(pid); t += 50) await new Promise((r) => setTimeout(r, 50));
  return !alive(pid);
}

test('a script\'s local server ends on every way the script ends, even SIGKILL', async () => {
  const t0 = Date.now();
  const ends = {
    'an uncaught error': { code: "throw new Error('boom');", status: 1 },
    'process.exit(3)': { code: 'process.exit(3);', status: 3 },
    'a normal end (the script calls stop)': { code: 's.stop();', status: 0 },
    SIGINT: { signal: 'SIGINT', status: 130 },
    SIGTERM: { signal: 'SIGTERM', status: 143 },
    SIGKILL: { signal: 'SIGKILL', status: null },
  };
  for (const [what, { code, signal, status }] of Object.entries(ends)) {
    const script = `
      import { startServer } from '${root}/scripts/browser.mjs';
      const s = await startServer(${serverPort});
      if (!(await fetch(s.url + '/__bytes')).ok) process.exit(9);
      console.log(s.pid);
      ${code ?? 'setInterval(() => {}, 1000);'}`;
    const proc = spawn(process.execPath, ['--input-type=module', '-e', script], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    const pid = await new Promise((resolve, reject) => {
      proc.stdout.once('data', (d) => resolve(Number(String(d).trim())));
      proc.once('exit', (c) => reject(new Error(`${what}: the script ended (${c}) before its server started`)));
    });
    assert.ok(pid > 0, `${what}: the server answered the script`);
    if (signal) assert.ok(alive(pid), `${what}: the server runs until the signal`);
    const exited = new Promise((r) => proc.on('exit', (c, sig) => r(c ?? sig)));
    if (signal) proc.kill(signal);
    const got = await exited;
    assert.equal(got, status ?? 'SIGKILL', `${what}: the script's exit`);
    assert.ok(await gone(pid), `${what}: the server ${pid} is still running`);
    await assert.rejects(fetch(`http://127.0.0.1:${serverPort}/__bytes`), `${what}: the port still answers`);
  }
  console.log(`[bench-scripts] ${Object.keys(ends).length} ways to end, no server left: ${Date.now() - t0} ms`);
});

test('a port already in use is an error naming it, never a server of unknown origin', async () => {
  const first = await startServer(serverPort);
  try {
    await assert.rejects(startServer(serverPort), new RegExp(`could not start on port ${serverPort} \\(exit 1\\): .*the port is in use`));
  } finally {
    first.stop();
  }
  assert.ok(await gone(first.pid));
});

// A stand-in `bash` first in PATH records the set-up steps a command runs (and fails the one
// named by FAIL_STEP), so these runs neither install nor build anything.
function withStubBash(fn) {
  const dir = mkdtempSync(`${tmpdir()}/cera-prepare-`);
  try {
    writeFileSync(`${dir}/bash`, `#!/bin/sh\necho "$*" >> "${dir}/log"\n[ "$1" = "$FAIL_STEP" ] && exit 7\nexit 0\n`);
    chmodSync(`${dir}/bash`, 0o755);
    const run = (script, args, env = {}) => {
      const r = spawnSync(process.execPath, [`${root}/scripts/${script}`, ...args], {
        cwd: root,
        encoding: 'utf8',
        env: { ...process.env, CERA_NO_PREPARE: '', PATH: `${dir}:${process.env.PATH}`, CERA_PORT: String(serverPort), ...env },
        timeout: 60_000,
      });
      const steps = existsSync(`${dir}/log`) ? readFileSync(`${dir}/log`, 'utf8').trim().split('\n') : [];
      rmSync(`${dir}/log`, { force: true });
      return { ...r, steps };
    };
    return fn(run);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('every headless command sets up and builds what it needs first, as npm start does', async () => {
  const t0 = Date.now();
  assert.deepEqual(prepareSteps({ model: true }), [['bash', 'scripts/setup'], ['bash', 'scripts/build'], ['scripts/fetch-model']]);
  const pkg = JSON.parse(readFileSync(`${root}/package.json`, 'utf8'));
  assert.equal(pkg.scripts.serve, pkg.scripts.start, 'npm run serve prepares like npm start');
  withStubBash((run) => {
    // Bad arguments are refused before any set-up.
    let r = run('generate.mjs', ['--max-tokens', '4']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /usage: npm run generate -- --prompt/);
    assert.deepEqual(r.steps, []);
    // A failed step ends the command with its status, before any server or browser starts.
    for (const [script, args] of [['generate.mjs', ['--prompt', 'x', '--model', '/m.gguf']], ['bench-browser.mjs', ['--model', '/m.gguf']],
      ['bench-dawn.mjs', ['--model', `${root}/package.json`]]]) {
      r = run(script, args, { FAIL_STEP: 'scripts/build' });
      assert.equal(r.status, 7, `${script}: ${r.stderr}`);
      assert.deepEqual(r.steps, ['scripts/setup', 'scripts/build'], script);
      assert.match(r.stderr, /\[prepare\] bash scripts\/build failed \(exit 7\)/);
    }
    // Prepared, generate runs for real: a model URL that does not exist fails in the page with
    // NETWORK, and the run's server and browser are gone after it.
    r = run('generate.mjs', ['--prompt', 'x', '--model', '/models/no-such.gguf']);
    assert.deepEqual(r.steps, ['scripts/setup', 'scripts/build'], 'a URL model needs no fetch-model');
    assert.equal(r.status, 1, r.stderr);
    // (Without a package build, as in a tree where only this file's tests run, the page cannot
    // import it: that error instead.)
    const built = existsSync(`${root}/pkg/cera_web_bg.wasm`);
    assert.match(r.stderr, built ? /error NETWORK: / : /error TypeError: Failed to fetch dynamically imported module/);
  });
  await assert.rejects(fetch(`http://127.0.0.1:${serverPort}/__bytes`), 'no server left behind');
  console.log(`[bench-scripts] prepare steps and a failing generate run: ${Date.now() - t0} ms`);
});
