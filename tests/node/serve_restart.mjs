// `dsv4 serve --spec METHOD --prefix-cache-dir DIR` across a restart (serve_restart.sh): the same requests, one
// at a time, against a server with an empty cache folder (PHASE cold: the results go to RESULTS) and then against
// a new server process on the same folder (PHASE warm). Warm: each request reuses a prefix from disk
// (cached_tokens > 0), with the drafter's state stored beside it, and gives exactly the cold run's token ids,
// greedy and seeded sampling; greedy ids equal `dsv4 generate` (no server, no speculation); the next turn of a
// conversation forks from disk too; the speculative acceptance over the cold requests equals the cold run's
// (/metrics: drafted and accepted tokens) — the drafter resumed exactly where a full prefill would have left it.
//
// usage: node serve_restart.mjs BASE_URL DSV4_BIN MODEL_DIR METHOD cold|warm RESULTS_JSON
// prints "N passed, N failed" and exits non-zero on any failure.
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';

const [BASE, BIN, MODEL, METHOD, PHASE, RESULTS] = process.argv.slice(2);
const MODEL_NAME = path.basename(MODEL);
const USER = 266;
let pass = 0, fail = 0;
const check = (name, cond, detail) => { if (cond) pass++; else { fail++; console.log(`FAIL: [${METHOD} ${PHASE}] ${name}: ${detail}`); } };
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const show = (x) => JSON.stringify(x)?.slice(0, 300);
const openai = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 600000 });
const cut = (ids) => { const k = ids.indexOf(USER); return k >= 0 ? ids.slice(0, k + 1) : ids; };

function generateIds(promptIds, n) {
    const out = execFileSync(BIN, ['generate', '-m', MODEL, '--tokens', promptIds.join(','), '-n', String(n), '--ids',
                                   '--device', process.env.DSV4_DEVICE || 'cpu'],
                             { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
    return out ? out.split(',').map(Number) : [];
}
async function metrics() {
    const text = await (await fetch(`${BASE}/metrics`)).text();
    const labelled = (name) => Number(text.match(new RegExp(`^${name}\\{method="${METHOD}"\\} ([^\\s]+)$`, 'm'))?.[1]);
    const plain = (name) => Number(text.match(new RegExp(`^${name} ([^\\s]+)$`, 'm'))?.[1]);
    return { drafted: labelled('dsv4_spec_draft_tokens_total'), accepted: labelled('dsv4_spec_accepted_tokens_total'),
             disk_hits: plain('dsv4_prefix_cache_disk_hits_total') };
}

const chat = async (messages, extra = {}) => {
    const r = await openai.chat.completions.create({ model: MODEL_NAME, messages, max_tokens: 12, temperature: 0,
                                                     return_token_ids: true, ...extra });
    return { ids: r.choices[0].token_ids, prompt: r.prompt_token_ids, cached: r.usage.prompt_tokens_details?.cached_tokens,
             content: r.choices[0].message.content };
};
// a completion over token ids, past the tiny model's window, so the drafter's rings have wrapped
const longPrompt = Array.from({ length: 40 }, (_, k) => 1 + ((k * 29 + 7) % 250));
const completion = async () => {
    const r = await openai.completions.create({ model: MODEL_NAME, prompt: longPrompt, max_tokens: 16, temperature: 0,
                                               ignore_eos: true, return_token_ids: true });
    return { ids: r.choices[0].token_ids, cached: r.usage.prompt_tokens_details?.cached_tokens };
};
const requests = [
    ['chat, greedy', () => chat([{ role: 'user', content: 'restart one two three one two three' }])],
    ['chat, sampled with a seed', () => chat([{ role: 'user', content: 'restart sampled seven eight seven eight' }],
                                             { temperature: 0.9, seed: 11, max_tokens: 16 })],
    ['completion, greedy, 40 prompt tokens', completion],
];

const got = [];
for (const [, run] of requests) got.push(await run());   // one at a time: acceptance is then the stream's alone
const m = await metrics();

if (PHASE === 'cold') {
    for (let i = 0; i < requests.length; i++) check(`${requests[i][0]}: nothing cached yet`, got[i].cached === 0, show(got[i]));
    check('greedy chat = dsv4 generate', same(got[0].ids, cut(generateIds(got[0].prompt, 12))), show(got[0].ids));
    check('greedy completion = dsv4 generate', same(got[2].ids, generateIds(longPrompt, 16)), show(got[2].ids));
    check('drafts verified', m.drafted > 0, show(m));
    fs.writeFileSync(RESULTS, JSON.stringify({ got, metrics: m }));
} else {
    const cold = JSON.parse(fs.readFileSync(RESULTS, 'utf8'));
    for (let i = 0; i < requests.length; i++) {
        check(`${requests[i][0]}: a prefix from disk (cached_tokens > 0)`, got[i].cached > 0, show(got[i]));
        check(`${requests[i][0]}: the cold run's ids`, same(got[i].ids, cold.got[i].ids), show([got[i].ids, cold.got[i].ids]));
    }
    check('hits served from disk', m.disk_hits >= requests.length, show(m));
    check('drafts and acceptance = the cold run\'s', m.drafted === cold.metrics.drafted && m.accepted === cold.metrics.accepted,
          show([m, cold.metrics]));
    // the conversation's next turn forks the state the cold run's first turn ended with (from disk)
    const msgs = [{ role: 'user', content: 'restart one two three one two three' },
                  { role: 'assistant', content: cold.got[0].content }, { role: 'user', content: 'four five four five' }];
    const next = await chat(msgs);
    check('next turn: cached_tokens > 0', next.cached > 0, show(next));
    check('next turn = dsv4 generate', same(next.ids, cut(generateIds(next.prompt, 12))), show(next.ids));
}
console.log(`${METHOD} ${PHASE}: ${m.accepted} of ${m.drafted} drafted tokens accepted, ${m.disk_hits} disk hits`);
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
