//! Bad input is refused with a clear error and leaves nothing changed, natively and in headless
//! Chrome: token ids outside the vocabulary (also at the end of a prompt longer than a prefill
//! chunk), a prompt longer than the whole context, impossible session options, and GGUF headers
//! that declare absurd sizes (10^9 tensors, a 10^8-entry vocabulary, a 2^40-element tensor),
//! streamed in small pieces: each is refused before anything is allocated for it; from a stream
//! of unknown length, GPU memory follows the bytes that actually arrive. Chat templates (code
//! from whatever file a page loads) that loop, double strings or lists (by `+`, `chain`, a
//! recursive macro), write without bound, or write out a namespace holding itself (the engine
//! would recurse until the stack overflows) or a list nesting one list twice 64 levels deep are
//! stopped in well under a second, while a 5,000-message chat still renders. A prompt from JS
//! with lone surrogates and NUL bytes becomes U+FFFD and NUL, and generates.

mod common;

use cera_web::generate::chat::{Builtin, ChatMessage, ChatTemplate};
use cera_web::generate::sampler::SamplerParams;
use cera_web::generate::session::now_s;
use cera_web::generate::session::{GenerateOptions, Session, SessionOptions};
use cera_web::gguf::GgufWriter;
use cera_web::loader::StreamLoader;
use cera_web::model::Model;
use cera_web::tokenizer::Tokenizer;
use cera_web::ErrorCode;
use std::sync::Arc;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

async fn generate(s: &mut Session, prompt: &[u32], n: u32) -> cera_web::Result<Vec<u32>> {
    let mut ids = Vec::new();
    let opts = GenerateOptions {
        max_tokens: n,
        stop: vec![],
        sampler: SamplerParams::greedy(),
        constraint: None,
        shown_control: Vec::new(),
    };
    s.generate(prompt, &opts, &mut |id, _| {
        ids.extend(id);
        true
    })
    .await?;
    Ok(ids)
}

async fn session_refusals() {
    let ctx = Arc::new(common::context().await);
    let weights = common::load_bytes(&ctx, &common::tiny_llama_gguf(5, 1, false)).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&weights.header).unwrap());
    let model = Arc::new(Model::new(&ctx, weights).await.unwrap());
    let opts = SessionOptions {
        n_ctx: 48,
        n_keep: 4,
        batch: 8,
        ..Default::default()
    };
    let mut s = Session::new(ctx.clone(), model.clone(), tok.clone(), opts.clone()).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| 3 + (i * 37) % 250).collect();
    let want = generate(&mut s, &prompt, 6).await.unwrap();
    s.reset();

    // An id outside the vocabulary after two full prefill chunks: refused by every entry point
    // before any chunk runs.
    let mut bad = prompt.clone();
    bad.push(256);
    let e = generate(&mut s, &bad, 6).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
    assert!(
        e.message
            .contains("token id 256 is outside the vocabulary of 256"),
        "{e}"
    );
    assert_eq!(s.feed(&bad).unwrap_err().code, ErrorCode::InvalidArgument);
    let mut sampler = cera_web::generate::sampler::Sampler::new(SamplerParams::greedy());
    assert_eq!(
        s.step(&bad, &mut sampler).await.unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        (s.n_past(), s.tokens().len(), s.shifts),
        (0, 0, 0),
        "a refused prompt changed the session"
    );
    assert_eq!(
        generate(&mut s, &prompt, 6).await.unwrap(),
        want,
        "the session works as before"
    );

    // Also when the context is full: the refusal comes before the shift it would need.
    s.reset();
    s.feed(&(0..48).map(|i| 3 + i).collect::<Vec<u32>>())
        .unwrap();
    assert_eq!(
        s.feed(&[5, u32::MAX]).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    assert_eq!((s.n_past(), s.shifts), (48, 0));

    // A prompt that cannot fit the context after n_keep (44 of 48 or more): CONTEXT_FULL, and
    // nothing fed; one token less fits (and shifts while generating).
    s.reset();
    let long: Vec<u32> = (0..44).map(|i| 3 + (i * 11) % 250).collect();
    let e = generate(&mut s, &long, 4).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::ContextFull, "{e}");
    assert!(
        e.message.contains(
            "the prompt has 44 tokens; it does not fit the context of 48 tokens (n_keep 4)"
        ),
        "{e}"
    );
    assert_eq!(s.n_past(), 0);
    assert_eq!(generate(&mut s, &long[..43], 8).await.unwrap().len(), 8);
    assert!(s.shifts >= 1);

    // Without context shift, generation stops with CONTEXT_FULL when the context is full.
    let mut fixed = Session::new(
        ctx.clone(),
        model.clone(),
        tok.clone(),
        SessionOptions {
            context_shift: false,
            ..opts.clone()
        },
    )
    .unwrap();
    let e = generate(&mut fixed, &long[..40], 20).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::ContextFull, "{e}");
    assert!(fixed.n_past() <= 48);

    // A prompt from JS with a lone surrogate and NUL bytes: crossing into wasm makes the lone
    // surrogate U+FFFD (wasm-bindgen encodes JS strings as UTF-8, as TextEncoder does); NUL is
    // an ordinary character (the tokenizer fixtures check NUL against llama.cpp for every
    // vocabulary type). Here: the conversion, then such a prompt tokenizes without error and
    // generates (this tiny vocabulary spells none of these characters, so only BOS remains).
    #[cfg(target_arch = "wasm32")]
    let text: String = js_sys::JsString::from_char_code(&[0x61, 0xD800, 0x62, 0, 0x63, 0xDC00])
        .as_string()
        .expect("a JS string");
    #[cfg(not(target_arch = "wasm32"))]
    let text = String::from_utf16_lossy(&[0x61, 0xD800, 0x62, 0, 0x63, 0xDC00]);
    assert_eq!(text, "a\u{FFFD}b\0c\u{FFFD}");
    let ids = tok.encode(&text, true, true);
    tlog!("lone surrogates and NUL: {text:?} -> {ids:?}");
    assert_eq!(ids, [1]);
    s.reset();
    assert_eq!(generate(&mut s, &ids, 4).await.unwrap().len(), 4);

    // Impossible options.
    for (n_ctx, n_keep) in [(48, 48), (48, 100), (1, 0), (0, 0)] {
        let o = SessionOptions {
            n_ctx,
            n_keep,
            ..opts.clone()
        };
        let e = Session::new(ctx.clone(), model.clone(), tok.clone(), o)
            .err()
            .expect("refused");
        assert_eq!(
            e.code,
            ErrorCode::InvalidArgument,
            "n_ctx {n_ctx} n_keep {n_keep}: {e}"
        );
    }
}
gpu_test!(
    bad_ids_long_prompts_and_options_are_refused_and_change_nothing,
    session_refusals()
);

