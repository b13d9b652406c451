//! `cera bench-gemv`: the GEMV bandwidth table of [`cera_web::ops::matmul_bench`].
//!
//! `cera bench-gemv [--quick] [--json] [--types q8_0,q4_K] [--shapes gemma|llama|all]
//! [--configs "wg256 tpr32 nt1;wg64 tpr1 nt1"] [--secs 0.2] [--epilogue resnorm|normscale]
//! [--x f32|q8mem|q8quantize]`

use cera_web::gguf::GgmlType;
use cera_web::gpu::GpuContext;
use cera_web::ops::matmul::{self, MatmulConfig};
use cera_web::ops::matmul_bench::{self, BenchEpilogue, BenchOptions, BenchRow, BenchX};
use cera_web::{Error, Result};

pub const USAGE: &str =
    "cera bench-gemv [--quick] [--json] [--types q8_0,q4_K,...] [--shapes gemma|llama|all] \
                         [--configs \"wg256 tpr32 nt1;...\"] [--secs S] [--epilogue resnorm|normscale] \
                         [--x f32|q8mem|q8quantize]";

fn parse(args: &[String]) -> Result<(BenchOptions, bool)> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut opts = if quick {
        BenchOptions::quick()
    } else {
        BenchOptions::full()
    };
    let mut json = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| Error::invalid(format!("{a} needs a value; usage: {USAGE}")))
        };
        match a.as_str() {
            "--quick" => {}
            "--json" => json = true,
            "--types" => {
                let v = value()?;
                opts.types = v
                    .split(',')
                    .map(|n| {
                        matmul::TYPES
                            .iter()
                            .map(|(t, _)| *t)
                            .find(|t: &GgmlType| t.name().eq_ignore_ascii_case(n))
                            .ok_or_else(|| {
                                Error::invalid(format!("unknown or unsupported type {n}"))
                            })
                    })
                    .collect::<Result<_>>()?;
            }
            "--shapes" => {
                opts.shapes = match value()?.as_str() {
                    "gemma" => matmul_bench::GEMMA3_270M.to_vec(),
                    "llama" => matmul_bench::LLAMA3_8B.to_vec(),
                    "all" => matmul_bench::GEMMA3_270M
                        .iter()
                        .chain(matmul_bench::LLAMA3_8B.iter())
                        .copied()
                        .collect(),
                    "quick" => matmul_bench::QUICK.to_vec(),
                    other => {
                        return Err(Error::invalid(format!(
                            "--shapes {other}: want gemma, llama, all or quick"
                        )))
                    }
                }
            }
            "--configs" => {
                opts.configs = Some(
                    value()?
                        .split(';')
                        .filter(|c| !c.trim().is_empty())
                        .map(str::parse::<MatmulConfig>)
                        .collect::<Result<_>>()?,
                )
            }
            "--epilogue" => {
                opts.epilogue = match value()?.as_str() {
                    "none" => BenchEpilogue::None,
                    "resnorm" => BenchEpilogue::ResNorm,
                    "normscale" => BenchEpilogue::NormScale,
                    other => {
                        return Err(Error::invalid(format!(
                            "--epilogue {other}: want none, resnorm or normscale"
                        )))
                    }
                }
            }
            "--x" => {
                opts.x = match value()?.as_str() {
                    "f32" => BenchX::F32,
                    "q8mem" => BenchX::Q8Mem,
                    "q8quantize" => BenchX::Q8Quantize,
                    other => {
                        return Err(Error::invalid(format!(
                            "--x {other}: want f32, q8mem or q8quantize"
                        )))
                    }
                }
            }
            "--secs" => {
                opts.target_secs = value()?
                    .parse()
                    .map_err(|_| Error::invalid("--secs needs a number"))?
            }
            other => {
                return Err(Error::invalid(format!(
                    "unknown argument {other}; usage: {USAGE}"
                )))
            }
        }
    }
    Ok((opts, json))
}

pub fn run(ctx: &GpuContext, args: &[String]) -> Result<()> {
    let (opts, json) = parse(args)?;
    if !json {
        println!(
            "adapter: {} ({}, {})",
            ctx.adapter.name, ctx.adapter.backend, ctx.adapter.device_type
        );
        println!(
            "{:<6} {:<28} {:>15} {:<24} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6}",
            "type",
            "shape",
            "rows x cols",
            "kernel",
            "MB",
            "us/gemv",
            "GB/s",
            "copy GB/s",
            "read GB/s",
            "ratio"
        );
    }
    let mut print = |r: &BenchRow| {
        if json {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        } else {
            println!(
                "{:<6} {:<28} {:>15} {:<24} {:>10.2} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.2}",
                r.ty,
                r.shape,
                format!("{}x{}", r.rows, r.cols),
                r.config,
                r.weight_bytes as f64 / 1e6,
                r.us_per_gemv,
                r.gemv_gb_s,
                r.copy_gb_s,
                r.read_gb_s,
                r.ratio
            );
        }
    };
    pollster::block_on(matmul_bench::run(ctx, &opts, &mut print))?;
    Ok(())
}
