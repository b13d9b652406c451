//! `cera bench-gemm`: prefill matrix-product throughput (GFLOP/s) of the tiled GEMM
//! ([`cera_web::ops::gemm`]) beside matmul's tokens-in-registers kernel, one JSON line per
//! (shape, kernel).
//!
//! `cera bench-gemm [--type q4_K] [--tokens 512] [--shapes llama|gemma | --rows R --cols C]
//! [--tiles "128x64x16:8x4;64x64x32:4x4" | --sweep] [--no-registers] [--int8] [--iters N]`
//!
//! Without `--tiles` or `--sweep`, each shape runs with the tile `GemmConfig::for_shape` picks
//! (`gemm_q8::for_shape` for the 8-bit GEMM). `--int8` also runs each tile on the 8-bit GEMM
//! (`ops::gemm_q8`) where the type has it; there a tile's BK is its step's depth in values
//! (16 or 32: one block of 32; 64: two; 128: four).

use cera_web::gguf::GgmlType;
use cera_web::gpu::GpuContext;
use cera_web::ops::gemm::{self, GemmConfig, Kernel};
use cera_web::ops::gemm_q8;
use cera_web::ops::matmul::{self, MatmulConfig};
use cera_web::{Error, Result};

pub const USAGE: &str =
    "cera bench-gemm [--type q4_K] [--tokens 512] [--shapes llama|gemma | --rows R --cols C] \
                         [--tiles \"BMxBNxBK:TMxTN;...\" | --sweep] [--no-registers] [--int8] [--iters N]";

/// `(name, rows, cols)` of the projections of Llama 3 8B (attention q/k/v/o, FFN gate/up/down;
/// q+k+v and gate+up as the model fuses them at load).
const LLAMA3_8B: &[(&str, u64, u64)] = &[
    ("attn_qkv", 6144, 4096),
    ("attn_q", 4096, 4096),
    ("attn_k", 1024, 4096),
    ("ffn_gate_up", 28672, 4096),
    ("ffn_up", 14336, 4096),
    ("ffn_down", 4096, 14336),
];
/// And of Gemma 3 270M.
const GEMMA3_270M: &[(&str, u64, u64)] = &[
    ("attn_q", 1024, 640),
    ("attn_k", 256, 640),
    ("attn_output", 640, 1024),
    ("ffn_up", 2048, 640),
    ("ffn_down", 640, 2048),
];

