//! `cera`: the native command line. `cera adapter` shows the GPU and its limits; `cera selfcheck`
//! runs the kv_shift check against the CPU reference. (The model commands arrive with the loader.)

#[cfg(target_arch = "wasm32")]
fn main() {}

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
        _ => {
            eprintln!("usage: cera adapter | cera selfcheck");
            std::process::exit(2);
        }
    }
}
