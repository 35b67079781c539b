//! Gateway overhead over the client library, on the same daemon and model (run by hand; the
//! figures go to BENCHMARKS.md).
//!
//! ```sh
//! target/release/nervad serve --socket /tmp/b.sock &
//! target/release/nerva-gateway --socket /tmp/b.sock --listen 127.0.0.1:8077 &
//! cargo bench -p nerva-gateway --bench overhead -- --socket /tmp/b.sock --gateway 127.0.0.1:8077
//! ```
//!
//! Measures, each against the same daemon:
//! - per request: p50/p99 of a 1-token generation through the client library (one `Client`,
//!   submit + wait/poll until Done) and through the gateway (`POST /v1/completions`, one
//!   keep-alive HTTP/1.1 connection, non-streaming); the difference is the gateway's added
//!   latency per request;
//! - per streamed token: the same with `max_tokens = L` streamed (SSE through the gateway);
//!   (gateway_L − client_L − (gateway_1 − client_1)) / (L − 1) is the added cost per token;
//! - requests/s with 64 concurrent streams: 64 HTTP connections each streaming requests back to
//!   back, against one client keeping 64 requests in flight.
//!
//! The HTTP client is a minimal blocking HTTP/1.1 client over `TcpStream`, so the measurement
//! is not dominated by a client library's own overhead.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nerva_client::{Client, EventRef, GenerateParams, Prompt};

struct Args {
    socket: PathBuf,
    gateway: String,
    requests: usize,
    stream_tokens: u32,
    concurrency: usize,
    seconds: f64,
}

fn parse_args() -> Args {
    let mut a = Args {
        socket: PathBuf::from("/tmp/b.sock"),
        gateway: "127.0.0.1:8077".into(),
        requests: 2000,
        stream_tokens: 64,
        concurrency: 64,
        seconds: 10.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--socket" => a.socket = PathBuf::from(val()),
            "--gateway" => a.gateway = val(),
            "--requests" => a.requests = val().parse().expect("--requests N"),
            "--stream-tokens" => a.stream_tokens = val().parse().expect("--stream-tokens N"),
            "--concurrency" => a.concurrency = val().parse().expect("--concurrency N"),
            "--seconds" => a.seconds = val().parse().expect("--seconds S"),
            "--bench" => {} // cargo bench passes this
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn params(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        stream_tokens: false,
        ..GenerateParams::default()
    }
}

/// One generation through the client library, to its Done.
fn direct_once(client: &mut Client, max_tokens: u32) -> Duration {
    let start = Instant::now();
    let tag = client
        .submit_generate(Prompt::Text("Hello there"), &params(max_tokens))
        .expect("submit");
    let mut done = false;
    while !done {
        client.wait(Some(Duration::from_secs(10))).expect("wait");
        client
            .poll_with(|e| {
                if let EventRef::Done { tag: t, .. } = e
                    && t == tag
                {
                    done = true;
                }
            })
            .expect("poll");
    }
    start.elapsed()
}

struct Http {
    reader: BufReader<TcpStream>,
    host: String,
}

impl Http {
    fn connect(addr: &str) -> Http {
        let s = TcpStream::connect(addr).expect("connect to the gateway");
        s.set_nodelay(true).expect("nodelay");
        Http {
            reader: BufReader::new(s),
            host: addr.to_string(),
        }
    }

    /// POST and read the whole response (Content-Length or chunked); returns the body.
    fn post(&mut self, path: &str, body: &str) -> Vec<u8> {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        self.reader
            .get_mut()
            .write_all(req.as_bytes())
            .expect("send");
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        assert!(line.starts_with("HTTP/1.1 200"), "gateway answered {line}");
        let mut length = None;
        let mut chunked = false;
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("header");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let lower = l.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = Some(v.trim().parse::<usize>().expect("length"));
            }
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        let mut out = Vec::new();
        if let Some(n) = length {
            out.resize(n, 0);
            self.reader.read_exact(&mut out).expect("body");
        } else if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line).expect("chunk size");
                let size = usize::from_str_radix(line.trim(), 16).expect("hex size");
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).expect("chunk");
                if size == 0 {
                    break;
                }
                out.extend_from_slice(&chunk[..size]);
            }
        } else {
            panic!("response without length");
        }
        out
    }
}

fn body(model: &str, max_tokens: u32, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","prompt":"Hello there","max_tokens":{max_tokens},"temperature":0,"ignore_eos":true,"stream":{stream}}}"#
    )
}

