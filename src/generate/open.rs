//! One way to open a model, shared by the JS `Engine` and the `cera` CLI, so that both pick the
//! same chat template, clamp the context the same way and default to the same number of tokens:
//! weights loaded by either (a stream in the browser, a file natively) become an
//! [`OpenedModel`], which makes sessions and turns prompts (text or a conversation) into ids.

use std::sync::Arc;

use crate::error::Result;
use crate::generate::chat::{strip_leading_bos, ChatMessage, ChatTemplate};
use crate::generate::session::{Session, SessionOptions};
use crate::gpu::GpuContext;
use crate::loader::LoadedModel;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// Tokens generated when the caller sets no limit (JS `maxTokens`, CLI `--max-tokens`).
pub const DEFAULT_MAX_TOKENS: u32 = 256;

/// A model on the GPU with its tokenizer and chat template.
pub struct OpenedModel {
    pub model: Arc<Model>,
    pub tok: Arc<Tokenizer>,
    /// The file's template, else the built-in for its architecture; the error (a template that
    /// does not parse, or none for this architecture) is kept and returned by a chat, so a
    /// model without one still serves plain prompts.
    pub template: Result<ChatTemplate>,
}

impl OpenedModel {
    /// The model from loaded weights: tokenizer and template from its header.
    pub async fn new(ctx: &GpuContext, weights: LoadedModel) -> Result<Self> {
        let header = weights.header.clone();
        let tok = Tokenizer::from_gguf(&header)?;
        let text_of =
            |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
        let (bos, eos) = (text_of(tok.bos_id()), text_of(tok.eos_id()));
        let template = ChatTemplate::select(
            header.get_str("tokenizer.chat_template"),
            header.architecture().unwrap_or(""),
            &|t| tok.token_id(t).is_some(),
            &bos,
            &eos,
        );
        let model = Model::new(ctx, weights).await?;
        Ok(OpenedModel {
            model: Arc::new(model),
            tok: Arc::new(tok),
            template,
        })
    }

    /// The context a session gets for `requested` tokens (default 2048): at most the model's
    /// training context, which positions past it were never trained for.
    pub fn context_size(&self, requested: Option<u32>) -> u32 {
        requested
            .unwrap_or(SessionOptions::default().n_ctx)
            .min(self.model.hp.n_ctx_train.max(2))
    }

    /// A session with `opts`, its `n_ctx` clamped by [`OpenedModel::context_size`].
    pub fn session(&self, ctx: &Arc<GpuContext>, opts: SessionOptions) -> Result<Session> {
        let opts = SessionOptions {
            n_ctx: self.context_size(Some(opts.n_ctx)),
            ..opts
        };
        Session::new(ctx.clone(), self.model.clone(), self.tok.clone(), opts)
    }

    /// The ids of a conversation, rendered by the template with the assistant's turn opened.
    /// A BOS the template wrote is dropped when the tokenizer adds one itself (as llama.cpp
    /// does), and special-token texts are parsed as the special tokens.
    pub fn chat_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.chat_tokens_with_tools(messages, None)
    }

    /// [`Self::chat_tokens`] with OpenAI's `tools` handed to the template.
    pub fn chat_tokens_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
    ) -> Result<Vec<u32>> {
        let t = self.template.as_ref().map_err(Clone::clone)?;
        let text = t.render_with_tools(messages, tools, true)?;
        let text = if self.tok.add_bos() {
            strip_leading_bos(&text, &t.bos_token)
        } else {
            &text
        };
        Ok(self.tok.encode(text, true, true))
    }
}
