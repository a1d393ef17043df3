/* Tokenizer throughput for `dsv4 bench --tokenizer`, and the deterministic corpus it runs on by default. */
#include "text/tokenizer.h"
#include "util/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double dsv4_tokenizer_bench_mbps(const dsv4_tokenizer *t, const char *text, size_t n, int repeats, dsv4_error *err) {
    if (repeats < 1) repeats = 1;
    double best = -1;
    for (int r = 0; r < repeats; r++) {
        double t0 = now_s();
        for (size_t start = 0; start < n;) {
            const char *nl = memchr(text + start, '\n', n - start);
            size_t end = nl ? (size_t)(nl - text) : n;
            int32_t *ids;
            size_t k;
            if (dsv4_tokenizer_encode(t, text + start, end - start, 0, &ids, &k, err)) return -1;
            free(ids);
            start = end + 1;
        }
        double dt = now_s() - t0;
        if (best < 0 || dt < best) best = dt;
    }
    return best > 0 ? (double)n / 1e6 / best : 0;
}

/* Lines of different scripts and shapes; each repetition gets its own number so the text is not one
 * repeated string (which would flatter any cache). */
static const char *const SAMPLES[] = {
    "The quick brown fox jumps over the lazy dog; it's 5 o'clock and we're late for the 3:15 train.",
    "    for (int i = 0; i < n; i++) { total += values[i] * weights[i]; } // accumulate",
    "def tokenize(text: str) -> list[int]:\n        return [vocab[p] for p in split(text) if p]",
    "我们今天去公园散步，天气非常好！深度求索公司创造了这个模型。",
    "これは日本語のテキストです。カタカナとひらがなを混ぜます。",
    "한국어 텍스트입니다. 안녕하세요, 반갑습니다!",
    "مرحبا بالعالم! هذه جملة عربية مع أرقام ٠١٢٣٤٥٦٧٨٩.",
    "नमस्ते दुनिया। यह हिंदी पाठ है और इसमें कुछ शब्द हैं।",
    "emoji 😀🎉🚀 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 thumbs 👍🏽",
    "{\"id\": 12345, \"values\": [1.5, 2.25, -3e-5], \"name\": \"Ünïcödé café\", \"ok\": true}",
    "Digits 3.14159265358979 and x² + y³ = z⁴, ½ ① １２３, tabs\there\tand\u00a0nbsp\u3000wide.",
};

char *dsv4_tokenizer_bench_corpus(size_t bytes, size_t *len) {
    size_t cap = bytes + 1024, n = 0, k = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    const size_t ns = sizeof SAMPLES / sizeof SAMPLES[0];
    while (n < bytes) {
        const char *s = SAMPLES[k % ns];
        size_t l = strlen(s);
        if (n + l + 32 > cap) break;
        memcpy(buf + n, s, l);
        n += l;
        n += (size_t)snprintf(buf + n, cap - n, " #%zu\n", k);
        k++;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}
