//! `cera`: the native command line. `cera adapter` shows the GPU and its limits; `cera selfcheck`
//! runs the kv_shift check against the CPU reference; `cera inspect MODEL.gguf` prints metadata,
//! tensors, bytes per quant type and the GPU memory plan; `cera load MODEL.gguf` times a load;
//! `cera bench-gemv` prints GEMV bandwidth per weight type and shape beside a plain copy's;
//! `cera bench-delta` times the gated delta rule's recurrent and chunked forms;
//! `cera bench-attention` times decode attention, one workgroup a head against the split kernel.

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
mod bench_attention;
#[cfg(not(target_arch = "wasm32"))]
mod bench_delta;
#[cfg(not(target_arch = "wasm32"))]
mod bench_gemm;
#[cfg(not(target_arch = "wasm32"))]
mod bench_gemv;
#[cfg(not(target_arch = "wasm32"))]
mod flags;
#[cfg(not(target_arch = "wasm32"))]
mod inspect;
#[cfg(not(target_arch = "wasm32"))]
mod llm;

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    use cera_web::gpu::GpuContext;
    let args: Vec<String> = std::env::args().collect();
    let open = || {
        GpuContext::new_blocking(&Default::default()).unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1);
        })
    };
    match args.get(1).map(String::as_str) {
        Some("adapter") => {
            let ctx = open();
            println!("{:#?}\n{:#?}", ctx.adapter, ctx.limits);
        }
        Some("selfcheck") => {
            let ctx = open();
            match pollster::block_on(cera_web::selfcheck::run(&ctx)) {
                Ok(r) => {
                    println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                    std::process::exit(if r.passed { 0 } else { 1 });
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::exit(1);
                }
            }
        }
        Some(cmd @ ("generate" | "tokenize" | "score" | "bench")) => {
            let run = llm::Flags::parse(cmd, &args[2..]).and_then(|f| match cmd {
                "generate" => llm::generate(&f),
                "tokenize" => llm::tokenize(&f),
                "score" => llm::score_cmd(&f),
                _ => llm::bench(&f),
            });
            if let Err(e) = run {
                eprintln!("error: {e}");
                std::process::exit(if e.code == cera_web::ErrorCode::InvalidArgument {
                    2
                } else {
                    1
                });
            }
        }
        Some("inspect") => {
            let rest = &args[2..];
            let json = rest.iter().any(|a| a == "--json");
            let paths: Vec<&String> = rest.iter().filter(|a| *a != "--json").collect();
            let [path] = paths[..] else {
                eprintln!("usage: cera inspect MODEL.gguf [--json]");
                std::process::exit(2);
            };
            if path.starts_with("--") {
                eprintln!(
                    "cera inspect has no flag {path}\nusage: cera inspect MODEL.gguf [--json]"
                );
                std::process::exit(2);
            }
            if let Err(e) = inspect::run(std::path::Path::new(path), json) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Some("load") => {
            let (Some(path), None) = (args.get(2).filter(|a| !a.starts_with("--")), args.get(3))
            else {
                eprintln!("usage: cera load MODEL.gguf");
                std::process::exit(2);
            };
            let ctx = open();
            let t0 = std::time::Instant::now();
            match cera_web::loader::load_file(&ctx, std::path::Path::new(path)) {
                Ok(m) => println!(
                    "{{\"load_seconds\": {:.3}, \"tensors\": {}, \"gpu_bytes\": {}, \"buffers\": {}, \"split_tensors\": {}, \"adapter\": {:?}}}",
                    t0.elapsed().as_secs_f64(),
                    m.tensors.len(),
                    m.plan.total_gpu_bytes,
                    m.plan.buffers,
                    m.plan.split_tensors,
                    ctx.adapter.name
                ),
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::exit(1);
                }
            }
        }
        Some("bench-gemm") => bench(&open(), bench_gemm::run, &args[2..]),
        Some("bench-attention") => bench(&open(), bench_attention::run, &args[2..]),
        Some("bench-delta") => bench(&open(), bench_delta::run, &args[2..]),
        Some("bench-gemv") => bench(&open(), bench_gemv::run, &args[2..]),
        _ => {
            eprintln!(
                "usage: cera adapter | cera selfcheck | cera inspect MODEL.gguf [--json] | cera load MODEL.gguf | {} | {} | {}",
                bench_gemv::USAGE,
                bench_delta::USAGE,
                bench_attention::USAGE
            );
            std::process::exit(2);
        }
    }
}

/// Run a bench command; its error exits 2 when the arguments were wrong, else 1.
#[cfg(not(target_arch = "wasm32"))]
fn bench(
    ctx: &cera_web::gpu::GpuContext,
    run: fn(&cera_web::gpu::GpuContext, &[String]) -> cera_web::Result<()>,
    args: &[String],
) {
    if let Err(e) = run(ctx, args) {
        eprintln!("error: {e}");
        std::process::exit(if e.code == cera_web::ErrorCode::InvalidArgument {
            2
        } else {
            1
        });
    }
}
