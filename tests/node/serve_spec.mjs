// `dsv4 serve --spec METHOD`: speculation inside the server's scheduler. Concurrent greedy requests (completions
// and chat, streamed and not) must give exactly `dsv4 generate`'s tokens (generate runs without speculation, one
// sequence, no server); sampled neighbours run alongside and finish; /metrics counts drafted and accepted tokens
// for the method, with some drafts accepted. Cached prefixes are reused while speculating (cached_tokens > 0) with
// the same tokens.
//
// usage: node serve_spec.mjs BASE_URL DSV4_BIN MODEL_DIR METHOD
// prints "N passed, N failed" and exits non-zero on any failure.
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';

const [BASE, BIN, MODEL, METHOD] = process.argv.slice(2);
const QUICK = !!process.env.DSV4_QUICK;
const MODEL_NAME = path.basename(MODEL);
const USER = 266;
let pass = 0, fail = 0;
const check = (name, cond, detail) => { if (cond) pass++; else { fail++; console.log(`FAIL: [${METHOD}] ${name}: ${detail}`); } };
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const show = (x) => JSON.stringify(x)?.slice(0, 300);
const openai = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 600000 });

function generateIds(promptIds, n) {
    const out = execFileSync(BIN, ['generate', '-m', MODEL, '--tokens', promptIds.join(','), '-n', String(n), '--ids'],
                             { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
    return out ? out.split(',').map(Number) : [];
}
async function metrics() {
    const text = await (await fetch(`${BASE}/metrics`)).text();
    const get = (name) => Number(text.match(new RegExp(`^${name}\\{method="${METHOD}"\\} ([^\\s]+)$`, 'm'))?.[1]);
    return { drafted: get('dsv4_spec_draft_tokens_total'), accepted: get('dsv4_spec_accepted_tokens_total'),
             ratio: get('dsv4_spec_acceptance_ratio') };
}

// prompts with repeats, so that prompt lookup has something to draft from
const N = QUICK ? 6 : 20, LEN = 24;
const prompts = Array.from({ length: N }, (_, i) => {
    const half = Array.from({ length: 4 + (i % 9) }, (_, k) => 1 + ((i * 37 + k * 11) % 250));
    return [...half, ...half, ...half.slice(0, 3)];
});
const wants = prompts.map((p) => generateIds(p, LEN));
const completion = async (i) => {
    const body = { model: MODEL_NAME, prompt: prompts[i], max_tokens: LEN, temperature: 0, return_token_ids: true };
    if (i % 2 === 0) return (await openai.completions.create(body)).choices[0].token_ids;
    const ids = [];
    for await (const ch of await openai.completions.create({ ...body, stream: true })) if (ch.choices[0]?.token_ids) ids.push(...ch.choices[0].token_ids);
    return ids;
};
const sampledRun = async (i) => {
    const r = await openai.completions.create({ model: MODEL_NAME, prompt: prompts[i], max_tokens: LEN, temperature: 0.8,
                                                top_p: 0.95, seed: i, ignore_eos: true, return_token_ids: true });
    return r.choices[0].token_ids;
};
const [got, sampled] = await Promise.all([Promise.all(prompts.map((_, i) => completion(i))),
                                          Promise.all([0, 1, 2, 3].map(sampledRun))]);
let eq = 0;
for (let i = 0; i < N; i++) { if (same(got[i], wants[i])) eq++; else if (N - eq < 3) console.log('  differs', i, show([got[i], wants[i]])); }
check(`${N} concurrent greedy completions = dsv4 generate (no speculation)`, eq === N, `${eq}/${N}`);
check('sampled neighbours finish with their length', sampled.every((ids) => ids.length === LEN), show(sampled.map((s) => s.length)));
// the same seed twice gives the same sampled tokens (each stream's own random streams), whatever runs beside it
const again = await sampledRun(1);
check('sampled stream reproducible by seed', same(again, sampled[1]), show([again, sampled[1]]));

// chat, greedy, streamed: equal to dsv4 generate of the rendered prompt, cut at the end-of-turn marker
{
    const r = await openai.chat.completions.create({ model: MODEL_NAME, messages: [{ role: 'user', content: 'abc abc abc abc' }],
                                                     max_tokens: 16, temperature: 0, return_token_ids: true });
    let want = generateIds(r.prompt_token_ids, 16);
    const k = want.indexOf(USER);
    if (k >= 0) want = want.slice(0, k + 1);
    check('chat greedy = dsv4 generate', same(r.choices[0].token_ids, want), show([r.choices[0].token_ids, want]));
}

// prefix reuse while speculating (MTP's drafter state is stored beside the cached states): the same prompt again
// and the conversation's next turn fork from the cache (cached_tokens > 0) and still give generate's tokens; a
// seeded sampled request gives the same tokens from the cache as it did without
{
    const chat = (messages, extra = {}) => openai.chat.completions.create({ model: MODEL_NAME, messages, max_tokens: 12,
                                                                          temperature: 0, return_token_ids: true, ...extra });
    const cut = (ids) => { const k = ids.indexOf(USER); return k >= 0 ? ids.slice(0, k + 1) : ids; };
    const msgs = [{ role: 'user', content: 'spec cache one two three one two three' }];
    const r1 = await chat(msgs);
    const r1b = await chat(msgs);
    check('same prompt again: cached_tokens > 0', r1b.usage.prompt_tokens_details?.cached_tokens > 0, show(r1b.usage));
    check('same prompt again: same tokens', same(r1b.choices[0].token_ids, r1.choices[0].token_ids), show([r1b.choices[0].token_ids, r1.choices[0].token_ids]));
    const msgs2 = [...msgs, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'four five four five' }];
    const r2 = await chat(msgs2);
    check('next turn: cached_tokens > 0', r2.usage.prompt_tokens_details?.cached_tokens > 0, show(r2.usage));
    const want2 = cut(generateIds(r2.prompt_token_ids, 12));
    check('next turn from the cache = dsv4 generate', same(r2.choices[0].token_ids, want2), show([r2.choices[0].token_ids, want2]));
    const sampledChat = () => chat([{ role: 'user', content: 'spec cache sampled seven eight seven eight' }],
                                   { temperature: 0.9, seed: 7, max_tokens: 16 });
    const s1 = await sampledChat(), s2 = await sampledChat();
    check('sampled, seeded: the second forks from the cache', s1.usage.prompt_tokens_details?.cached_tokens === 0 &&
          s2.usage.prompt_tokens_details?.cached_tokens > 0, show([s1.usage, s2.usage]));
    check('sampled, seeded: same tokens with and without the cache', same(s1.choices[0].token_ids, s2.choices[0].token_ids),
          show([s1.choices[0].token_ids, s2.choices[0].token_ids]));
}

const m = await metrics();
console.log(`spec ${METHOD}: ${m.accepted} of ${m.drafted} drafted tokens accepted (ratio ${m.ratio})`);
check('metrics: drafts verified', m.drafted > 0, show(m));
check('metrics: some drafts accepted', m.accepted > 0 && m.accepted <= m.drafted, show(m));
check('metrics: ratio = accepted / drafted', Math.abs(m.ratio - m.accepted / m.drafted) < 1e-5, show(m));

console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
