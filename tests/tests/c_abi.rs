//! The C ABI seen from C: a program compiled against `include/nerva.h` and linked with the
//! built library reports the layout of every struct (which must equal Rust's) and the result
//! of misuse (NULL arguments, a missing daemon), which must be the documented codes. No daemon
//! is needed.

mod c_support;

use std::collections::HashMap;
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

use nerva_client::ffi::client::nerva_chat_message;
use nerva_client::ffi::event::{nerva_event, nerva_timings};
use nerva_client::ffi::params::nerva_generate_params;
use nerva_client::ffi::status::nerva_status;

const PROBE: &str = r#"
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "nerva.h"

#define SIZE(T) printf(#T " %zu %zu\n", sizeof(T), _Alignof(T))
#define FIELD(T, f) printf(#T "." #f " %zu %zu\n", offsetof(T, f), sizeof(((T *)0)->f))

int main(void) {
    SIZE(nerva_event);
    FIELD(nerva_event, tag);
    FIELD(nerva_event, kind);
    FIELD(nerva_event, sample);
    FIELD(nerva_event, status);
    FIELD(nerva_event, finish_reason);
    FIELD(nerva_event, position);
    FIELD(nerva_event, n_tokens);
    FIELD(nerva_event, n_logprobs);
    FIELD(nerva_event, tokens);
    FIELD(nerva_event, logprobs);
    FIELD(nerva_event, text);
    FIELD(nerva_event, text_len);
    FIELD(nerva_event, timings);
    SIZE(nerva_timings);
    FIELD(nerva_timings, queue_us);
    FIELD(nerva_timings, first_token_us);
    FIELD(nerva_timings, decode_us);
    FIELD(nerva_timings, inter_token_us);
    FIELD(nerva_timings, prompt_tokens);
    FIELD(nerva_timings, generated_tokens);
    SIZE(nerva_generate_params);
    FIELD(nerva_generate_params, max_tokens);
    FIELD(nerva_generate_params, temperature);
    FIELD(nerva_generate_params, top_k);
    FIELD(nerva_generate_params, top_p);
    FIELD(nerva_generate_params, min_p);
    FIELD(nerva_generate_params, repetition_penalty);
    FIELD(nerva_generate_params, presence_penalty);
    FIELD(nerva_generate_params, frequency_penalty);
    FIELD(nerva_generate_params, seed);
    FIELD(nerva_generate_params, n_samples);
    FIELD(nerva_generate_params, top_logprobs);
    FIELD(nerva_generate_params, priority);
    FIELD(nerva_generate_params, ignore_eos);
    FIELD(nerva_generate_params, stream_tokens);
    FIELD(nerva_generate_params, stream_text);
    FIELD(nerva_generate_params, stop_strings);
    FIELD(nerva_generate_params, n_stop_strings);
    FIELD(nerva_generate_params, stop_token_ids);
    FIELD(nerva_generate_params, n_stop_token_ids);
    SIZE(nerva_chat_message);
    FIELD(nerva_chat_message, role);
    FIELD(nerva_chat_message, content);

    /* Each call before the printf: argument evaluation order is unspecified in C. */
    nerva_client *client = (nerva_client *)&client; /* must be overwritten with NULL */
    int rc = nerva_client_connect(NULL, NULL);
    printf("connect_null_out %d\n", rc);
    rc = nerva_client_connect("", &client);
    printf("connect_empty_path %d %d\n", rc, client == NULL);
    client = (nerva_client *)&client;
    errno = 0;
    rc = nerva_client_connect("/nonexistent-nerva-dir/nervad.sock", &client);
    int connect_errno = errno;
    printf("connect_no_daemon %d %d %d\n", rc, client == NULL, connect_errno == ENOENT);
    size_t n = 7;
    nerva_event events[2];
    rc = nerva_client_poll(NULL, events, 2, &n);
    printf("poll_null_client %d %zu\n", rc, n);
    printf("wait_null_client %d\n", nerva_client_wait(NULL, 0));
    printf("cancel_null_client %d\n", nerva_client_cancel(NULL, 1));
    uint64_t rtt = 0, tag = 0;
    printf("nop_null_client %d\n", nerva_client_nop(NULL, &rtt));
    printf("submit_null_client %d\n", nerva_client_submit_text(NULL, "hi", 2, NULL, &tag));
    nerva_client_close(NULL);
    nerva_generate_params params = nerva_generate_default_params();
    printf("defaults %u %g %u %g %g %g %u %u %d %d %d\n", params.max_tokens,
           (double)params.temperature, params.top_k, (double)params.top_p, (double)params.min_p,
           (double)params.repetition_penalty, params.n_samples, params.top_logprobs,
           params.priority, params.stop_strings == NULL, params.stop_token_ids == NULL);
    printf("strerror_ok %s\n", nerva_strerror(NERVA_OK));
    printf("strerror_unknown %s\n", nerva_strerror(12345));
    printf("abi %u %d\n", nerva_abi_version(), nerva_abi_version() == NERVA_ABI_VERSION);
    printf("version %s\n", nerva_version_string());
    return 0;
}
"#;

fn run_probe() -> HashMap<String, String> {
    let dir = c_support::scratch_dir("c-abi");
    let source = dir.join("probe.c");
    std::fs::write(&source, PROBE).expect("write probe");
    let exe = dir.join("probe");
    let cc = c_support::c_compiler();
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .args(c_support::in_tree_flags())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        out.status.success(),
        "the probe does not build against nerva.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the probe");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(run.stdout)
        .expect("UTF-8")
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

