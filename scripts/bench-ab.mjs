#!/usr/bin/env node
// One bench knob measured against the build's default on one machine in one sitting: `cera
// bench` run alternately without (A) and with (B) the knob's environment variables (the knobs:
// docs/benchmarking.md, "Bench knobs"), so that drift of the machine hits both sides alike.
//
//   npm run bench:ab -- [--pairs N] [--bin PATH] VAR=VALUE [VAR=VALUE ...] -- CERA_BENCH_ARGS
//
// e.g. npm run bench:ab -- --pairs 3 CERA_SPLIT_X_MAX=0 -- --model twin.gguf \
//        --prompt-tokens 256 --gen-tokens 128 --runs 2
//
// Prints each run's prefill and decode tok/s and dispatches a token, then each side's median
// and B / A, and writes the same as JSON to stdout's last line. --bin defaults to
// target/release/cera (build it first); the GPU environment is the caller's (scripts/lib.sh
// gpu_env on a machine without one).
import { spawnSync } from "node:child_process";

function usage(msg) {
  if (msg) console.error(`bench-ab: ${msg}`);
  console.error(
    "usage: bench-ab [--pairs N] [--bin PATH] VAR=VALUE [VAR=VALUE ...] -- CERA_BENCH_ARGS",
  );
  process.exit(2);
}

const argv = process.argv.slice(2);
let pairs = 3;
let bin = "target/release/cera";
const knobs = {};
let i = 0;
for (; i < argv.length && argv[i] !== "--"; i++) {
  const a = argv[i];
  if (a === "--pairs") {
    pairs = Number(argv[++i]);
    if (!Number.isInteger(pairs) || pairs < 1) usage("--pairs must be a positive integer");
  } else if (a === "--bin") {
    bin = argv[++i];
    if (!bin) usage("--bin needs a path");
  } else if (/^[A-Z][A-Z0-9_]*=/.test(a)) {
    const eq = a.indexOf("=");
    knobs[a.slice(0, eq)] = a.slice(eq + 1);
  } else {
    usage(`unknown argument ${a}`);
  }
}
if (i >= argv.length) usage("no -- before the cera bench arguments");
const benchArgs = argv.slice(i + 1);
if (Object.keys(knobs).length === 0) usage("no VAR=VALUE to compare");
if (!benchArgs.includes("--model")) usage("the cera bench arguments need --model PATH");

// A without the knobs (removed from the environment if the caller set them), B with them.
const baseEnv = { ...process.env };
for (const k of Object.keys(knobs)) delete baseEnv[k];
const sides = { A: baseEnv, B: { ...baseEnv, ...knobs } };

function run(side) {
  const r = spawnSync(bin, ["bench", ...benchArgs], {
    env: sides[side],
    encoding: "utf8",
    maxBuffer: 64 << 20,
  });
  if (r.error) usage(`cannot run ${bin}: ${r.error.message}`);
  if (r.status !== 0) {
    console.error(r.stderr.trim().split("\n").slice(-5).join("\n"));
    console.error(`bench-ab: ${bin} bench exited with ${r.status} (side ${side})`);
    process.exit(1);
  }
  const j = JSON.parse(r.stdout);
  return {
    side,
    prefill_tok_s: j.prefill_tok_s,
    decode_tok_s: j.decode_tok_s,
    dispatches_per_token: j.dispatches_per_token,
  };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const fmt = (v) => (v >= 100 ? v.toFixed(1) : v.toPrecision(4));

const knobText = Object.entries(knobs)
  .map(([k, v]) => `${k}=${v}`)
  .join(" ");
console.log(`A: default   B: ${knobText}   (${pairs} pairs, alternating)`);
console.log("side  prefill tok/s  decode tok/s  dispatches/token");
const runs = [];
for (let p = 0; p < pairs; p++) {
  for (const side of ["A", "B"]) {
    const r = run(side);
    runs.push(r);
    console.log(
      `${side}     ${fmt(r.prefill_tok_s).padStart(13)}  ${fmt(r.decode_tok_s).padStart(12)}  ${String(r.dispatches_per_token).padStart(16)}`,
    );
  }
}
const summary = {};
for (const side of ["A", "B"]) {
  const mine = runs.filter((r) => r.side === side);
  summary[side] = {
    prefill_tok_s: median(mine.map((r) => r.prefill_tok_s)),
    decode_tok_s: median(mine.map((r) => r.decode_tok_s)),
    dispatches_per_token: median(mine.map((r) => r.dispatches_per_token)),
  };
}
const ratio = (k) => summary.B[k] / summary.A[k];
console.log(
  `median A: prefill ${fmt(summary.A.prefill_tok_s)}, decode ${fmt(summary.A.decode_tok_s)}; ` +
    `B: prefill ${fmt(summary.B.prefill_tok_s)}, decode ${fmt(summary.B.decode_tok_s)}; ` +
    `B / A: prefill ${ratio("prefill_tok_s").toFixed(3)}, decode ${ratio("decode_tok_s").toFixed(3)}`,
);
console.log(
  JSON.stringify({
    knobs,
    bench_args: benchArgs,
    runs,
    median: summary,
    ratio_b_over_a: { prefill: ratio("prefill_tok_s"), decode: ratio("decode_tok_s") },
  }),
);