pub fn run(ctx: &GpuContext, args: &[String]) -> Result<()> {
    let mut ty = GgmlType::Q4K;
    let mut n_tokens = 512u32;
    let mut shapes: Vec<(String, u64, u64)> = LLAMA3_8B
        .iter()
        .map(|&(n, r, c)| (n.to_string(), r, c))
        .collect();
    let (mut rows, mut cols) = (None, None);
    // None: the tile GemmConfig::for_shape picks for each shape.
    let mut tiles: Option<Vec<GemmConfig>> = None;
    let mut registers = true;
    let mut int8 = false;
    let mut iters = 0u32;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| Error::invalid(format!("{a} needs a value; usage: {USAGE}")))
        };
        let num = |v: String| {
            v.parse::<u64>()
                .map_err(|_| Error::invalid(format!("{a}: {v:?} is not a number")))
        };
        match a.as_str() {
            "--type" => {
                let v = value()?;
                ty = matmul::TYPES
                    .iter()
                    .map(|(t, _)| *t)
                    .find(|t| t.name().eq_ignore_ascii_case(&v))
                    .ok_or_else(|| Error::invalid(format!("unknown or unsupported type {v}")))?;
            }
            "--tokens" => n_tokens = num(value()?)? as u32,
            "--rows" => rows = Some(num(value()?)?),
            "--cols" => cols = Some(num(value()?)?),
            "--iters" => iters = num(value()?)? as u32,
            "--shapes" => {
                let table = match value()?.as_str() {
                    "llama" => LLAMA3_8B,
                    "gemma" => GEMMA3_270M,
                    other => {
                        return Err(Error::invalid(format!(
                            "--shapes {other}: want llama or gemma"
                        )))
                    }
                };
                shapes = table
                    .iter()
                    .map(|&(n, r, c)| (n.to_string(), r, c))
                    .collect();
            }
            "--tiles" => {
                tiles = Some(
                    value()?
                        .split(';')
                        .filter(|t| !t.trim().is_empty())
                        .map(str::parse)
                        .collect::<Result<_>>()?,
                );
            }
            "--sweep" => {
                tiles = Some(
                    [
                        GemmConfig::TILE_128X128,
                        GemmConfig::TILE_128X64,
                        GemmConfig::TILE_64X64,
                        GemmConfig::TILE_64X32,
                        GemmConfig::TILE_64X64_BK16,
                        GemmConfig::CPU,
                        GemmConfig::new(128, 64, 32, 8, 4),
                        GemmConfig::new(64, 128, 16, 4, 8),
                    ]
                    .into_iter()
                    .filter(|t| t.check(&ctx.limits).is_ok())
                    .collect(),
                );
            }
            "--no-registers" => registers = false,
            "--int8" => int8 = true,
            other => {
                return Err(Error::invalid(format!(
                    "unknown option {other}; usage: {USAGE}"
                )))
            }
        }
    }
    match (rows, cols) {
        (Some(r), Some(c)) => shapes = vec![(format!("{r}x{c}"), r, c)],
        (None, None) => {}
        _ => return Err(Error::invalid("--rows and --cols go together")),
    }
    for (name, r, c) in &shapes {
        // Without --tiles: each kernel's own choice for the shape (the 8-bit one picks its
        // step depth too).
        let (tiles, int8_tiles) = match &tiles {
            Some(t) => (t.clone(), t.clone()),
            None => (
                vec![GemmConfig::for_shape(ctx, *r, n_tokens)],
                vec![gemm_q8::for_shape(ctx, *r, n_tokens)],
            ),
        };
        let mut kernels: Vec<Kernel> = tiles.iter().copied().map(Kernel::Tiled).collect();
        if int8 && gemm_q8::supports(ty) {
            kernels.extend(
                int8_tiles
                    .iter()
                    .filter(|t| gemm_q8::check(**t, &ctx.limits).is_ok())
                    .map(|t| Kernel::Int8(*t)),
            );
        }
        if registers {
            kernels.push(Kernel::Registers(MatmulConfig::gemm(ctx, n_tokens)));
        }
        // About 20 GFLOP per sample unless told (a few ms on a big GPU, so the submit and the
        // readback do not dominate; on a CPU adapter pass a small --iters).
        let flops = 2.0 * *r as f64 * *c as f64 * n_tokens as f64;
        let n = if iters > 0 {
            iters
        } else {
            (2e10 / flops).clamp(3.0, 1000.0) as u32
        };
        for k in &kernels {
            let kernel = match k {
                Kernel::Tiled(t) => format!("gemm {t}"),
                Kernel::Int8(t) => format!(
                    "gemm_q8 {t} ({} blocks a step)",
                    gemm_q8::blocks_per_step(*t)
                ),
                Kernel::Registers(m) => format!("matmul {m:?}"),
            };
            // A tile this device cannot build is reported and the sweep goes on.
            let gflops = match pollster::block_on(gemm::bench_kernel(
                ctx, *k, ty, *r, *c, n_tokens, n,
            )) {
                Ok(g) => g,
                Err(e) => {
                    println!(
                            "{{\"shape\": \"{name}\", \"type\": \"{ty}\", \"kernel\": \"{kernel}\", \"error\": {:?}}}",
                            e.to_string()
                        );
                    continue;
                }
            };
            println!(
                "{{\"shape\": \"{name}\", \"type\": \"{ty}\", \"rows\": {r}, \"cols\": {c}, \"tokens\": {n_tokens}, \"iters\": {n}, \
                 \"kernel\": \"{kernel}\", \"gflops\": {gflops:.2}, \"ms\": {:.3}, \"adapter\": {:?}}}",
                flops / (gflops * 1e9) * 1e3,
                ctx.adapter.name
            );
        }
    }
    Ok(())
}