macro_rules! check_size {
    ($c:expr, $t:ident) => {
        assert_eq!(
            $c[stringify!($t)],
            format!("{} {}", size_of::<$t>(), align_of::<$t>()),
            "size/alignment of {} differ between C and Rust",
            stringify!($t)
        );
    };
}

macro_rules! check_field {
    ($c:expr, $t:ident, $f:ident) => {{
        let key = concat!(stringify!($t), ".", stringify!($f));
        let rust_size = {
            let value = std::mem::MaybeUninit::<$t>::uninit();
            // SAFETY: only the field's address is taken (addr_of!), nothing is read.
            let field = unsafe { std::ptr::addr_of!((*value.as_ptr()).$f) };
            size_of_pointee(field)
        };
        assert_eq!(
            $c[key],
            format!("{} {}", offset_of!($t, $f), rust_size),
            "offset/size of {key} differ between C and Rust"
        );
    }};
}

fn size_of_pointee<T>(_: *const T) -> usize {
    size_of::<T>()
}

#[test]
fn c_sees_the_rust_layout_and_the_documented_misuse_codes() {
    let c = run_probe();

    check_size!(c, nerva_event);
    check_field!(c, nerva_event, tag);
    check_field!(c, nerva_event, kind);
    check_field!(c, nerva_event, sample);
    check_field!(c, nerva_event, status);
    check_field!(c, nerva_event, finish_reason);
    check_field!(c, nerva_event, position);
    check_field!(c, nerva_event, n_tokens);
    check_field!(c, nerva_event, n_logprobs);
    check_field!(c, nerva_event, tokens);
    check_field!(c, nerva_event, logprobs);
    check_field!(c, nerva_event, text);
    check_field!(c, nerva_event, text_len);
    check_field!(c, nerva_event, timings);
    check_size!(c, nerva_timings);
    check_field!(c, nerva_timings, queue_us);
    check_field!(c, nerva_timings, first_token_us);
    check_field!(c, nerva_timings, decode_us);
    check_field!(c, nerva_timings, inter_token_us);
    check_field!(c, nerva_timings, prompt_tokens);
    check_field!(c, nerva_timings, generated_tokens);
    check_size!(c, nerva_generate_params);
    check_field!(c, nerva_generate_params, max_tokens);
    check_field!(c, nerva_generate_params, temperature);
    check_field!(c, nerva_generate_params, top_k);
    check_field!(c, nerva_generate_params, top_p);
    check_field!(c, nerva_generate_params, min_p);
    check_field!(c, nerva_generate_params, repetition_penalty);
    check_field!(c, nerva_generate_params, presence_penalty);
    check_field!(c, nerva_generate_params, frequency_penalty);
    check_field!(c, nerva_generate_params, seed);
    check_field!(c, nerva_generate_params, n_samples);
    check_field!(c, nerva_generate_params, top_logprobs);
    check_field!(c, nerva_generate_params, priority);
    check_field!(c, nerva_generate_params, ignore_eos);
    check_field!(c, nerva_generate_params, stream_tokens);
    check_field!(c, nerva_generate_params, stream_text);
    check_field!(c, nerva_generate_params, stop_strings);
    check_field!(c, nerva_generate_params, n_stop_strings);
    check_field!(c, nerva_generate_params, stop_token_ids);
    check_field!(c, nerva_generate_params, n_stop_token_ids);
    check_size!(c, nerva_chat_message);
    check_field!(c, nerva_chat_message, role);
    check_field!(c, nerva_chat_message, content);

    let invalid = nerva_status::NERVA_E_INVALID_ARGUMENT.code();
    let no_daemon = nerva_status::NERVA_E_NO_DAEMON.code();
    assert_eq!(c["connect_null_out"], invalid.to_string());
    assert_eq!(
        c["connect_empty_path"],
        format!("{invalid} 1"),
        "*out must be NULL"
    );
    assert_eq!(
        c["connect_no_daemon"],
        format!("{no_daemon} 1 1"),
        "*out must be NULL and errno ENOENT"
    );
    assert_eq!(
        c["poll_null_client"],
        format!("{invalid} 7"),
        "n_out untouched without client"
    );
    for call in ["wait", "cancel", "nop", "submit"] {
        assert_eq!(
            c[&format!("{call}_null_client")],
            invalid.to_string(),
            "{call}"
        );
    }
    let d = nerva_client::GenerateParams::default();
    assert_eq!(
        c["defaults"],
        format!(
            "{} {} {} {} {} {} {} {} {} 1 1",
            d.max_tokens,
            d.temperature,
            d.top_k,
            d.top_p,
            d.min_p,
            d.repetition_penalty,
            d.n_samples,
            d.top_logprobs,
            d.priority
        )
    );
    assert_eq!(c["strerror_ok"], "success");
    assert_eq!(c["strerror_unknown"], "unknown nerva status code");
    assert_eq!(c["abi"], "1 1");
    // The workspace shares one version, so this crate's version is the library's.
    assert_eq!(
        c["version"],
        format!(
            "nerva-client {} (c-abi 1, wire {})",
            env!("CARGO_PKG_VERSION"),
            nerva_rings::handshake::ABI_VERSION
        )
    );
}
