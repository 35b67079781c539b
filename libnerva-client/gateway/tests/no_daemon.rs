//! The gateway binary with no daemon behind it: it starts, reports itself unhealthy and
//! answers every generation with an OpenAI-shaped 503 at once (never a hang). The tests with a
//! real daemon are the Python ones in `tests/python/` (the `openai` SDK against the gateway).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Gateway {
    child: Child,
    addr: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Gateway {
    let socket = std::env::temp_dir().join(format!("nerva-gw-none-{}.sock", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_nerva-gateway"))
        .args(["--listen", "127.0.0.1:0", "--socket"])
        .arg(&socket)
        .env_remove("NERVA_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nerva-gateway");
    let mut line = String::new();
    BufReader::new(child.stderr.take().expect("stderr"))
        .read_line(&mut line)
        .expect("first line");
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .expect("listening line")
        .to_string();
    assert!(line.contains("listening on"), "{line}");
    Gateway { child, addr }
}

/// One request on a fresh connection; returns (status, body).
fn request(addr: &str, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let status: u16 = raw[9..12].parse().expect("status");
    let json = raw.split("\r\n\r\n").nth(1).unwrap_or("");
    (
        status,
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {raw}")),
    )
}

#[test]
fn without_a_daemon_every_answer_is_a_prompt_503() {
    let gw = start();
    let (status, health) = request(&gw.addr, "GET", "/health", "");
    assert_eq!(status, 503);
    assert_eq!(health["daemon"], "unreachable");

    let start = Instant::now();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let (status, err) = request(&gw.addr, "POST", "/v1/chat/completions", body);
    assert_eq!(status, 503);
    assert_eq!(err["error"]["type"], "service_unavailable_error");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    assert!(start.elapsed() < Duration::from_secs(5));

    let (status, err) = request(&gw.addr, "GET", "/v1/models", "");
    assert_eq!(status, 503, "{err}");
    let (status, err) = request(&gw.addr, "GET", "/nope", "");
    assert_eq!(
        (status, err["error"]["type"].as_str()),
        (404, Some("not_found_error"))
    );
}

#[test]
fn metrics_render_without_a_daemon() {
    let gw = start();
    let mut s = TcpStream::connect(&gw.addr).expect("connect");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.contains("\nnerva_daemon_up 0\n"), "{raw}");
    assert!(
        raw.contains("\nnerva_gateway_daemon_connected 0\n"),
        "{raw}"
    );
}
