// node scripts/bench-table.mjs DIR [--short 256,128] [--long 4000,64]
//
// The side-by-side table of scripts/bench-nvidia, from the JSON each bench left in DIR:
//   native-short.json, native-long.json   `cera bench` (the native binary, wgpu on Vulkan)
//   dawn-short.json,   dawn-long.json     `npm run bench:dawn` (the npm package in node on Dawn)
//   llama-short.json,  llama-long.json    `llama-bench -o json` (llama.cpp on CUDA)
// "short" is a 256-token prompt then 128 generated; "long" a 4000-token prompt then 64 generated
// (llama-bench: pp512 and tg64 at depth 4000). A missing or unreadable file is "n/a".
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

/** The JSON in a bench's stdout: the whole text, or from the first line that opens one. */
export function readJson(path) {
  let text;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return null;
  }
  try {
    return JSON.parse(text);
  } catch {
    // Tolerate log lines before the JSON (a tool that prints to stdout before its report).
    const at = text.search(/^[[{]/m);
    if (at < 0) return null;
    try {
      return JSON.parse(text.slice(at));
    } catch {
      return null;
    }
  }
}

/** llama-bench's entries: the prompt test (n_gen 0) and the generation test (n_prompt 0). */
function llamaTests(entries) {
  if (!Array.isArray(entries)) return {};
  const pick = (f) => entries.find(f) ?? null;
  return {
    prefill: pick((e) => e.n_prompt > 0 && e.n_gen === 0),
    decode: pick((e) => e.n_gen > 0 && e.n_prompt === 0),
  };
}

function llamaLabel(e) {
  const t = e.n_gen === 0 ? `pp${e.n_prompt}` : `tg${e.n_gen}`;
  return e.n_depth ? `${t} @ d${e.n_depth}` : t;
}

export function fmtRate(v) {
  if (typeof v !== 'number' || !Number.isFinite(v)) return 'n/a';
  return v >= 100 ? Math.round(v).toLocaleString('en-US') : v.toFixed(1);
}

export function fmtRatio(v) {
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) return null;
  return v >= 1 ? `${v.toFixed(2)}x` : `${Number(v.toPrecision(2))}x`;
}

/**
 * The markdown table. `runs`: {native, dawn, llama} each {short, long} of parsed JSON or null;
 * `sizes`: {short: [prompt, gen], long: [prompt, gen]}.
 */
export function benchTable(runs, sizes = { short: [256, 128], long: [4000, 64] }) {
  const rows = [];
  for (const which of ['short', 'long']) {
    const [p, g] = sizes[which];
    const native = runs.native?.[which] ?? null;
    const dawn = runs.dawn?.[which] ?? null;
    const llama = llamaTests(runs.llama?.[which]);
    for (const kind of ['prefill', 'decode']) {
      const figure = kind === 'prefill' ? `prefill, ${p}-token prompt` : `decode, ${g} tokens after ${p}`;
      const key = kind === 'prefill' ? 'prefill_tok_s' : 'decode_tok_s';
      const l = llama[kind];
      const lv = l?.avg_ts;
      let lcell = 'n/a';
      if (l) {
        const sd = l.stddev_ts ? ` ± ${fmtRate(l.stddev_ts)}` : '';
        lcell = `${fmtRate(lv)}${sd} (${llamaLabel(l)})`;
      }
      const ratios = [];
      for (const [name, r] of [['native', native], ['Dawn', dawn]]) {
        const x = fmtRatio(r?.[key] / lv);
        if (x) ratios.push(`${name} ${x}`);
      }
      // What the browser's WebGPU costs over native wgpu on the same GPU.
      const overNative = fmtRatio(dawn?.[key] / native?.[key]);
      if (overNative) ratios.push(`Dawn/native ${overNative}`);
      rows.push([`${figure} (tok/s)`, fmtRate(native?.[key]), fmtRate(dawn?.[key]), lcell, ratios.join(', ') || 'n/a']);
    }
  }
  const head = ['figure', 'cera-web native', 'cera-web Dawn', 'llama.cpp CUDA', 'ratio'];
  const lines = [head, head.map(() => '---'), ...rows].map((r) => `| ${r.join(' | ')} |`);

  // What ran where: the table is only comparable when these name the same GPU and model.
  const notes = [];
  const n = runs.native?.short ?? runs.native?.long;
  const d = runs.dawn?.short ?? runs.dawn?.long;
  const l = [].concat(runs.llama?.short ?? runs.llama?.long ?? [])[0];
  if (n) notes.push(`native: ${n.adapter} (${n.backend}), model ${n.model}`);
  if (d) {
    const heap = (d.peak_wasm_heap_bytes / 2 ** 20).toFixed(1);
    notes.push(`Dawn: ${d.adapter} (${d.backend}), load ${(d.load_ms / 1000).toFixed(1)} s, peak wasm heap ${heap} MiB`);
  }
  if (l) notes.push(`llama.cpp: ${l.gpu_info} (${l.backends}), ${l.model_type}, flash_attn ${l.flash_attn}, build ${l.build_commit}`);
  return [...lines, '', ...notes.map((s) => `- ${s}`)].join('\n');
}

function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { short: { type: 'string', default: '256,128' }, long: { type: 'string', default: '4000,64' } },
  });
  const dir = positionals[0];
  if (!dir) {
    console.error('usage: node scripts/bench-table.mjs DIR [--short 256,128] [--long 4000,64]');
    process.exit(2);
  }
  const load = (tool) => ({ short: readJson(`${dir}/${tool}-short.json`), long: readJson(`${dir}/${tool}-long.json`) });
  const sizes = { short: values.short.split(',').map(Number), long: values.long.split(',').map(Number) };
  console.log(benchTable({ native: load('native'), dawn: load('dawn'), llama: load('llama') }, sizes));
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
