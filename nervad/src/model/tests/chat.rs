use crate::model::chat_template::{ChatTemplate, SpecialTokens};
use crate::model::error::ModelError;
use crate::model::generate::{CHATML_TEMPLATE, LLAMA3_TEMPLATE, MISTRAL_TEMPLATE, QWEN2_TEMPLATE};
use crate::model::tokenizer_config::TokenizerConfig;

fn special(bos: &str, eos: &str) -> SpecialTokens {
    SpecialTokens {
        bos: Some(bos.into()),
        eos: Some(eos.into()),
        ..SpecialTokens::default()
    }
}

const CONVERSATION: &str = r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there "},{"role":"assistant","content":"Hello."},{"role":"user","content":"Bye"}]"#;

#[test]
fn chatml() {
    let t = ChatTemplate::new(CHATML_TEMPLATE, SpecialTokens::default()).unwrap();
    assert_eq!(
        t.render(CONVERSATION, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there <|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
    let without = t
        .render(r#"[{"role":"user","content":"x"}]"#, false)
        .unwrap();
    assert_eq!(without, "<|im_start|>user\nx<|im_end|>\n");
    let t = ChatTemplate::new(QWEN2_TEMPLATE, SpecialTokens::default()).unwrap();
    assert!(
        t.render(r#"[{"role":"user","content":"x"}]"#, false)
            .unwrap()
            .starts_with(
                "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nx"
            )
    );
}

#[test]
fn llama3_uses_bos_and_trims() {
    let t = ChatTemplate::new(LLAMA3_TEMPLATE, special("<|begin_of_text|>", "<|eot_id|>")).unwrap();
    assert_eq!(
        t.render(r#"[{"role":"user","content":"  Hi  "}]"#, true)
            .unwrap(),
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn mistral_raise_exception_is_an_error() {
    let t = ChatTemplate::new(MISTRAL_TEMPLATE, special("<s>", "</s>")).unwrap();
    assert_eq!(
        t.render(
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]"#,
            false
        )
        .unwrap(),
        "<s>[INST] a [/INST]b</s>"
    );
    let err = t.render(CONVERSATION, true).unwrap_err();
    assert!(matches!(err, ModelError::ChatTemplate(_)));
    assert!(
        err.to_string()
            .contains("Conversation roles must alternate"),
        "{err}"
    );
}

#[test]
fn python_methods_loop_controls_tojson_and_strftime() {
    // Constructs real HF templates use (Qwen3, Llama 3.1): string methods, namespace,
    // loop controls, tojson, strftime_now, `is defined`.
    let src = r#"{%- set ns = namespace(n=0) %}
{%- for m in messages %}
{%- if m.role == 'tool' %}{% continue %}{% endif %}
{%- if m.content.startswith('<think>') %}{% break %}{% endif %}
{%- set ns.n = ns.n + 1 %}
[{{ m.role.upper() }}] {{ m.content.strip() | tojson }} {{ m.content.split(' ') | length }}
{%- endfor %}
{{- ' n=' ~ ns.n }}
{%- if tools is defined %} tools{% endif %}
{{- ' date=' ~ (strftime_now('%Y') | length) }}"#;
    let t = ChatTemplate::new(src, SpecialTokens::default()).unwrap();
    let out = t
        .render(
            r#"[{"role":"user","content":" a b "},{"role":"tool","content":"x"},{"role":"assistant","content":"\"q\""},{"role":"user","content":"<think>z"}]"#,
            false,
        )
        .unwrap();
    // trim_blocks drops the newline after each block tag, as in Jinja2.
    assert_eq!(
        out,
        "[USER] \"a b\" 4[ASSISTANT] \"\\\"q\\\"\" 1 n=2 date=4"
    );
}

#[test]
fn bad_messages_and_templates() {
    let t = ChatTemplate::new(CHATML_TEMPLATE, SpecialTokens::default()).unwrap();
    for (bad, needle) in [
        ("{", "not valid JSON"),
        ("{}", "JSON array"),
        ("[]", "empty"),
        (r#"[{"content":"x"}]"#, "role"),
        (r#"[{"role":"user","content":5}]"#, "content"),
        (r#"["hi"]"#, "not an object"),
    ] {
        let err = t.render(bad, true).unwrap_err().to_string();
        assert!(err.contains(needle), "{bad}: {err}");
    }
    let err = ChatTemplate::new("{% for %}", SpecialTokens::default()).unwrap_err();
    assert!(matches!(err, ModelError::ChatTemplate(_)), "{err}");
}

#[test]
fn tokenizer_config_variants() {
    let path = std::path::Path::new("tokenizer_config.json");
    let c = TokenizerConfig::from_json_str(
        r#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        path,
    )
    .unwrap();
    assert_eq!(c.special.bos.as_deref(), Some("<s>"));
    assert_eq!(c.special.eos.as_deref(), Some("</s>"));
    assert_eq!(c.special.pad, None);
    assert_eq!(c.chat_template.as_deref(), Some("D"));
    let err = TokenizerConfig::from_json_str(r#"{"eos_token": 5}"#, path).unwrap_err();
    assert!(err.to_string().contains("eos_token"), "{err}");
}
