//! `cera`: the native command line (more commands arrive with the loader and the model).
fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("adapter") => match cera_web::gpu::GpuContext::new_blocking(&Default::default()) {
            Ok(ctx) => {
                println!("{:#?}", ctx.adapter);
                println!("{:#?}", ctx.limits);
            }
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        },
        _ => {
            eprintln!("usage: cera adapter");
            std::process::exit(2);
        }
    }
}
