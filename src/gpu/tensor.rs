//! A weight tensor on the GPU, split into row ranges so no binding exceeds the device's limit.
//!
//! A 2-D view: `rows` rows of `cols` elements (`cols` = GGUF `ne[0]`, the contiguous dim; `rows`
//! = the product of the other dims). Rows are stored in the GPU layout of `ty` (see
//! `crate::quant::gpu`: GGUF blocks, possibly repacked for aligned `u32` reads), `row_bytes`
//! each. Every part holds whole rows and is its own buffer (its own binding).

use crate::gguf::GgmlType;

pub struct TensorPart {
    pub buffer: wgpu::Buffer,
    /// First row of the tensor held by this part.
    pub row_start: u64,
    pub rows: u64,
}

pub struct GpuTensor {
    pub name: String,
    pub ty: GgmlType,
    pub cols: u64,
    pub rows: u64,
    /// Bytes of one row in the GPU layout.
    pub row_bytes: u64,
    pub parts: Vec<TensorPart>,
}

impl GpuTensor {
    /// The part holding row `row`, and the row's index within it.
    pub fn locate(&self, row: u64) -> Option<(&TensorPart, u64)> {
        self.parts
            .iter()
            .find(|p| row >= p.row_start && row < p.row_start + p.rows)
            .map(|p| (p, row - p.row_start))
    }

    pub fn gpu_bytes(&self) -> u64 {
        self.rows * self.row_bytes
    }

    /// An F32 tensor of `n` elements held in one part: a vector (a norm's weight) that a kernel
    /// binds whole and reads by element index.
    pub fn is_f32_vector(&self, n: u64) -> bool {
        self.ty == GgmlType::F32 && self.rows * self.cols == n && self.parts.len() == 1
    }
}

/// How rows are grouped into parts: as many whole rows as fit `max_binding` bytes.
pub fn plan_parts(rows: u64, row_bytes: u64, max_binding: u64) -> Result<Vec<(u64, u64)>, String> {
    if row_bytes == 0 {
        return Ok(vec![(0, rows)]);
    }
    // Binding sizes must be multiples of 4; rows in the GPU layout are, so whole rows suffice.
    let per = max_binding / row_bytes;
    if per == 0 {
        return Err(format!(
            "one row of {row_bytes} bytes is larger than the {max_binding}-byte binding limit"
        ));
    }
    let mut out = Vec::new();
    let mut r = 0;
    while r < rows {
        let n = per.min(rows - r);
        out.push((r, n));
        r += n;
    }
    if out.is_empty() {
        out.push((0, 0));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_rows_in_order_under_the_limit() {
        let p = plan_parts(262144, 680, 128 << 20).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), 262144);
        assert!(p.iter().all(|&(_, n)| n * 680 <= 128 << 20));
        assert_eq!(p[1].0, p[0].1);
        assert_eq!(plan_parts(5, 100, 1000).unwrap(), vec![(0, 5)]);
        assert_eq!(
            plan_parts(5, 100, 200).unwrap(),
            vec![(0, 2), (2, 2), (4, 1)]
        );
        assert!(plan_parts(1, 300, 200).is_err());
    }
}
