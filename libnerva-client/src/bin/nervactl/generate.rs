//! `nervactl generate`: stream one generation.

use std::io::Write;
use std::path::Path;

use clap::Args;
use nerva_client::{Client, Error, EventRef, GenerateParams, Prompt, status_code};

/// Sampling and stopping flags.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The prompt (text; with --tokens comma-separated ids; with --chat a JSON message array).
    pub prompt: String,
    /// Treat the prompt as comma-separated token ids.
    #[arg(long, conflicts_with = "chat")]
    pub tokens: bool,
    /// Treat the prompt as a JSON array of {"role","content"} messages.
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate per sample.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Stop token id (repeatable).
    #[arg(long = "stop-token")]
    pub stop_token: Vec<u32>,
    /// Keep generating past end-of-sequence.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Samples (sample 0 streams; the others print when done).
    #[arg(long, default_value_t = 1)]
    pub n_samples: u16,
    /// Report this many alternatives per token (with --json).
    #[arg(long, default_value_t = 0)]
    pub top_logprobs: u8,
    /// Priority (higher first).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub priority: i8,
}

/// Run it.
pub fn run(socket: Option<&Path>, a: &GenerateArgs, as_json: bool) -> Result<(), Error> {
    let mut client = Client::connect(socket)?;
    let params = GenerateParams {
        user_data: 0,
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        seed: a.seed,
        stop_strings: a.stop.clone(),
        stop_token_ids: a.stop_token.clone(),
        ignore_eos: a.ignore_eos,
        n_samples: a.n_samples,
        top_logprobs: a.top_logprobs,
        priority: a.priority,
        stream_tokens: as_json,
        stream_text: true,
        logprobs: as_json,
    };
    let ids: Vec<u32>;
    let prompt = if a.tokens {
        ids = a
            .prompt
            .split(',')
            .map(|t| t.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|e| Error::InvalidArgument(format!("token ids: {e}")))?;
        Prompt::Tokens(&ids)
    } else if a.chat {
        Prompt::Chat(&a.prompt)
    } else {
        Prompt::Text(&a.prompt)
    };
    client.submit_generate(prompt, &params)?;
    let n = usize::from(a.n_samples);
    let mut texts = vec![String::new(); n];
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut finished = 0;
    let mut failure: Option<Error> = None;
    let mut summaries = Vec::new();
    let stdout = std::io::stdout();
    while finished < n && failure.is_none() {
        client.wait(None)?;
        client.poll_with(|e| match e {
            EventRef::Text { sample, text, .. } => {
                let i = usize::from(sample).min(n - 1);
                texts[i].push_str(text);
                if sample == 0 && !as_json {
                    let mut out = stdout.lock();
                    let _ = out.write_all(text.as_bytes());
                    let _ = out.flush();
                }
            }
            EventRef::Tokens { sample, ids, .. } => {
                tokens[usize::from(sample).min(n - 1)].extend_from_slice(ids);
            }
            EventRef::Done {
                sample,
                reason,
                timings,
                ..
            } => {
                finished += 1;
                summaries.push(serde_json::json!({
                    "sample": sample,
                    "finish": reason.name(),
                    "prompt_tokens": timings.prompt_tokens,
                    "generated_tokens": timings.generated_tokens,
                    "queue_us": timings.queue.as_micros() as u64,
                    "ttft_us": timings.time_to_first_token.as_micros() as u64,
                    "inter_token_us": timings.inter_token().as_micros() as u64,
                }));
                if !as_json && sample == 0 {
                    eprintln!(
                        "\n[{}; {} prompt + {} generated tokens; queue {:?}, first token {:?}, inter-token {:?}]",
                        reason.name(),
                        timings.prompt_tokens,
                        timings.generated_tokens,
                        timings.queue,
                        timings.time_to_first_token,
                        timings.inter_token()
                    );
                }
            }
            EventRef::Error { status, detail, .. } => {
                failure = Some(match status_code(status) {
                    Some(code) => Error::Rejected(code),
                    None => Error::Protocol(format!("status {status}: {detail}")),
                });
            }
            EventRef::Shutdown => {
                failure = Some(Error::ShuttingDown);
            }
            EventRef::TopLogprobs { .. } => {}
        })?;
    }
    if let Some(e) = failure {
        return Err(e);
    }
    if as_json {
        let samples: Vec<_> = (0..n)
            .map(|i| serde_json::json!({"text": texts[i], "tokens": tokens[i]}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"samples": samples, "finished": summaries})
        );
    } else {
        for (i, t) in texts.iter().enumerate().skip(1) {
            println!("\n--- sample {i} ---\n{t}");
        }
    }
    Ok(())
}
