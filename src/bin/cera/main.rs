//! `cera`: the native command line. `cera adapter` shows the GPU and its limits; `cera selfcheck`
//! runs the kv_shift check against the CPU reference; `cera inspect MODEL.gguf` prints metadata,
//! tensors, bytes per quant type and the GPU memory plan; `cera load MODEL.gguf` times a load.

#[cfg(target_arch = "wasm32")]
fn main() {}

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
            let run = llm::Flags::parse(&args[2..]).and_then(|f| match cmd {
                "generate" => llm::generate(&f),
                "tokenize" => llm::tokenize(&f),
                "score" => llm::score_cmd(&f),
                _ => llm::bench(&f),
            });
            if let Err(e) = run {
                eprintln!("error: {e}");
                std::process::exit(if e.code == cera_web::ErrorCode::InvalidArgument { 2 } else { 1 });
            }
        }
        Some("inspect") => {
            let Some(path) = args.get(2) else {
                eprintln!("usage: cera inspect MODEL.gguf [--json]");
                std::process::exit(2);
            };
            if let Err(e) = inspect::run(std::path::Path::new(path), args.iter().any(|a| a == "--json")) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Some("load") => {
            let Some(path) = args.get(2) else {
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
        Some("bench-gemv") => {
            // cera bench-gemv [TYPE=q8_0] [ROWS=262144] [COLS=640] [ITERS=5]: the output head by default.
            use cera_web::ops::matmul;
            let ty_name = args.get(2).map(String::as_str).unwrap_or("q8_0");
            let Some(ty) = matmul::TYPES.iter().map(|(t, _)| *t).find(|t| t.name().eq_ignore_ascii_case(ty_name)) else {
                eprintln!("error: unknown or unsupported type {ty_name}");
                std::process::exit(2);
            };
            let num = |i: usize, d: u64| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
            let (rows, cols, iters) = (num(3, 262144), num(4, 640), num(5, 5) as u32);
            let ctx = open();
            let cfg = matmul::MatmulConfig::gemv(&ctx);
            match pollster::block_on(matmul::bench_gemv(&ctx, ty, rows, cols, iters)) {
                Ok(gbs) => println!(
                    "{{\"type\": \"{ty}\", \"rows\": {rows}, \"cols\": {cols}, \"iters\": {iters}, \"gb_per_s\": {gbs:.3}, \"shape\": \"{cfg:?}\", \"adapter\": {:?}}}",
                    ctx.adapter.name
                ),
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::exit(1);
                }
            }
        }
        _ => {
            eprintln!("usage: cera adapter | cera selfcheck | cera inspect MODEL.gguf [--json] | cera load MODEL.gguf | cera bench-gemv [TYPE] [ROWS] [COLS] [ITERS]");
            std::process::exit(2);
        }
    }
}
