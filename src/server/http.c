/* libmicrohttpd glue: routing, authentication, bodies, JSON and SSE responses. See http.h. */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server/http.h"
#include "server/api.h"
#include "server/session.h"
#include "text/strbuf.h"
#include "util/error.h"
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

extern const char server_chat_page[];
extern const unsigned int server_chat_page_len;

struct server_http {
    struct MHD_Daemon *d;
    server_ctx *srv;
};

typedef enum {
    ROUTE_NONE = 0, ROUTE_PAGE, ROUTE_HEALTH, ROUTE_METRICS, ROUTE_MODELS, ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_MESSAGES,
} route;

static const struct {
    const char *path, *method, *name;
    route r;
} ROUTES[] = {
    {"/", "GET", "page", ROUTE_PAGE},
    {"/health", "GET", "health", ROUTE_HEALTH},
    {"/metrics", "GET", "metrics", ROUTE_METRICS},
    {"/v1/models", "GET", "models", ROUTE_MODELS},
    {"/v1/chat/completions", "POST", "chat_completions", ROUTE_CHAT},
    {"/v1/completions", "POST", "completions", ROUTE_COMPLETIONS},
    {"/v1/messages", "POST", "messages", ROUTE_MESSAGES},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

/* One request on a connection: what the handler accumulates between its calls. */
typedef struct {
    int route_i;                 /* index in ROUTES, -1: unknown path */
    int method_ok;
    dsv4_strbuf body;
    int too_big;
} conn_req;

/* A streamed response: the reader callback's state (owned by the MHD response, freed by stream_free). */
typedef struct {
    server_ctx *srv;
    server_session *s;
    server_api api;
    dsv4_strbuf pending;         /* event bytes not yet handed to MHD */
    size_t sent;
    int fd;
    int gone;
    const char *endpoint;
} stream_state;

int server_key_equal(const char *given, const char *expected) {
    const size_t lg = strlen(given), le = strlen(expected);
    /* every byte of the expected key is looked at whatever the input, so timing says nothing about it */
    unsigned char diff = (unsigned char)(lg != le);
    for (size_t i = 0; i < le; i++) diff |= (unsigned char)(expected[i] ^ (i < lg ? given[i] : 0));
    return diff == 0;
}

/* The peer closed its end (or the socket failed): a disconnect cancels the stream. */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLIN) {
        char c;
        const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return 0;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ---- responses ------------------------------------------------------------------------------------------- */

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type, const char *body, size_t n,
                                 int copy) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 405) MHD_add_response_header(r, "Allow", "GET, POST");
    const enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

/* Steals v. */
static enum MHD_Result send_json(struct MHD_Connection *c, int status, json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s) return send_text(c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}", 37, 0);
    enum MHD_Result rc = send_text(c, status, "application/json", s, strlen(s), 1);
    free(s);
    return rc;
}

static enum MHD_Result send_error(server_ctx *srv, struct MHD_Connection *c, int route_i, const server_error *e) {
    const int anthropic = route_i >= 0 && ROUTES[route_i].r == ROUTE_MESSAGES;
    server_metrics_request(srv->metrics, route_i >= 0 ? ROUTES[route_i].name : "other", e->status);
    return send_json(c, e->status, anthropic ? anthropic_error_body(e) : openai_error_body(e));
}

/* ---- streaming ---------------------------------------------------------------------------------------------- */

static void api_stream(stream_state *st) {
    if (st->api == SERVER_API_CHAT) openai_chat_stream(st->s, &st->pending);
    else if (st->api == SERVER_API_COMPLETIONS) openai_completion_stream(st->s, &st->pending);
    else anthropic_message_stream(st->s, &st->pending);
}

