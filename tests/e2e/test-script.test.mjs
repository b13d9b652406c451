// scripts/test's own rules, without running a phase: an unknown CERA_TEST_ONLY is refused before
// anything is set up, and the counters it sums (cargo's and node's TAP summaries) see ignored and
// skipped tests and runs of zero tests, which the script then fails; the newer lavapipe of the
// native phase is named only where one is unpacked, and fetching it never fails the set-up (no
// network here: a mirror at a closed port). Under a second.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { root } from '../../scripts/browser.mjs';

const bash = (script, env = {}) =>
  spawnSync('bash', ['-c', script], { cwd: root, encoding: 'utf8', env: { ...process.env, ...env }, timeout: 30_000 });

/// Run the counter `fn` of scripts/lib.sh on `log`; returns its three numbers.
function count(fn, log, ...args) {
  const dir = mkdtempSync(`${tmpdir()}/cera-count-`);
  try {
    writeFileSync(`${dir}/log`, log);
    const r = bash(`source scripts/lib.sh && ${fn} "${dir}/log" ${args.join(' ')}`);
    assert.equal(r.status, 0, r.stderr);
    return r.stdout.trim().split(' ').map(Number);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('an unknown CERA_TEST_ONLY fails at once and names the phases', () => {
  const r = spawnSync('bash', ['scripts/test'], { cwd: root, encoding: 'utf8', env: { ...process.env, CERA_TEST_ONLY: 'nativ' }, timeout: 30_000 });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /unknown CERA_TEST_ONLY=nativ \(one of: lint, native, chrome, package, e2e\)/);
  assert.doesNotMatch(r.stdout + r.stderr, /\[setup\]|SUMMARY/, 'nothing was set up or run');
});

test('cargo logs: passed, failed and ignored summed over every test binary, doc tests optional', () => {
  const log = [
    'running 3 tests',
    'test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s',
    'test result: FAILED. 5 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.2s',
    '   Doc-tests cera_web',
    'test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.3s',
  ].join('\n');
  assert.deepEqual(count('count_cargo', log), [12, 2, 1]);
  assert.deepEqual(count('count_cargo', log, 1), [8, 2, 1], 'SKIPDOC=1 stops at the doc tests');
  // A filter that matches nothing: cargo says ok with 0 tests, which the script fails.
  assert.deepEqual(count('count_cargo', 'test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out\n'), [0, 0, 0]);
  assert.deepEqual(count('count_cargo', 'error[E0425]: cannot find value `x`\n'), [0, 0, 0]);
});

test('node TAP logs: skipped and todo tests are counted (the script fails on them), cancelled as failed', () => {
  const tap = ['TAP version 13', 'ok 1 - a', 'ok 2 - b # SKIP needs the model', '1..2', '# tests 4', '# suites 0',
    '# pass 2', '# fail 0', '# cancelled 1', '# skipped 1', '# todo 1', '# duration_ms 10'].join('\n');
  assert.deepEqual(count('count_tap', tap), [2, 1, 2]);
  assert.deepEqual(count('count_tap', '# tests 0\n# pass 0\n# fail 0\n# cancelled 0\n# skipped 0\n# todo 0\n'), [0, 0, 0]);
  assert.deepEqual(count('count_tap', 'node: bad option\n'), [0, 0, 0]);
});

test('a phase fails when its command failed or it ran no tests; its figures count that as a failure', () => {
  const figures = (rc, p, f, g) => {
    const r = bash(`source scripts/lib.sh && phase_figures demo ${rc} ${p} ${f} ${g}`);
    return { ok: r.status === 0, figures: r.stdout.trim(), said: r.stderr.trim() };
  };
  assert.deepEqual(figures(0, 7, 0, 0), { ok: true, figures: '7 0 0', said: '' });
  assert.deepEqual(figures(1, 7, 2, 0), { ok: false, figures: '7 2 0', said: '' });
  assert.deepEqual(figures(101, 7, 0, 0), { ok: false, figures: '7 1 0', said: '' }, 'a build error or crash is a failure');
  assert.deepEqual(figures(0, 0, 0, 0), { ok: false, figures: '0 1 0', said: '[test] demo ran no tests' });
  assert.deepEqual(figures(0, 0, 0, 3), { ok: true, figures: '0 0 3', said: '' }, 'ignored tests fail the run at the end');
  const s = readFileSync(`${root}/scripts/test`, 'utf8');
  assert.match(s, /if \[ "\$\{TOTAL_G:-0\}" -ne 0 \]; then [^\n]*status=1; fi/, 'any ignored or skipped test fails the run');
  assert.equal((s.match(/phase_figures /g) || []).length, 1, 'one place turns a phase into figures: run_phase');
  assert.match(s, /run_phase native cargo_counts /, 'the native phase goes through run_phase');
  assert.match(s, /run_phase chrome cargo_counts /, 'the chrome phase goes through run_phase');
  assert.match(s, /run_phase e2e count_tap /, 'the e2e phase goes through run_phase');
});

test('phases side by side: their result files summed, a missing or failed phase fails the run', () => {
  const dir = mkdtempSync(`${tmpdir()}/cera-results-`);
  try {
    const sum = (...phases) => {
      const r = bash(`source scripts/lib.sh && sum_results "${dir}" ${phases.join(' ')}`);
      assert.equal(r.status, 0, r.stderr);
      return r.stdout.trim().split('\n');
    };
    writeFileSync(`${dir}/native.result`, '438 0 0 0\nnative: 438 passed, 0 failed, 0 ignored (961s)\n');
    writeFileSync(`${dir}/lint.result`, '0 0 0 0\nlint: clean (186s)\n');
    assert.deepEqual(sum('lint', 'native'), ['lint: clean (186s)', 'native: 438 passed, 0 failed, 0 ignored (961s)', 'TOTAL 438 0 0 0']);
    // A phase killed before it wrote its figures (a lane that crashed) is a failure, named.
    assert.deepEqual(sum('native', 'e2e'), ['native: 438 passed, 0 failed, 0 ignored (961s)', 'e2e: ended without its figures', 'TOTAL 438 1 0 1']);
    // A phase that failed (ok 1) fails the run even with its counts at zero failures; ignored tests are summed.
    writeFileSync(`${dir}/chrome.result`, '295 0 2 1\nchrome: 295 passed, 0 failed, 2 ignored (1339s)\n');
    assert.deepEqual(sum('native', 'chrome').pop(), 'TOTAL 733 0 2 1');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('lavapipe_vars names the unpacked newer lavapipe for the native tests, unless CERA_SYSTEM_VULKAN=1', () => {
  const dir = mkdtempSync(`${tmpdir()}/cera-lvp-`);
  try {
    const vars = (env) => {
      const r = bash('source scripts/lib.sh && lavapipe_vars', { XDG_CACHE_HOME: dir, CERA_SYSTEM_VULKAN: '', ...env });
      assert.equal(r.status, 0, r.stderr);
      return r.stdout.trim();
    };
    assert.equal(vars({}), '', 'no driver unpacked: nothing');
    mkdirSync(`${dir}/cera-web/lavapipe`, { recursive: true });
    const icd = `${dir}/cera-web/lavapipe/lvp.json`;
    writeFileSync(icd, '{}');
    assert.equal(vars({}), `VK_DRIVER_FILES=${icd}\nVK_ICD_FILENAMES=${icd}`);
    assert.equal(vars({ CERA_SYSTEM_VULKAN: '1' }), '');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('fetch-lavapipe never fails the set-up: no network (or another system) is a line on stderr, nothing on stdout', () => {
  const dir = mkdtempSync(`${tmpdir()}/cera-lvp-`);
  try {
    // A closed port as the mirror: on Debian 12 the index fetch fails; elsewhere the system is named.
    const r = spawnSync('python3', ['scripts/fetch-lavapipe'], {
      cwd: root, encoding: 'utf8', timeout: 90_000,
      env: { ...process.env, XDG_CACHE_HOME: dir, CERA_DEBIAN_MIRROR: 'http://127.0.0.1:9/debian' },
    });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /\[fetch-lavapipe\] (could not fetch mesa-vulkan-drivers from bookworm-backports|not Debian 12|[^:]+: only x86_64|no dpkg-deb).*the system's lavapipe is used/);
    // One already unpacked is kept, without the network.
    mkdirSync(`${dir}/cera-web/lavapipe`, { recursive: true });
    writeFileSync(`${dir}/cera-web/lavapipe/lvp.json`, '{}');
    const again = spawnSync('python3', ['scripts/fetch-lavapipe'], {
      cwd: root, encoding: 'utf8', timeout: 30_000,
      env: { ...process.env, XDG_CACHE_HOME: dir, CERA_DEBIAN_MIRROR: 'http://127.0.0.1:9/debian' },
    });
    assert.equal(again.status, 0, again.stderr);
    assert.equal(again.stdout.trim(), `${dir}/cera-web/lavapipe/lvp.json`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
