//! Teacher-forced scoring: run given token ids through the model in batches and report, for
//! every position, the top next tokens (what `cera score` prints and the llama.cpp checks use).

use crate::error::Result;
use crate::gpu::readback::read_f32;
use crate::gpu::GpuContext;
use crate::model::{LogitRows, Model};

/// The `k` best `(id, logit)` of each position of `tokens` from `from` on, best first.
///
/// `batch` tokens are evaluated per forward pass. Positions before `from` only fill the cache
/// (one row of logits per batch); from `from` on every row's logits are read back whole (a test
/// and analysis path, not generation).
pub async fn score(
    ctx: &GpuContext,
    model: &Model,
    tokens: &[u32],
    from: usize,
    k: usize,
    batch: u32,
) -> Result<Vec<Vec<(u32, f32)>>> {
    Ok(score_rows(ctx, model, tokens, from, k, batch)
        .await?
        .into_iter()
        .map(|r| r.top)
        .collect())
}

/// One scored position: the best logits and the row's log-sum-exp (a token's log-probability
/// is its logit minus `lse`).
#[derive(Clone, Debug)]
pub struct ScoredRow {
    /// The `k` best `(id, logit)`, best first.
    pub top: Vec<(u32, f32)>,
    /// `ln(sum(exp(logit)))` over the whole vocabulary, in f64.
    pub lse: f64,
}

/// As [`score`], with each row's log-sum-exp.
pub async fn score_rows(
    ctx: &GpuContext,
    model: &Model,
    tokens: &[u32],
    from: usize,
    k: usize,
    batch: u32,
) -> Result<Vec<ScoredRow>> {
    let n_vocab = model.hp.n_vocab as usize;
    let mut out = Vec::with_capacity(tokens.len().saturating_sub(from));
    forward_rows(ctx, model, tokens, from, batch, &mut |logits| {
        out.extend(logits.chunks_exact(n_vocab).map(|row| ScoredRow {
            top: top_k(row, k),
            lse: log_sum_exp(row),
        }))
    })
    .await?;
    Ok(out)
}

/// `ln(sum(exp(x)))` in f64, shifted by the maximum; NaN if any element is NaN.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().fold(
        f32::NEG_INFINITY,
        |m, &v| if v > m || v.is_nan() { v } else { m },
    ) as f64;
    if !max.is_finite() {
        return max;
    }
    max + row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// Run `tokens` through a fresh cache in batches of `batch`; `on_rows` gets the full logits
/// `(rows, n_vocab)` of every chunk at or after position `from`.
async fn forward_rows(
    ctx: &GpuContext,
    model: &Model,
    tokens: &[u32],
    from: usize,
    batch: u32,
    on_rows: &mut dyn FnMut(Vec<f32>),
) -> Result<()> {
    let n_vocab = model.hp.n_vocab as usize;
    let batch = batch.max(1) as usize;
    let mut kv = model.new_kv_cache(ctx, (tokens.len() as u32).max(1))?;
    let ws = model.workspace(ctx, batch as u32, batch as u32)?;
    let mut pos = 0usize;
    while pos < tokens.len() {
        // Chunks end at `from` so every reported row comes from an `All` pass.
        let end = if pos < from {
            from.min(pos + batch)
        } else {
            (pos + batch).min(tokens.len())
        };
        let chunk = &tokens[pos..end];
        let rows = if pos >= from {
            LogitRows::All
        } else {
            LogitRows::Last
        };
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        model.encode(ctx, &mut enc, &ws, &kv, chunk, pos as u32, rows)?;
        ctx.submit([enc.finish()]);
        kv.advance(chunk.len() as u32)?;
        if rows == LogitRows::All {
            on_rows(read_f32(ctx, &ws.logits, 0, chunk.len() * n_vocab).await?);
        }
        pos = end;
    }
    Ok(())
}

/// The `k` largest `(index, value)`, best first; ties by lower index.
pub fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &v) in row.iter().enumerate() {
        if best.len() < k || v > best[best.len() - 1].1 {
            let at = best.iter().position(|&(_, b)| v > b).unwrap_or(best.len());
            best.insert(at, (i as u32, v));
            best.truncate(k);
        }
    }
    best
}

/// Every position's full logits, `(tokens.len(), n_vocab)` row-major (tests on small vocabularies).
pub async fn score_logits(
    ctx: &GpuContext,
    model: &Model,
    tokens: &[u32],
    batch: u32,
) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(tokens.len() * model.hp.n_vocab as usize);
    forward_rows(ctx, model, tokens, 0, batch, &mut |logits| {
        out.extend(logits)
    })
    .await?;
    Ok(out)
}
