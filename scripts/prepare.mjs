// What a headless command needs before it runs, as `npm start` does it: scripts/setup (installs
// only what is missing: npm dependencies, wasm tools, Chromium), scripts/build (the release
// package in pkg/; cargo makes it a no-op when nothing changed) and, when the command uses the
// served test model, scripts/fetch-model. Only node built-ins here, so it runs on a fresh clone
// before `npm install`. CERA_NO_PREPARE=1 skips it (a caller that has done it already).
import { spawnSync } from 'node:child_process';

const root = new URL('..', import.meta.url).pathname.replace(/\/$/, '');

/** The steps `prepare` runs, in order, for a command that does (or does not) need the model. */
export function prepareSteps({ model }) {
  return [['bash', 'scripts/setup'], ['bash', 'scripts/build'], ...(model ? [['scripts/fetch-model']] : [])];
}

/** Run the steps (their output goes to stderr); exit with the failing step's status. */
export function prepare({ model }) {
  if (process.env.CERA_NO_PREPARE === '1') return;
  for (const [cmd, ...args] of prepareSteps({ model })) {
    const r = spawnSync(cmd, args, { cwd: root, stdio: ['ignore', 2, 2] });
    if (r.status !== 0) {
      console.error(`[prepare] ${[cmd, ...args].join(' ')} failed (${r.error?.message ?? `exit ${r.status}`})`);
      process.exit(r.status || 1);
    }
  }
}
