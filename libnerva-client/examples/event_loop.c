/*
 * event_loop.c: many nerva clients in one thread and one epoll loop, the way an existing
 * server embeds the client next to its own sockets.
 *
 *   cc event_loop.c $(pkg-config --cflags --libs nerva-client) -o event_loop
 *   ./event_loop [SOCKET] [CLIENTS] [REQUESTS_PER_CLIENT] [MAX_TOKENS]
 *
 * Each client's readiness descriptor (nerva_client_fd) goes into one epoll set. When one is
 * readable, the loop polls that client until it has nothing more (the descriptor is then
 * re-armed by the library), so no event is ever missed and nothing spins. Every request
 * carries a pointer to its own bookkeeping in `user_data`, which every event echoes back, so
 * the loop never maps tags to requests itself. Requests are submitted up front; one that does
 * not fit the client's rings now (NERVA_E_RING_FULL) is retried after that client's next
 * poll. Prints one line per client and a summary; exits 0 when every request finished.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "nerva.h"

#define MAX_CLIENTS 64
#define MAX_REQUESTS 64
#define EVENTS_PER_POLL 32

struct request {
    int client;      /* index of its client */
    int index;       /* index within the client */
    int submitted;   /* 1 once the daemon has it */
    int done;        /* 1 once its DONE (or ERROR) arrived */
    unsigned tokens; /* token ids received */
    size_t text_bytes;
};

struct client {
    nerva_client *handle;
    int fd;
    int next_to_submit;
    struct request requests[MAX_REQUESTS];
};

static struct client clients[MAX_CLIENTS];

static int check(int rc, const char *what) {
    if (rc != NERVA_OK) {
        fprintf(stderr, "event_loop: %s: %s (%d)\n", what, nerva_strerror(rc), rc);
    }
    return rc;
}

/* Submit this client's remaining requests until its rings are full. Returns -1 on error. */
static int submit_more(struct client *c, int n_requests, unsigned max_tokens) {
    while (c->next_to_submit < n_requests) {
        struct request *r = &c->requests[c->next_to_submit];
        char prompt[64];
        int len = snprintf(prompt, sizeof prompt, "Client %d asks question %d:", r->client,
                           r->index);
        nerva_generate_params params = nerva_generate_default_params();
        params.max_tokens = max_tokens;
        params.temperature = 0.8f;
        params.seed = (uint64_t)(r->client * 1000 + r->index);
        params.ignore_eos = true;
        params.user_data = (uint64_t)(uintptr_t)r; /* echoed on every event */
        uint64_t tag = 0;
        int rc = nerva_client_submit_text(c->handle, prompt, (size_t)len, &params, &tag);
        if (rc == NERVA_E_RING_FULL) {
            return 0; /* retried after this client's next poll */
        }
        if (check(rc, "submit") != NERVA_OK) {
            return -1;
        }
        r->submitted = 1;
        c->next_to_submit++;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *socket_path = argc > 1 ? argv[1] : NULL;
    int n_clients = argc > 2 ? atoi(argv[2]) : 8;
    int n_requests = argc > 3 ? atoi(argv[3]) : 16;
    unsigned max_tokens = argc > 4 ? (unsigned)atoi(argv[4]) : 8;
    if (n_clients < 1 || n_clients > MAX_CLIENTS || n_requests < 1 ||
        n_requests > MAX_REQUESTS || max_tokens < 1) {
        fprintf(stderr, "usage: event_loop [SOCKET] [CLIENTS 1..%d] [REQUESTS 1..%d] [TOKENS]\n",
                MAX_CLIENTS, MAX_REQUESTS);
        return 2;
    }

    int epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) {
        perror("event_loop: epoll_create1");
        return 1;
    }
    for (int i = 0; i < n_clients; i++) {
        struct client *c = &clients[i];
        memset(c, 0, sizeof *c);
        if (check(nerva_client_connect(socket_path, &c->handle), "connect") != NERVA_OK) {
            return 1;
        }
        if (check(nerva_client_fd(c->handle, &c->fd), "fd") != NERVA_OK) {
            return 1;
        }
        struct epoll_event ev;
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN;
        ev.data.ptr = c;
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
            perror("event_loop: epoll_ctl");
            return 1;
        }
        for (int j = 0; j < n_requests; j++) {
            c->requests[j].client = i;
            c->requests[j].index = j;
        }
        if (submit_more(c, n_requests, max_tokens) != 0) {
            return 1;
        }
    }

    int total = n_clients * n_requests;
    int finished = 0;
    unsigned long wakeups = 0;
    while (finished < total) {
        struct epoll_event ready[MAX_CLIENTS];
        /* The timeout only guards against a bug: readiness alone drives this loop. */
        int n = epoll_wait(epfd, ready, MAX_CLIENTS, 30000);
        if (n < 0) {
            perror("event_loop: epoll_wait");
            return 1;
        }
        if (n == 0) {
            fprintf(stderr, "event_loop: no readiness for 30 s with %d of %d done\n", finished,
                    total);
            return 1;
        }
        for (int k = 0; k < n; k++) {
            struct client *c = ready[k].data.ptr;
            wakeups++;
            for (;;) { /* poll until empty: that re-arms the descriptor */
                nerva_event events[EVENTS_PER_POLL];
                size_t got = 0;
                if (check(nerva_client_poll(c->handle, events, EVENTS_PER_POLL, &got), "poll") !=
                    NERVA_OK) {
                    return 1;
                }
                if (got == 0) {
                    break;
                }
                for (size_t e = 0; e < got; e++) {
                    const nerva_event *ev = &events[e];
                    struct request *r = (struct request *)(uintptr_t)ev->user_data;
                    if (ev->kind == NERVA_EVENT_SHUTDOWN) {
                        fprintf(stderr, "event_loop: the daemon is shutting down\n");
                        return 1;
                    }
                    if (r == NULL || r < c->requests || r >= c->requests + n_requests) {
                        fprintf(stderr, "event_loop: event with foreign user_data\n");
                        return 1;
                    }
                    switch (ev->kind) {
                    case NERVA_EVENT_TOKENS:
                        r->tokens += ev->n_tokens;
                        break;
                    case NERVA_EVENT_TEXT:
                        r->text_bytes += ev->text_len;
                        break;
                    case NERVA_EVENT_DONE:
                    case NERVA_EVENT_ERROR:
                        if (ev->kind == NERVA_EVENT_ERROR) {
                            fprintf(stderr, "event_loop: request failed: %s: %.*s\n",
                                    nerva_request_status_string(ev->status), (int)ev->text_len,
                                    ev->text);
                            return 1;
                        }
                        if (r->done) {
                            fprintf(stderr, "event_loop: two DONE events for one request\n");
                            return 1;
                        }
                        r->done = 1;
                        finished++;
                        break;
                    default:
                        break;
                    }
                }
            }
            if (submit_more(c, n_requests, max_tokens) != 0) {
                return 1;
            }
        }
    }

    int status = 0;
    for (int i = 0; i < n_clients; i++) {
        unsigned tokens = 0;
        for (int j = 0; j < n_requests; j++) {
            tokens += clients[i].requests[j].tokens;
            if (clients[i].requests[j].tokens != max_tokens) {
                fprintf(stderr, "event_loop: client %d request %d got %u of %u tokens\n", i, j,
                        clients[i].requests[j].tokens, max_tokens);
                status = 1;
            }
        }
        printf("client %d: %d requests, %u tokens\n", i, n_requests, tokens);
        nerva_client_close(clients[i].handle);
    }
    printf("event_loop: %d of %d requests done, %lu wakeups\n", finished, total, wakeups);
    return status;
}
