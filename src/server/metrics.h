/* Counters and histograms for GET /metrics (Prometheus text exposition format 0.0.4): requests by endpoint
 * and status, time to first token and time per output token histograms, plus the engine's gauges and counters
 * (queue depth, running streams, KV bytes, tokens, prefix-cache hits and misses) read at render time.
 * Thread-safe: HTTP threads record, any thread renders. Owned by the server context; no global state. */
#ifndef DSV4_SERVER_METRICS_H
#define DSV4_SERVER_METRICS_H
#include "server/engine.h"
#include <pthread.h>
#include <stdint.h>

#define SERVER_METRICS_BUCKETS 14
#define SERVER_METRICS_SERIES 64

typedef struct {
    int64_t count[SERVER_METRICS_BUCKETS + 1];   /* per bucket (not cumulative); the last is +Inf */
    double sum;
    int64_t n;
} server_histogram;

typedef struct {
    pthread_mutex_t mu;
    struct { char endpoint[32]; int status; int64_t n; } series[SERVER_METRICS_SERIES];
    int n_series;
    server_histogram ttft, tpot, e2e;
    int64_t disconnects;
} server_metrics;

void server_metrics_init(server_metrics *m);
void server_metrics_destroy(server_metrics *m);
void server_metrics_request(server_metrics *m, const char *endpoint, int status);
void server_metrics_latency(server_metrics *m, double ttft_s, double tpot_s, double e2e_s);
void server_metrics_disconnect(server_metrics *m);
/* The exposition text (heap string the caller frees; NULL when out of memory). */
char *server_metrics_render(server_metrics *m, const server_engine_stats *st);
#endif
