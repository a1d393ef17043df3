/* /metrics: see metrics.h. */
#include "server/metrics.h"
#include "text/strbuf.h"
#include <stdio.h>
#include <string.h>

/* seconds; one set for all three histograms (TTFT and per-token times on CPU span ms to seconds) */
static const double BUCKETS[SERVER_METRICS_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                       0.25, 0.5, 1, 2.5, 5, 10, 30};

void server_metrics_init(server_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void server_metrics_destroy(server_metrics *m) { pthread_mutex_destroy(&m->mu); }

void server_metrics_request(server_metrics *m, const char *endpoint, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_series && (m->series[i].status != status || strcmp(m->series[i].endpoint, endpoint))) i++;
    if (i == m->n_series && i < SERVER_METRICS_SERIES) {
        snprintf(m->series[i].endpoint, sizeof m->series[i].endpoint, "%s", endpoint);
        m->series[i].status = status;
        m->n_series++;
    }
    if (i < m->n_series) m->series[i].n++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(server_histogram *h, double v) {
    int b = 0;
    while (b < SERVER_METRICS_BUCKETS && v > BUCKETS[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->n++;
}

void server_metrics_latency(server_metrics *m, double ttft_s, double tpot_s, double e2e_s) {
    pthread_mutex_lock(&m->mu);
    if (ttft_s >= 0) observe(&m->ttft, ttft_s);
    if (tpot_s >= 0) observe(&m->tpot, tpot_s);
    if (e2e_s >= 0) observe(&m->e2e, e2e_s);
    pthread_mutex_unlock(&m->mu);
}

void server_metrics_disconnect(server_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->disconnects++;
    pthread_mutex_unlock(&m->mu);
}

static void histogram(dsv4_strbuf *b, const char *name, const char *help, const server_histogram *h) {
    dsv4_sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t cum = 0;
    for (int i = 0; i < SERVER_METRICS_BUCKETS; i++) {
        cum += h->count[i];
        dsv4_sb_printf(b, "%s_bucket{le=\"%g\"} %lld\n", name, BUCKETS[i], (long long)cum);
    }
    cum += h->count[SERVER_METRICS_BUCKETS];
    dsv4_sb_printf(b, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.9g\n%s_count %lld\n", name, (long long)cum, name, h->sum, name,
                   (long long)h->n);
}

static void scalar(dsv4_strbuf *b, const char *name, const char *type, const char *help, double v) {
    dsv4_sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *server_metrics_render(server_metrics *m, const server_engine_stats *st) {
    dsv4_strbuf b;
    dsv4_sb_init(&b);
    pthread_mutex_lock(&m->mu);
    dsv4_sb_puts(&b, "# HELP dsv4_requests_total HTTP requests answered, by endpoint and status code.\n"
                     "# TYPE dsv4_requests_total counter\n");
    for (int i = 0; i < m->n_series; i++)
        dsv4_sb_printf(&b, "dsv4_requests_total{endpoint=\"%s\",status=\"%d\"} %lld\n", m->series[i].endpoint,
                       m->series[i].status, (long long)m->series[i].n);
    histogram(&b, "dsv4_time_to_first_token_seconds", "Time from request arrival to the first generated token.", &m->ttft);
    histogram(&b, "dsv4_time_per_output_token_seconds", "Mean time between output tokens of a request.", &m->tpot);
    histogram(&b, "dsv4_request_duration_seconds", "Time from request arrival to its last token.", &m->e2e);
    scalar(&b, "dsv4_client_disconnects_total", "counter", "Streams cancelled because the client went away.", (double)m->disconnects);
    pthread_mutex_unlock(&m->mu);
    scalar(&b, "dsv4_queue_depth", "gauge", "Requests waiting for a slot.", st->waiting);
    scalar(&b, "dsv4_running_streams", "gauge", "Streams holding a slot.", st->running);
    scalar(&b, "dsv4_kv_bytes_in_use", "gauge", "Bytes of sequence state held by running streams.", (double)st->state_bytes);
    scalar(&b, "dsv4_prompt_tokens_total", "counter", "Prompt tokens of submitted streams.", (double)st->prompt_tokens);
    scalar(&b, "dsv4_generation_tokens_total", "counter", "Tokens generated.", (double)st->generated_tokens);
    scalar(&b, "dsv4_cached_prompt_tokens_total", "counter", "Prompt tokens reused from the prefix cache.", (double)st->cached_tokens);
    scalar(&b, "dsv4_engine_steps_total", "counter", "Scheduler steps run.", (double)st->steps);
    scalar(&b, "dsv4_engine_step_tokens_total", "counter", "Tokens fed to the model by all steps.", (double)st->step_tokens);
    scalar(&b, "dsv4_prefix_cache_hits_total", "counter", "Prefix-cache lookups that reused a state.", (double)st->pcache.hits);
    scalar(&b, "dsv4_prefix_cache_misses_total", "counter", "Prefix-cache lookups that found nothing.", (double)st->pcache.misses);
    scalar(&b, "dsv4_prefix_cache_bytes", "gauge", "Bytes held by the in-memory prefix cache.", (double)st->pcache.bytes);
    scalar(&b, "dsv4_prefix_cache_disk_hits_total", "counter", "Prefix-cache hits served from disk.", (double)st->pcache.disk_hits);
    /* speculative decoding, by drafter (one series: the server runs one method); counted when requests end */
    const char *method = st->spec ? st->spec : "none";
    dsv4_sb_printf(&b, "# HELP dsv4_spec_draft_tokens_total Draft tokens verified by the target (speculative decoding).\n"
                       "# TYPE dsv4_spec_draft_tokens_total counter\ndsv4_spec_draft_tokens_total{method=\"%s\"} %lld\n"
                       "# HELP dsv4_spec_accepted_tokens_total Draft tokens accepted by verification.\n"
                       "# TYPE dsv4_spec_accepted_tokens_total counter\ndsv4_spec_accepted_tokens_total{method=\"%s\"} %lld\n"
                       "# HELP dsv4_spec_steps_total Speculative steps (one per stream and engine step).\n"
                       "# TYPE dsv4_spec_steps_total counter\ndsv4_spec_steps_total{method=\"%s\"} %lld\n"
                       "# HELP dsv4_spec_acceptance_ratio Accepted / drafted tokens so far (0 before any draft).\n"
                       "# TYPE dsv4_spec_acceptance_ratio gauge\ndsv4_spec_acceptance_ratio{method=\"%s\"} %.6g\n",
                   method, (long long)st->spec_drafted, method, (long long)st->spec_accepted, method,
                   (long long)st->spec_steps, method,
                   st->spec_drafted ? (double)st->spec_accepted / (double)st->spec_drafted : 0.0);
    return dsv4_sb_take(&b, NULL);
}
