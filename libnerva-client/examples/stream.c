/*
 * stream.c: stream one generation from nervad to stdout through libnerva-client's C API.
 *
 *   usage: stream [SOCKET [PROMPT [MAX_TOKENS]]]
 *
 * SOCKET: the daemon's socket; empty or absent means the library's default ($NERVA_SOCKET, else
 * $XDG_RUNTIME_DIR/nerva/nervad.sock, else /run/nerva/nervad.sock).
 *
 * The generated text goes to stdout as it arrives; the finish reason and the request's timings
 * go to stderr. Exit status: 0 when the generation finished (stop or length), 1 otherwise.
 *
 * Build against an installed library:
 *   cc -std=c99 stream.c $(pkg-config --cflags --libs nerva-client) -o stream
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nerva.h"

enum { EVENT_BATCH = 32, WAIT_MS = 10000 };

static const char *finish_reason_name(nerva_finish_reason reason) {
    switch (reason) {
    case NERVA_FINISH_STOP: return "stop";
    case NERVA_FINISH_LENGTH: return "length";
    case NERVA_FINISH_CONTEXT_LENGTH: return "context length";
    case NERVA_FINISH_CANCELLED: return "cancelled";
    case NERVA_FINISH_ERROR: return "error";
    case NERVA_FINISH_SHUTDOWN: return "shutdown";
    default: return "unknown";
    }
}

static int fail(const char *what, int rc) {
    fprintf(stderr, "stream: %s: %s (%d)\n", what, nerva_strerror(rc), rc);
    return 1;
}

int main(int argc, char **argv) {
    const char *socket_path = argc > 1 && argv[1][0] != '\0' ? argv[1] : NULL;
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    long max_tokens = argc > 3 ? strtol(argv[3], NULL, 10) : 32;
    if (max_tokens < 1 || max_tokens > 100000) {
        fprintf(stderr, "stream: MAX_TOKENS must be in 1..100000\n");
        return 2;
    }

    /* Header and library must describe the same ABI. */
    if (nerva_abi_version() != NERVA_ABI_VERSION) {
        fprintf(stderr, "stream: header ABI %u, library ABI %u (%s)\n",
                (unsigned)NERVA_ABI_VERSION, (unsigned)nerva_abi_version(),
                nerva_version_string());
        return 1;
    }

    nerva_client *client = NULL;
    int rc = nerva_client_connect(socket_path, &client);
    if (rc != NERVA_OK) {
        return fail("connect", rc);
    }

    nerva_generate_params params = nerva_generate_default_params();
    params.max_tokens = (uint32_t)max_tokens;
    params.temperature = 0.0f; /* greedy: the same prompt always streams the same text */

    uint64_t tag = 0;
    rc = nerva_client_submit_text(client, prompt, strlen(prompt), &params, &tag);
    if (rc != NERVA_OK) {
        nerva_client_close(client);
        return fail("submit", rc);
    }

    nerva_event events[EVENT_BATCH];
    int finished = 0;
    int exit_code = 1;
    while (!finished) {
        rc = nerva_client_wait(client, WAIT_MS);
        if (rc != NERVA_OK) {
            nerva_client_close(client);
            return fail("wait", rc);
        }
        size_t n = 0;
        rc = nerva_client_poll(client, events, EVENT_BATCH, &n);
        if (rc != NERVA_OK) {
            nerva_client_close(client);
            return fail("poll", rc);
        }
        for (size_t i = 0; i < n; i++) {
            const nerva_event *ev = &events[i];
            if (ev->tag != tag) {
                continue; /* not ours: this client submitted one request only */
            }
            switch (ev->kind) {
            case NERVA_EVENT_TEXT:
                /* Text pieces never split a UTF-8 code point; the pointer lives until the next
                 * poll, so write it out now. */
                fwrite(ev->text, 1, ev->text_len, stdout);
                fflush(stdout);
                break;
            case NERVA_EVENT_DONE:
                fprintf(stderr,
                        "\nfinish reason: %s; %" PRIu32 " prompt tokens, %" PRIu32
                        " generated; queue %" PRIu64 " us, first token %" PRIu64
                        " us, decode %" PRIu64 " us\n",
                        finish_reason_name(ev->finish_reason), ev->timings.prompt_tokens,
                        ev->timings.generated_tokens, ev->timings.queue_us,
                        ev->timings.first_token_us, ev->timings.decode_us);
                exit_code = ev->finish_reason == NERVA_FINISH_STOP ||
                                    ev->finish_reason == NERVA_FINISH_LENGTH
                                ? 0
                                : 1;
                finished = 1;
                break;
            case NERVA_EVENT_ERROR:
                /* An event's status is a nerva_request_status (the daemon's code), not a
                 * return code: its text comes from nerva_request_status_string. */
                fprintf(stderr, "\nstream: request failed: %s (%u): %.*s\n",
                        nerva_request_status_string(ev->status), (unsigned)ev->status,
                        (int)ev->text_len, ev->text ? ev->text : "");
                finished = 1;
                break;
            default:
                break; /* token ids and logprobs: this example only prints text */
            }
        }
    }
    printf("\n");
    nerva_client_close(client);
    return exit_code;
}