/// A valid small GGUF header, then `patch` applied to its bytes.
fn header_bytes(patch: &dyn Fn(&mut GgufWriter)) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", "llama");
    patch(&mut w);
    w.tensor_f32("token_embd.weight", &[4, 2], &[0.0; 8]);
    w.to_bytes()
}

/// Replace the first occurrence of `from` (little-endian u64) in `b` by `to`.
fn patch_u64(b: &mut [u8], from: u64, to: u64) {
    let at = b
        .windows(8)
        .position(|w| w == from.to_le_bytes())
        .expect("the value to patch");
    b[at..at + 8].copy_from_slice(&to.to_le_bytes());
}

async fn gguf_refusals() {
    let ctx = common::context().await;
    // 10^9 tensors declared (the count is the u64 after the magic and version).
    let mut many_tensors = header_bytes(&|_| {});
    many_tensors[8..16].copy_from_slice(&1_000_000_000u64.to_le_bytes());
    // A 10^8-entry vocabulary declared, three entries present.
    let mut vocab = header_bytes(&|w| {
        w.meta("tokenizer.ggml.tokens", vec!["a", "b", "c"]);
    });
    patch_u64(&mut vocab, 3, 100_000_000);
    // A tensor of 2^40 f32 elements (4 TiB) declared, 32 bytes present.
    let mut huge = GgufWriter::new();
    huge.meta("general.architecture", "llama");
    huge.tensor_f32("token_embd.weight", &[1 << 20, 1 << 20], &[0.0; 8]);
    let huge = huge.to_bytes();
    for (what, bytes) in [
        ("10^9 tensors", &many_tensors),
        ("a 10^8-entry vocabulary", &vocab),
        ("a 2^40-element tensor", &huge),
    ] {
        let mut loader = StreamLoader::new(&ctx, Some(bytes.len() as u64));
        let mut result = Ok(());
        for piece in bytes.chunks(7) {
            result = loader.push(piece);
            if result.is_err() {
                break;
            }
        }
        let e = match result {
            Err(e) => e,
            Ok(()) => loader
                .finish()
                .err()
                .unwrap_or_else(|| panic!("{what}: loaded")),
        };
        tlog!("{what}: {:?}: {}", e.code, e.message);
        assert!(
            matches!(e.code, ErrorCode::BadGguf | ErrorCode::AdapterTooSmall),
            "{what}: {e}"
        );
    }

    // The 2^40-element tensor from a stream of unknown length that keeps sending bytes (8 MiB):
    // GPU memory follows the rows received (one part, not 32,768 parts of up to 128 MiB), and
    // the end of the stream refuses the model.
    #[cfg(not(target_arch = "wasm32"))]
    let live = || {
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .unwrap();
        ctx.device.get_internal_counters().hal.buffers.read()
    };
    #[cfg(not(target_arch = "wasm32"))]
    let before = live();
    let mut loader = StreamLoader::new(&ctx, None);
    loader.push(&huge[..huge.len() - 32]).unwrap();
    for _ in 0..8 {
        loader.push(&vec![0u8; 1 << 20]).unwrap();
    }
    // One part buffer and wgpu's staging for the queued writes.
    #[cfg(not(target_arch = "wasm32"))]
    assert!(
        live() - before <= 6,
        "{} GPU buffers made for 8 MiB of a declared 4 TiB tensor",
        live() - before
    );
    let e = loader
        .finish()
        .err()
        .expect("a truncated 4 TiB tensor must not load");
    assert_eq!(e.code, ErrorCode::BadGguf, "{e}");
}
gpu_test!(
    gguf_headers_declaring_absurd_sizes_are_refused,
    gguf_refusals()
);

