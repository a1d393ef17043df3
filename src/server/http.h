/* The HTTP layer of `dsv4 serve`, on libmicrohttpd.
 *
 * Why libmicrohttpd: it is in Debian (libmicrohttpd-dev), it is a plain C library with a small API, it parses
 * HTTP/1.1 (keep-alive, chunked transfer, Expect: 100-continue) so we write no parser, and its
 * thread-per-connection mode fits the engine's design: each connection's thread may block in our handler — on
 * the engine's condition variable, with a timeout to look at its socket — and a streamed response is a
 * content-reader callback that blocks until the next tokens exist, which gives server-sent events with no
 * suspend/resume bookkeeping. The number of connections is bounded (--max-connections); each costs a thread,
 * which is cheap next to a stream's model state. (libevent's evhttp would need a callback state machine per
 * stream, h2o a much larger dependency.)
 *
 * Routes: GET / (the chat page), GET /health, GET /metrics, GET /v1/models, POST /v1/chat/completions,
 * POST /v1/completions, POST /v1/messages. Every route but /health needs the API key when one is set
 * (Authorization: Bearer KEY or x-api-key: KEY, compared in constant time). Errors are JSON in the route's API
 * shape (Anthropic's on /v1/messages, OpenAI's elsewhere). */
#ifndef DSV4_SERVER_HTTP_H
#define DSV4_SERVER_HTTP_H
#include "dsv4.h"
#include "server/server.h"

typedef struct server_http server_http;

typedef struct {
    const char *host;            /* an IPv4 or IPv6 address, or "localhost" */
    int port;                    /* 0: any free port */
    int max_connections;
} server_http_opts;

/* Bind and start serving; *port_out is the port bound. */
int  server_http_start(server_ctx *srv, const server_http_opts *o, server_http **out, int *port_out, dsv4_error *err);
/* Stop accepting new connections (in-flight requests go on). */
void server_http_quiesce(server_http *h);
/* Close everything and join the connection threads (call after the engine was stopped, so no handler waits
 * for tokens that will never come). */
void server_http_stop(server_http *h);

/* Constant-time comparison of a presented key with the expected one: 1 when equal. */
int  server_key_equal(const char *given, const char *expected);
#endif