static void record_latency(server_ctx *srv, const server_session *s) {
    const double now = server_now_s();
    const int n = server_session_completion_tokens(s);
    const double ttft = s->t_first > 0 ? s->t_first - s->t_start : -1;
    const double tpot = s->t_first > 0 && n > 1 ? (now - s->t_first) / (n - 1) : -1;
    server_metrics_latency(srv->metrics, ttft, tpot, now - s->t_start);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_state *st = cls;
    (void)pos;
    for (;;) {
        if (st->pending.len > st->sent) {
            size_t n = st->pending.len - st->sent;
            if (n > max) n = max;
            memcpy(buf, st->pending.data + st->sent, n);
            st->sent += n;
            if (st->sent == st->pending.len) { dsv4_sb_clear(&st->pending); st->sent = 0; }
            return (ssize_t)n;
        }
        if (st->s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (client_gone(st->fd)) {
            st->gone = 1;
            server_session_cancel(st->s);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        server_session_poll(st->s, st->srv->poll_ms);
        if (server_session_failed(st->s) && !st->s->finished) {
            /* the engine could not run this request: say so in the stream, then end it */
            server_error e;
            server_fail(&e, 500, "server_error", "", "the engine failed while generating this response");
            sse_event(&st->pending, st->api == SERVER_API_MESSAGES ? "error" : NULL,
                      st->api == SERVER_API_MESSAGES ? anthropic_error_body(&e) : openai_error_body(&e));
            if (st->api != SERVER_API_MESSAGES) dsv4_sb_puts(&st->pending, "data: [DONE]\n\n");
            st->s->finished = 1;
            continue;
        }
        api_stream(st);
    }
}

static void stream_free(void *cls) {
    stream_state *st = cls;
    if (st->gone || !st->s->finished) server_metrics_disconnect(st->srv->metrics);
    record_latency(st->srv, st->s);
    server_session_free(st->s);
    dsv4_sb_free(&st->pending);
    free(st);
}

static enum MHD_Result start_stream(server_ctx *srv, struct MHD_Connection *c, int route_i, server_session *s, server_api api) {
    stream_state *st = calloc(1, sizeof *st);
    if (!st) { server_session_free(s); return MHD_NO; }
    st->srv = srv;
    st->s = s;
    st->api = api;
    st->fd = conn_fd(c);
    st->endpoint = ROUTES[route_i].name;
    dsv4_sb_init(&st->pending);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    if (!r) { stream_free(st); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    server_metrics_request(srv->metrics, st->endpoint, 200);
    const enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

/* ---- generation routes ----------------------------------------------------------------------------------------- */

static enum MHD_Result generate(server_ctx *srv, struct MHD_Connection *c, int route_i, const conn_req *cr) {
    const route rt = ROUTES[route_i].r;
    const server_api api = rt == ROUTE_CHAT ? SERVER_API_CHAT : rt == ROUTE_COMPLETIONS ? SERVER_API_COMPLETIONS : SERVER_API_MESSAGES;
    server_error e;
    server_session *s = NULL;
    if (server_session_start(srv, api, cr->body.data ? cr->body.data : "", cr->body.len, &s, &e))
        return send_error(srv, c, route_i, &e);
    if (s->req.stream) return start_stream(srv, c, route_i, s, api);
    const int fd = conn_fd(c);
    while (!server_session_poll(s, srv->poll_ms)) {
        if (client_gone(fd)) {
            server_session_cancel(s);
            server_metrics_disconnect(srv->metrics);
            server_metrics_request(srv->metrics, ROUTES[route_i].name, 499);
            server_session_free(s);
            return MHD_NO;   /* close the connection: nobody is there */
        }
    }
    record_latency(srv, s);
    if (server_session_failed(s)) {
        server_session_free(s);
        server_fail(&e, 500, "server_error", "", "the engine failed while generating this response");
        return send_error(srv, c, route_i, &e);
    }
    json_t *body = api == SERVER_API_CHAT ? openai_chat_body(s)
                 : api == SERVER_API_COMPLETIONS ? openai_completion_body(s)
                                                 : anthropic_message_body(s);
    server_session_free(s);
    server_metrics_request(srv->metrics, ROUTES[route_i].name, 200);
    return send_json(c, 200, body);
}

/* ---- the handler ------------------------------------------------------------------------------------------------- */

static int authorized(server_ctx *srv, struct MHD_Connection *c) {
    if (!srv->api_key) return 1;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (auth && !strncasecmp(auth, "Bearer ", 7)) {
        const char *k = auth + 7;
        while (*k == ' ') k++;
        if (server_key_equal(k, srv->api_key)) return 1;
    }
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return x && server_key_equal(x, srv->api_key);
}

static enum MHD_Result dispatch(server_ctx *srv, struct MHD_Connection *c, conn_req *cr) {
    server_error e;
    const int ri = cr->route_i;
    if (ri < 0) {
        server_fail(&e, 404, "not_found_error", "", "no such endpoint");
        return send_error(srv, c, ri, &e);
    }
    if (!cr->method_ok) {
        server_fail(&e, 405, "invalid_request_error", "", "%s needs %s", ROUTES[ri].path, ROUTES[ri].method);
        return send_error(srv, c, ri, &e);
    }
    if (ROUTES[ri].r != ROUTE_HEALTH && !authorized(srv, c)) {
        server_fail(&e, 401, "authentication_error", "", "a valid API key is required (Authorization: Bearer KEY or x-api-key)");
        return send_error(srv, c, ri, &e);
    }
    if (cr->too_big) {
        server_fail(&e, 413, "invalid_request_error", "", "the request body exceeds %zu bytes", srv->max_body);
        return send_error(srv, c, ri, &e);
    }
    switch (ROUTES[ri].r) {
    case ROUTE_HEALTH:
        server_metrics_request(srv->metrics, "health", 200);
        return send_text(c, 200, "application/json", "{\"status\":\"ok\"}", 15, 0);
    case ROUTE_PAGE:
        server_metrics_request(srv->metrics, "page", 200);
        return send_text(c, 200, "text/html; charset=utf-8", server_chat_page, server_chat_page_len, 0);
    case ROUTE_MODELS:
        server_metrics_request(srv->metrics, "models", 200);
        return send_json(c, 200, openai_models_body(srv));
    case ROUTE_METRICS: {
        server_metrics_request(srv->metrics, "metrics", 200);
        server_engine_stats st;
        server_engine_get_stats(srv->engine, &st);
        char *text = server_metrics_render(srv->metrics, &st);
        if (!text) return MHD_NO;
        enum MHD_Result rc = send_text(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text), 1);
        free(text);
        return rc;
    }
    default: return generate(srv, c, ri, cr);
    }
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    server_ctx *srv = cls;
    (void)version;
    conn_req *cr = *con_cls;
    if (!cr) {
        cr = calloc(1, sizeof *cr);
        if (!cr) return MHD_NO;
        dsv4_sb_init(&cr->body);
        cr->route_i = -1;
        for (size_t i = 0; i < N_ROUTES; i++)
            if (!strcmp(url, ROUTES[i].path)) {
                cr->route_i = (int)i;
                cr->method_ok = !strcmp(method, ROUTES[i].method);
            }
        *con_cls = cr;
        /* A body over the limit is read and dropped, then answered 413, so that the client (which is still
         * sending) reads the answer instead of a broken pipe. An absurd declared length is refused at once. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) / 64 > srv->max_body) {
            cr->too_big = 1;
            server_error e;
            server_fail(&e, 413, "invalid_request_error", "", "the request body exceeds %zu bytes", srv->max_body);
            return send_error(srv, c, cr->route_i, &e);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cr->too_big && cr->body.len + *upload_size > srv->max_body) {
            cr->too_big = 1;
            dsv4_sb_free(&cr->body);
            dsv4_sb_init(&cr->body);
        }
        if (!cr->too_big) dsv4_sb_append(&cr->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cr->body.oom) return MHD_NO;
    return dispatch(srv, c, cr);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_req *cr = *con_cls;
    if (!cr) return;
    dsv4_sb_free(&cr->body);
    free(cr);
    *con_cls = NULL;
}

/* ---- lifetime ----------------------------------------------------------------------------------------------------- */

int server_http_start(server_ctx *srv, const server_http_opts *o, server_http **out, int *port_out, dsv4_error *err) {
    *out = NULL;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    const char *host = !strcmp(o->host, "localhost") ? "127.0.0.1" : o->host;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)o->port);
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)o->port);
        flags |= MHD_USE_IPv6;
    } else {
        return dsv4_fail(err, DSV4_E_ARG, "--host must be an IPv4 or IPv6 address or localhost, got '%s'", o->host);
    }
    server_http *h = calloc(1, sizeof *h);
    if (!h) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    h->srv = srv;
    h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, handler, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)o->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return dsv4_fail(err, DSV4_E_IO, "cannot listen on %s port %d (%s)", o->host, o->port, strerror(errno));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = di ? di->port : o->port;
    *out = h;
    return 0;
}

void server_http_quiesce(server_http *h) {
    if (h && h->d) {
        const MHD_socket s = MHD_quiesce_daemon(h->d);
        if (s != MHD_INVALID_SOCKET) close(s);
    }
}

void server_http_stop(server_http *h) {
    if (!h) return;
    if (h->d) MHD_stop_daemon(h->d);
    free(h);
}
