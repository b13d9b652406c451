//! `cera inspect MODEL.gguf`: what is in a GGUF file and how it would sit on this GPU.
//! Reads only the header (the parser stops at the first tensor byte).

use std::path::Path;

use cera_web::gguf::MetaValue;
use cera_web::gpu::GpuContext;
use cera_web::loader::plan;
use cera_web::Error;

fn short(v: &MetaValue) -> String {
    let s = format!("{v:?}");
    if s.len() > 100 {
        format!(
            "{}… ({} chars)",
            &s[..s.char_indices().nth(96).map_or(s.len(), |c| c.0)],
            s.len()
        )
    } else {
        s
    }
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

pub fn run(path: &Path, json: bool) -> Result<(), Error> {
    let (h, size) = cera_web::loader::read_header_file(path)?;
    let ctx = GpuContext::new_blocking(&Default::default())?;
    let p = plan(&h, ctx.limits.max_binding())?;
    if json {
        let out = serde_json::json!({
            "file": path.display().to_string(),
            "size": size,
            "version": h.version(),
            "architecture": h.architecture(),
            "metadata_keys": h.metadata().len(),
            "tensors": h.tensors().len(),
            "adapter": ctx.adapter.name,
            "plan": p,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(());
    }
    println!(
        "{}: GGUF v{}, {}, {} metadata keys, {} tensors",
        path.display(),
        h.version(),
        mb(size),
        h.metadata().len(),
        h.tensors().len()
    );
    println!("\n== metadata");
    for (k, v) in h.metadata() {
        println!("  {k} = {}", short(v));
    }
    println!("\n== tensors (name, type, dims, bytes, GPU parts)");
    for t in p.tensors.iter().filter(|t| t.members.is_empty()) {
        let info = h.tensor(&t.name).expect("planned from this header");
        match &t.fused_into {
            Some((f, row)) => println!(
                "  {:<32} {:<5} {:?} {} in {f} from row {row}",
                t.name,
                t.ty.name(),
                info.dims,
                t.file_bytes
            ),
            None => println!(
                "  {:<32} {:<5} {:?} {} x{}",
                t.name,
                t.ty.name(),
                info.dims,
                t.file_bytes,
                t.parts.len()
            ),
        }
    }
    println!(
        "\n== fused on the GPU (one GEMV computes the members: name, type, rows x cols, GPU parts)"
    );
    for t in p.tensors.iter().filter(|t| !t.members.is_empty()) {
        println!(
            "  {:<32} {:<5} {} x {} x{}",
            t.name,
            t.ty.name(),
            t.rows,
            t.cols,
            t.parts.len()
        );
    }
    println!("\n== bytes per quant type (file / GPU layout)");
    for (ty, b) in &p.file_bytes_per_type {
        println!(
            "  {ty:<5} {:>12} {:>12}",
            mb(*b),
            mb(p.gpu_bytes_per_type[ty])
        );
    }
    println!(
        "\n== GPU memory plan on \"{}\" ({}; binding limit {} MiB)",
        ctx.adapter.name,
        ctx.adapter.backend,
        p.max_binding >> 20
    );
    println!(
        "  {} buffers, {} tensors split, {} in all",
        p.buffers,
        p.split_tensors,
        mb(p.total_gpu_bytes)
    );
    for t in p.tensors.iter().filter(|t| t.parts.len() > 1) {
        println!(
            "  split: {} into {} parts of rows {:?}",
            t.name,
            t.parts.len(),
            t.parts
        );
    }
    Ok(())
}