fn gateway_once(http: &mut Http, body: &str) -> Duration {
    let start = Instant::now();
    let out = http.post("/v1/completions", body);
    let d = start.elapsed();
    assert!(!out.is_empty());
    d
}

fn quantiles(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    (q(0.5), q(0.99), mean)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let a = parse_args();
    let mut client = Client::connect(Some(&a.socket)).expect("connect to the daemon");
    let status: serde_json::Value =
        serde_json::from_str(&client.status().expect("status")).expect("status JSON");
    let model = status["model"]["name"]
        .as_str()
        .expect("model name")
        .to_string();
    println!(
        "daemon: model {model}, backend {}, device {}",
        status["backend"], status["device"]
    );
    let mut http = Http::connect(&a.gateway);

    let warm = a.requests / 10 + 1;
    let b1 = body(&model, 1, false);
    let bl = body(&model, a.stream_tokens, true);
    for _ in 0..warm {
        direct_once(&mut client, 1);
        gateway_once(&mut http, &b1);
    }
    // Interleave the two paths so drift (thermal, other load) hits both alike.
    let (mut d1, mut g1) = (Vec::new(), Vec::new());
    for _ in 0..a.requests {
        d1.push(direct_once(&mut client, 1));
        g1.push(gateway_once(&mut http, &b1));
    }
    let n_long = (a.requests / 10).max(20);
    let (mut dl, mut gl) = (Vec::new(), Vec::new());
    for _ in 0..n_long {
        dl.push(direct_once(&mut client, a.stream_tokens));
        gl.push(gateway_once(&mut http, &bl));
    }
    let (d1p50, d1p99, d1m) = quantiles(d1);
    let (g1p50, g1p99, g1m) = quantiles(g1);
    let (dlp50, _, dlm) = quantiles(dl);
    let (glp50, _, glm) = quantiles(gl);
    println!("\n1-token requests ({} each, interleaved):", a.requests);
    println!(
        "  client library  p50 {:8.1} us  p99 {:8.1} us  mean {:8.1} us",
        us(d1p50),
        us(d1p99),
        us(d1m)
    );
    println!(
        "  gateway (HTTP)  p50 {:8.1} us  p99 {:8.1} us  mean {:8.1} us",
        us(g1p50),
        us(g1p99),
        us(g1m)
    );
    println!(
        "  added by the gateway: p50 {:.1} us, p99 {:.1} us",
        us(g1p50) - us(d1p50),
        us(g1p99) - us(d1p99)
    );
    let l = f64::from(a.stream_tokens - 1);
    println!(
        "\n{}-token streamed requests ({n_long} each): client p50 {:.1} us, gateway (SSE) p50 {:.1} us",
        a.stream_tokens,
        us(dlp50),
        us(glp50)
    );
    println!(
        "  added per streamed token: p50-based {:.2} us, mean-based {:.2} us",
        ((us(glp50) - us(dlp50)) - (us(g1p50) - us(d1p50))) / l,
        ((us(glm) - us(dlm)) - (us(g1m) - us(d1m))) / l
    );

    // Throughput with `concurrency` streams in flight.
    let window = Duration::from_secs_f64(a.seconds);
    let stream_body = body(&model, 16, true);
    let start = Instant::now();
    let handles: Vec<_> = (0..a.concurrency)
        .map(|_| {
            let addr = a.gateway.clone();
            let b = stream_body.clone();
            std::thread::spawn(move || {
                let mut h = Http::connect(&addr);
                let mut n = 0u64;
                while start.elapsed() < window {
                    h.post("/v1/completions", &b);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let gw_done: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    let gw_rps = gw_done as f64 / start.elapsed().as_secs_f64();

    let p = params(16);
    let start = Instant::now();
    let mut in_flight = 0usize;
    let mut done = 0u64;
    while start.elapsed() < window || in_flight > 0 {
        while in_flight < a.concurrency && start.elapsed() < window {
            client
                .submit_generate(Prompt::Text("Hello there"), &p)
                .expect("submit");
            in_flight += 1;
        }
        client.wait(Some(Duration::from_secs(10))).expect("wait");
        client
            .poll_with(|e| {
                if let EventRef::Done { .. } = e {
                    in_flight -= 1;
                    done += 1;
                }
            })
            .expect("poll");
    }
    let direct_rps = done as f64 / start.elapsed().as_secs_f64();
    println!(
        "\n{} concurrent 16-token streams for {:.0} s: client library {:.1} req/s, gateway {:.1} req/s ({:.1}%)",
        a.concurrency,
        a.seconds,
        direct_rps,
        gw_rps,
        100.0 * gw_rps / direct_rps
    );
}
