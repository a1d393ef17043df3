// Load generator for `dsv4 serve`: requests/s and time to first token at several client counts.
// usage: node serve_bench.mjs BASE_URL MODEL_NAME [CLIENTS=1,16,64] [REQUESTS_PER_LEVEL=128] [MAX_TOKENS=32]
// Each request is a streamed chat completion (greedy, ignore_eos so every request generates MAX_TOKENS);
// TTFT is the time from sending the request to the first chunk that carries a generated token.
// Measures only; asserts nothing.
const [BASE, MODEL, levels = '1,16,64', perLevel = '128', maxTok = '32'] = process.argv.slice(2);

async function one(i) {
    const t0 = performance.now();
    const r = await fetch(`${BASE}/v1/chat/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: `benchmark request ${i}` }],
                               max_tokens: Number(maxTok), temperature: 0, ignore_eos: true, stream: true,
                               return_token_ids: true }),
    });
    if (r.status !== 200) throw new Error(`status ${r.status}`);
    const dec = new TextDecoder();
    let buf = '', ttft = null, tokens = 0;
    for await (const part of r.body) {
        buf += dec.decode(part, { stream: true });
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
            const ev = buf.slice(0, k); buf = buf.slice(k + 2);
            if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
            const ids = JSON.parse(ev.slice(6)).choices?.[0]?.token_ids;
            if (ids && ids.length) { tokens += ids.length; if (ttft === null) ttft = performance.now() - t0; }
        }
    }
    return { ttft, total: performance.now() - t0, tokens };
}

const pct = (a, p) => a[Math.min(a.length - 1, Math.floor(p * a.length))];
console.log('| clients | requests | requests/s | generated tok/s | TTFT p50 (ms) | TTFT p90 (ms) |');
console.log('|---|---|---|---|---|---|');
for (const c of levels.split(',').map(Number)) {
    const n = Math.max(Number(perLevel), c);
    let next = 0;
    const res = [];
    const t0 = performance.now();
    await Promise.all(Array.from({ length: c }, async () => { while (next < n) res.push(await one(next++)); }));
    const secs = (performance.now() - t0) / 1000;
    const ttfts = res.map((r) => r.ttft).sort((a, b) => a - b);
    const toks = res.reduce((s, r) => s + r.tokens, 0);
    console.log(`| ${c} | ${n} | ${(n / secs).toFixed(1)} | ${(toks / secs).toFixed(0)} | ${pct(ttfts, 0.5).toFixed(1)} | ${pct(ttfts, 0.9).toFixed(1)} |`);
}