async fn template_refusals() {
    let chat = [
        ChatMessage::system("Be brief."),
        ChatMessage::user("Hi"),
        ChatMessage::assistant("Hello."),
        ChatMessage::user("Why?"),
    ];
    let unrolled = format!(
        "{{% set l = [1] %}}{}{{{{ l | length }}}}",
        "{% set l = l + l %}".repeat(64)
    );
    for (what, src, bound) in [
        (
            "a list doubled 64 times by +",
            "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
            "builds a list",
        ),
        (
            "a list doubled 64 times by a recursive macro",
            "{% macro d(l, n) %}{% if n %}{{ d(l + l, n - 1) }}{% else %}{{ l | length }}{% endif %}{% endmacro %}{{ d(['x'], 64) }}",
            "builds a list",
        ),
        ("a list doubled by 64 statements in a row", unrolled.as_str(), "builds a list"),
        (
            "a list doubled 64 times by chain",
            "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l | chain(ns.l) %}{% endfor %}{{ ns.l | length }}",
            "builds a list",
        ),
        (
            "a list grown by one item 100,000 times",
            "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.l | length }}",
            "budget of",
        ),
        (
            "a dict grown by one entry 100,000 times",
            "{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = ns.d | chain({i: i}) %}{% endfor %}{{ ns.d | length }}",
            "budget of",
        ),
        (
            "a namespace that holds itself, written out",
            "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
            "writes out a value",
        ),
        (
            "a namespace that holds itself, as JSON",
            "{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns | tojson }}",
            "writes out a value",
        ),
        (
            "a namespace that holds itself, joined by the join filter",
            "{% set ns = namespace() %}{% set ns.me = ns %}{{ [ns] | join }}",
            "writes out a value",
        ),
        (
            "a namespace that holds itself, joined by Python's str.join",
            "{% set ns = namespace() %}{% set ns.me = ns %}{{ ', '.join([ns]) }}",
            "writes out a value",
        ),
        (
            "a namespace that holds itself, formatted by %",
            "{% set ns = namespace() %}{% set ns.me = ns %}{{ '%s' % ns }}",
            "writes out a value",
        ),
        (
            "two lists each holding one list twice, 64 levels deep, compared by ==",
            "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}",
            "writes out a value",
        ),
        (
            "such lists compared by the eq test and by in",
            "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a is eq(ns.b) }}{{ ns.a in [ns.b] }}",
            "writes out a value",
        ),
        (
            "such lists sorted and made unique",
            "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ [ns.a, ns.b] | sort | unique | length }}",
            "writes out a value",
        ),
        (
            "a list holding one list twice, 64 levels deep, joined to a string by ~",
            "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ (ns.l ~ '') | length }}",
            "writes out a value",
        ),
        (
            "a map holding one map twice, 64 levels deep, as a string",
            "{% set ns = namespace(d={}) %}{% for i in range(64) %}{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}{{ ns.d | string | length }}",
            "writes out a value",
        ),
        (
            "a string doubled 64 times by +",
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
            "budget of",
        ),
        (
            "two nested range(100000) loops",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "budget of",
        ),
        (
            "a string doubled 64 times",
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            "budget of",
        ),
        (
            "100 MB written a kilobyte at a time",
            "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
            "output passed",
        ),
        (
            "a string of 2^40 bytes from one repeat",
            "{{ 'x' * 1099511627776 }}",
            // On wasm32 the count passes usize, and minijinja refuses it itself.
            "budget of|repeated string is too large",
        ),
    ] {
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let t0 = now_s();
        let e = t.render(&chat, true).unwrap_err();
        let secs = now_s() - t0;
        tlog!("{what}: {:?} after {:.3} s: {}", e.code, secs, e.message);
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{what}: {e}");
        assert!(
            bound.split('|').any(|b| e.message.contains(b)),
            "{what}: {e}"
        );
        assert!(secs < 1.0, "{what}: took {secs:.2} s");
    }

    // Growth that stays small is not refused, and ends as fast: a list of empty lists and a
    // map merged with itself, each doubled 64 times (unguarded, each walks 2^33 parts).
    for (what, src, want) in [
        (
            "an empty list doubled 64 times",
            "{% set ns = namespace(l=[]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
            "0",
        ),
        (
            "a map chained with itself 64 times",
            "{% set ns = namespace(d={'a': 1}) %}{% for i in range(64) %}{% set ns.d = ns.d | chain(ns.d) %}{% endfor %}{{ ns.d | tojson }}",
            "{\"a\": 1}",
        ),
        (
            "lists, maps and tuples joined as templates do",
            "{% set ns = namespace(l=[]) %}{% for m in messages %}{% set ns.l = ns.l + [m.role] %}{% endfor %}{{ (ns.l + ['end']) | join(',') }} {{ [1] | chain([2], (3,)) | list }} {{ {'a': 1} | chain({'b': 2}) | tojson }} {{ (1,) + (2,) }} {{ 'a' + 'b' }} {{ 1 + 2.5 }}",
            "system,user,assistant,user,end [1, 2, 3] {\"a\": 1, \"b\": 2} (1, 2) ab 3.5",
        ),
    ] {
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let t0 = now_s();
        let out = t
            .render(&chat, true)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let secs = now_s() - t0;
        tlog!("{what}: rendered in {secs:.3} s");
        assert_eq!(out, want, "{what}");
        assert!(secs < 1.0, "{what}: took {secs:.2} s");
    }

    // A long conversation through the built-ins still renders, whole.
    let long: Vec<ChatMessage> = (0..5000)
        .map(|i| {
            if i % 2 == 0 {
                ChatMessage::user(format!("question {i}: {}", "word ".repeat(40)))
            } else {
                ChatMessage::assistant(format!("answer {i}"))
            }
        })
        .collect();
    let official = [
        (
            "Llama 3.2 (file)",
            include_str!("fixtures/chat/llama3.2-instruct.jinja"),
        ),
        (
            "Qwen 2.5 (file)",
            include_str!("fixtures/chat/qwen2.5-instruct.jinja"),
        ),
    ];
    let templates = [
        Builtin::Gemma,
        Builtin::Llama3,
        Builtin::ChatMl,
        Builtin::Llama2,
    ]
    .map(|b| {
        (
            format!("{b:?} (built-in)"),
            ChatTemplate::builtin(b, "<s>", "</s>"),
        )
    })
    .into_iter()
    .chain(official.map(|(n, src)| {
        (
            n.to_string(),
            ChatTemplate::new(src, "<s>", "</s>").unwrap(),
        )
    }));
    for (name, t) in templates {
        let t0 = now_s();
        let out = t
            .render(&long, true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        tlog!(
            "{name}: 5,000 messages, {} bytes rendered in {:.3} s",
            out.len(),
            now_s() - t0
        );
        assert!(
            out.contains("answer 4999") && out.contains("question 0: "),
            "{name}"
        );
    }
}
gpu_test!(
    chat_templates_that_loop_or_grow_are_stopped_in_under_a_second,
    template_refusals()
);
