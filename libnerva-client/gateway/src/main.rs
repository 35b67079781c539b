//! `nerva-gateway`: an OpenAI-compatible HTTP server over a running `nervad`.
//!
//! ```sh
//! nerva-gateway --listen 127.0.0.1:8000          # on the default daemon socket
//! curl localhost:8000/v1/chat/completions -H 'content-type: application/json' \
//!   -d '{"model": "tiny-demo-0", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}'
//! ```
#![deny(missing_docs)]

mod daemon;
mod error;
mod generation;
mod metrics;
mod request;
mod server;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// OpenAI-compatible HTTP gateway over nervad (chat and text completions, SSE streaming,
/// models, health, Prometheus metrics).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The daemon's socket [default: the client library's default path].
    #[arg(long, env = "NERVA_SOCKET")]
    socket: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Daemon connections (shared-memory segments) that all HTTP requests share.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Require `Authorization: Bearer <key>` on /v1/* (/health and /metrics stay open).
    #[arg(long, env = "NERVA_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Largest request body, in bytes (larger: 413).
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Serve the model under this id instead of the daemon's model name.
    #[arg(long)]
    served_model_name: Option<String>,
    /// `max_tokens` of /v1/completions requests that name none (chat defaults to the context).
    #[arg(long, default_value_t = 16)]
    default_completion_tokens: u32,
    /// Runtime worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    workers: usize,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if args.workers > 0 {
        builder.worker_threads(args.workers);
    }
    let runtime = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nerva-gateway: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nerva-gateway: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> std::io::Result<()> {
    let pool = daemon::Pool::start(args.socket.clone(), args.connections);
    let state = server::AppState::new(
        pool,
        server::Settings {
            api_key: args.api_key.filter(|k| !k.is_empty()),
            max_body_bytes: args.max_body_bytes,
            served_model_name: args.served_model_name,
            default_completion_tokens: args.default_completion_tokens.max(1),
        },
    );
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let local = listener.local_addr()?;
    // Tests and scripts wait for this line (with --listen 127.0.0.1:0 it names the port).
    eprintln!("nerva-gateway listening on http://{local}");
    // Without TCP_NODELAY each SSE frame after the first waits for the peer's delayed ACK
    // (Nagle): ~40 ms stalls inside a stream, measured with benches/overhead.rs.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, server::router(state))
        .with_graceful_shutdown(async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return std::future::pending().await,
                };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await
}
