//! `cera inspect MODEL.gguf`: what is in a GGUF file and how it would sit on this GPU.
//! Reads only the header (the parser stops at the first tensor byte).

use std::path::Path;

use cera_web::gguf::MetaValue;
use cera_web::gpu::GpuContext;
use cera_web::loader::plan;
use cera_web::Error;

/// Up to `limit` bytes of formatted text; the write that would pass it fails, which makes
/// `Debug` of a long array stop at once instead of formatting every element and dropping them
/// (a 262k-entry vocabulary is several MB of text). `offered` counts what was formatted.
struct Limited {
    s: String,
    limit: usize,
    offered: usize,
}

impl std::fmt::Write for Limited {
    fn write_str(&mut self, x: &str) -> std::fmt::Result {
        self.offered += x.len();
        let room = self.limit - self.s.len();
        if x.len() <= room {
            self.s.push_str(x);
            return Ok(());
        }
        let mut end = room;
        while !x.is_char_boundary(end) {
            end -= 1;
        }
        self.s.push_str(&x[..end]);
        Err(std::fmt::Error)
    }
}

/// A metadata value in at most about 100 characters, with its full size when it was cut.
/// Returns the text and the bytes formatted to make it.
fn short_counted(v: &MetaValue) -> (String, usize) {
    use std::fmt::Write;
    let mut w = Limited {
        s: String::new(),
        limit: 96,
        offered: 0,
    };
    if write!(w, "{v:?}").is_ok() {
        return (w.s, w.offered);
    }
    let size = match v {
        MetaValue::Array(a) => format!("{} items", a.len()),
        MetaValue::String(s) => format!("{} bytes", s.len()),
        _ => "cut".to_string(),
    };
    (format!("{}… ({size})", w.s), w.offered)
}

fn short(v: &MetaValue) -> String {
    short_counted(v).0
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

#[cfg(test)]
mod tests {
    use super::*;
    use cera_web::gguf::MetaArray;

    #[test]
    fn a_262k_vocabulary_is_shown_without_formatting_it_whole() {
        let vocab: Vec<String> = (0..262_144).map(|i| format!("token{i}")).collect();
        let v = MetaValue::Array(MetaArray::String(vocab));
        let t0 = std::time::Instant::now();
        let (text, formatted) = short_counted(&v);
        eprintln!(
            "262,144 entries: {text:?}, {formatted} bytes formatted in {:?}",
            t0.elapsed()
        );
        assert!(
            text.starts_with("Array(String([\"token0\", \"token1\""),
            "{text}"
        );
        assert!(text.ends_with("… (262144 items)"), "{text}");
        assert!(
            formatted < 200,
            "{formatted} bytes formatted for a 100-char line"
        );
        let long = MetaValue::String("é".repeat(100_000));
        let (text, formatted) = short_counted(&long);
        assert!(
            text.ends_with("… (200000 bytes)") && formatted < 300_000,
            "{text}"
        );
        assert_eq!(short(&MetaValue::U32(7)), "U32(7)");
    }
}
