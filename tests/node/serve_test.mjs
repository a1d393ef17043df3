// `dsv4 serve` through the official clients (npm `openai`, `@anthropic-ai/sdk`) and raw fetch, against a
// running server on a tiny checkpoint. Expected outputs never come from the server: prompts are rendered and
// tokenized by `dsv4 render` / `dsv4 tokenize`, greedy continuations come from `dsv4 generate --tokens`
// (one sequence, no scheduler, no server).
//
// usage: node serve_test.mjs BASE_URL DSV4_BIN MODEL_DIR TMP_DIR SERVER_PID
// prints "N passed, N failed" and exits non-zero on any failure.
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const [BASE, BIN, MODEL, TMP, PID] = process.argv.slice(2);
// DSV4_QUICK (the sanitizer run, 10-100x slower): fewer clients, a shorter soak (SOAK_REQUESTS=N sets its length), no RSS check, and no tool
// round trip (the DSML tool preamble makes 1000-token prompts); the full run covers those.
const QUICK = !!process.env.DSV4_QUICK;
const MODEL_NAME = path.basename(MODEL);
const EOS = 265, USER = 266, THINK = 268, THINK_END = 269;
let pass = 0, fail = 0;
const ok = (name) => { pass++; if (process.env.VERBOSE) console.log('ok', name); };
const bad = (name, detail) => { fail++; console.log(`FAIL: ${name}${detail !== undefined ? ': ' + detail : ''}`); };
const check = (name, cond, detail) => (cond ? ok(name) : bad(name, typeof detail === 'function' ? detail() : detail));
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const show = (x) => JSON.stringify(x)?.slice(0, 300);

const openai = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 600000 });
const anthropic = new Anthropic({ baseURL: BASE, apiKey: 'unused', maxRetries: 0, timeout: 600000 });

// ---- independent expectations through the CLI ---------------------------------------------------------
let fileNo = 0;
function cli(args) { return execFileSync(BIN, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }); }
function renderIds(messages, mode = 'chat', extra = {}) {
    const f = path.join(TMP, `render${fileNo++}.json`);
    fs.writeFileSync(f, JSON.stringify({ messages, mode, ...extra }));
    const text = cli(['render', '--messages', f]);
    const tf = f + '.txt';
    fs.writeFileSync(tf, text);
    return cli(['tokenize', '-m', MODEL, '--file', tf]).trim().split(',').map(Number);
}
// Greedy ids of `dsv4 generate`; the server also ends a chat reply at <｜User｜>, so cut there (inclusive).
function generateIds(promptIds, n, stopAtUser = true) {
    const out = cli(['generate', '-m', MODEL, '--tokens', promptIds.join(','), '-n', String(n), '--ids']).trim();
    const ids = out ? out.split(',').map(Number) : [];
    if (stopAtUser) { const k = ids.indexOf(USER); if (k >= 0) return ids.slice(0, k + 1); }
    return ids;
}
function decode(ids) {
    const keep = ids.filter((t) => t !== EOS && t !== USER);
    if (!keep.length) return '';
    return cli(['tokenize', '-m', MODEL, '--decode', '--text', keep.join(',')]).replace(/\n$/, '');
}

async function raw(method, url, body, headers = {}) {
    const r = await fetch(BASE + url, { method, headers: { 'content-type': 'application/json', ...headers }, body });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, json, text, headers: r.headers };
}

// Read an SSE body into [{event, data}] (data parsed unless [DONE]).
async function sse(url, body) {
    const r = await fetch(BASE + url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const text = await r.text();
    const events = [];
    for (const block of text.split('\n\n')) {
        if (!block.trim()) continue;
        let event = null, data = null;
        for (const line of block.split('\n')) {
            if (line.startsWith('event: ')) event = line.slice(7);
            else if (line.startsWith('data: ')) data = line.slice(6);
        }
        events.push({ event, data: data === '[DONE]' ? '[DONE]' : JSON.parse(data) });
    }
    return { status: r.status, type: r.headers.get('content-type'), events };
}

async function metricsText() { return (await raw('GET', '/metrics')).text; }
function metric(text, name) {
    const m = text.match(new RegExp(`^${name} ([^\\s]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- 1. health, models ------------------------------------------------------------------------------------
{
    const h = await raw('GET', '/health');
    check('health', h.status === 200 && h.json?.status === 'ok', show(h));
    const list = await openai.models.list();
    check('models via openai', list.data.length === 1 && list.data[0].id === MODEL_NAME, show(list.data));
    const page = await raw('GET', '/');
    check('chat page', page.status === 200 && page.text.includes('<title>dsv4 chat</title>') && page.text.includes('/v1/chat/completions'),
          page.status);
}

// ---- 2. chat, greedy, equal to dsv4 generate ----------------------------------------------------------------
const hello = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'hello there' }];
const helloIds = renderIds(hello);
const helloWant = generateIds(helloIds, 12);
let helloText = null;
{
    const r = await openai.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 12, temperature: 0,
                                                     return_token_ids: true });
    check('chat prompt ids = render + tokenize', same(r.prompt_token_ids, helloIds), () => show([r.prompt_token_ids, helloIds]));
    check('chat greedy = dsv4 generate', same(r.choices[0].token_ids, helloWant), () => show([r.choices[0].token_ids, helloWant]));
    check('chat usage', r.usage.prompt_tokens === helloIds.length && r.usage.completion_tokens === helloWant.length &&
          r.usage.total_tokens === helloIds.length + helloWant.length && typeof r.usage.prompt_tokens_details?.cached_tokens === 'number',
          show(r.usage));
    const fr = helloWant.length === 12 && helloWant[11] !== EOS && helloWant[11] !== USER ? 'length' : 'stop';
    check('chat finish_reason', r.choices[0].finish_reason === fr, r.choices[0].finish_reason);
    check('chat object', r.object === 'chat.completion' && r.choices[0].message.role === 'assistant', show(r));
    helloText = r.choices[0].message.content;
    // streamed: the same tokens, role first, usage last, [DONE]
    const stream = await openai.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 12, temperature: 0,
                                                          stream: true, stream_options: { include_usage: true },
                                                          return_token_ids: true });
    let content = '', ids = [], role = null, finish = null, usage = null, chunks = 0;
    for await (const ch of stream) {
        chunks++;
        if (ch.usage) usage = ch.usage;
        const c = ch.choices[0];
        if (!c) continue;
        if (c.delta.role) role = c.delta.role;
        if (c.delta.content) content += c.delta.content;
        if (c.token_ids) ids.push(...c.token_ids);
        if (c.finish_reason) finish = c.finish_reason;
    }
    check('chat stream tokens', same(ids, helloWant), () => show([ids, helloWant]));
    check('chat stream text = non-stream text', content === helloText, () => show([content, helloText]));
    check('chat stream role, finish, usage', role === 'assistant' && finish === fr && usage?.completion_tokens === helloWant.length,
          show({ role, finish, usage }));
    check('chat stream several chunks', chunks >= 3, chunks);
    // the second identical request reuses the stored prompt state
    const again = await openai.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 12, temperature: 0 });
    check('cached_tokens on a repeated prompt', again.usage.prompt_tokens_details.cached_tokens >= helloIds.length - 1,
          show(again.usage));
}

// ---- 2b. a multi-turn agent transcript: each turn resends the whole conversation and reuses the last one ----
{
    const conv = [{ role: 'system', content: 'You are an agent.' }];
    let prompt = 0, cached = 0, exact = true;
    for (let turn = 0; turn < 5; turn++) {
        conv.push({ role: 'user', content: `step ${turn}: list the files in dir${turn}` });
        const r = await openai.chat.completions.create({ model: MODEL_NAME, messages: conv, max_tokens: 8, temperature: 0,
                                                         return_token_ids: true });
        const want = renderIds(conv);
        if (!same(r.prompt_token_ids, want) || !same(r.choices[0].token_ids, generateIds(want, 8))) exact = false;
        if (turn > 0) { prompt += r.usage.prompt_tokens; cached += r.usage.prompt_tokens_details.cached_tokens; }
        conv.push({ role: 'assistant', content: r.choices[0].message.content ?? '' });
    }
    console.log(`multi-turn transcript: turns 2-5 reused ${cached} of ${prompt} prompt tokens (${(100 * cached / prompt).toFixed(0)} %)`);
    check('multi-turn: every turn exact', exact);
    check('multi-turn: later turns reuse earlier state', cached > prompt / 2, `${cached}/${prompt}`);
}

// ---- 3. logprobs --------------------------------------------------------------------------------------------------
{
    const r = await openai.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 6, temperature: 0,
                                                     logprobs: true, top_logprobs: 3 });
    const lp = r.choices[0].logprobs?.content || [];
    check('chat logprobs count', lp.length === r.usage.completion_tokens, show(lp.length));
    check('chat logprobs greedy = top 1', lp.every((t) => t.top_logprobs.length === 3 && t.logprob <= 0 &&
          Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-5 && t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob),
          show(lp[0]));
}

// ---- 4. completions ----------------------------------------------------------------------------------------------
{
    const prompt = [5, 9, 13, 40, 41, 42, 100, 7];
    const want = generateIds(prompt, 10, false);
    const r = await openai.completions.create({ model: MODEL_NAME, prompt, max_tokens: 10, temperature: 0, return_token_ids: true,
                                                logprobs: 2 });
    check('completions ids = dsv4 generate', same(r.choices[0].token_ids, want), () => show([r.choices[0].token_ids, want]));
    check('completions text = decode', r.choices[0].text === decode(want), () => show([r.choices[0].text, decode(want)]));
    const lp = r.choices[0].logprobs;
    check('completions logprobs', lp && lp.tokens.length === want.length && lp.token_logprobs.every((x) => x <= 0) &&
          lp.top_logprobs.every((t) => Object.keys(t).length >= 1), show(lp));
    let text = '', ids = [];
    const st = await openai.completions.create({ model: MODEL_NAME, prompt, max_tokens: 10, temperature: 0, stream: true,
                                                 return_token_ids: true });
    for await (const ch of st) { if (ch.choices[0]) { text += ch.choices[0].text; if (ch.choices[0].token_ids) ids.push(...ch.choices[0].token_ids); } }
    check('completions stream', same(ids, want) && text === r.choices[0].text, () => show([ids, want]));
    const tp = 'abc d';
    const e = await openai.completions.create({ model: MODEL_NAME, prompt: tp, max_tokens: 4, temperature: 0, echo: true });
    check('completions echo', e.choices[0].text.startsWith(tp), show(e.choices[0].text));
    const n3 = await openai.completions.create({ model: MODEL_NAME, prompt, max_tokens: 5, temperature: 0.9, seed: 5, n: 3 });
    check('completions n=3', n3.choices.length === 3 && n3.choices.map((c) => c.index).join() === '0,1,2', show(n3.choices));
}

// ---- 5. thinking on / off ------------------------------------------------------------------------------------------
{
    const q = [{ role: 'user', content: 'what is abc?' }];
    const on = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, max_tokens: 8, temperature: 0,
                                                      reasoning_effort: 'high', return_token_ids: true });
    const wantOn = renderIds(q, 'thinking', { effort: 'high' });
    check('thinking prompt = render thinking/high', same(on.prompt_token_ids, wantOn), () => show([on.prompt_token_ids, wantOn]));
    check('thinking prompt ends with <think>', on.prompt_token_ids.at(-1) === THINK, on.prompt_token_ids.at(-1));
    check('thinking: reasoning_content present', typeof on.choices[0].message.reasoning_content === 'string', show(on.choices[0].message));
    check('thinking greedy = dsv4 generate', same(on.choices[0].token_ids, generateIds(wantOn, 8)), show(on.choices[0].token_ids));
    const off = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, max_tokens: 8, temperature: 0,
                                                       thinking: { type: 'disabled' }, return_token_ids: true });
    check('chat mode prompt ends with </think>', off.prompt_token_ids.at(-1) === THINK_END && same(off.prompt_token_ids, renderIds(q)),
          off.prompt_token_ids.at(-1));
    check('chat mode: no reasoning_content', off.choices[0].message.reasoning_content === undefined, show(off.choices[0].message));
    // streamed thinking: every generated byte is in reasoning or content (the DSML split), reasoning first
    const st = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, max_tokens: 8, temperature: 0,
                                                      thinking: { type: 'enabled' }, stream: true });
    let r = '', c = '';
    for await (const ch of st) { const d = ch.choices[0]?.delta; if (d?.reasoning_content) r += d.reasoning_content; if (d?.content) c += d.content; }
    const ns = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, max_tokens: 8, temperature: 0, thinking: true });
    check('thinking stream = non-stream split', r === (ns.choices[0].message.reasoning_content ?? '') && c === (ns.choices[0].message.content ?? ''),
          show([r, c, ns.choices[0].message]));
    const am = await anthropic.messages.create({ model: MODEL_NAME, max_tokens: 8, temperature: 0, messages: q,
                                                 thinking: { type: 'enabled', budget_tokens: 1024 } });
    check('anthropic thinking input = render thinking', am.usage.input_tokens === renderIds(q, 'thinking').length, show(am.usage));
}

// ---- 6. tool-call round trip (OpenAI and Anthropic) -------------------------------------------------------------------
if (QUICK) console.log('(quick run: tool round trip skipped)');
else {
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
                                                   parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const q = [{ role: 'user', content: 'weather in Paris?' }];
    const r1 = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, tools, max_tokens: 6, temperature: 0,
                                                      return_token_ids: true });
    const want1 = renderIds(q, 'chat', { tools });
    check('tools rendered as dsv4 render', same(r1.prompt_token_ids, want1), () => show([r1.prompt_token_ids.length, want1.length]));
    check('tools greedy = dsv4 generate', same(r1.choices[0].token_ids, generateIds(want1, 6)), show(r1.choices[0].token_ids));
    const none = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, tools, tool_choice: 'none', max_tokens: 2,
                                                        temperature: 0, return_token_ids: true });
    check('tool_choice none leaves tools out', same(none.prompt_token_ids, renderIds(q)), none.prompt_token_ids.length);
    const conv = [...q,
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' }];
    const r2 = await openai.chat.completions.create({ model: MODEL_NAME, messages: conv, tools, max_tokens: 6, temperature: 0,
                                                      return_token_ids: true });
    const want2 = renderIds(conv, 'chat', { tools });
    check('openai tool result turn rendered', same(r2.prompt_token_ids, want2), () => show([r2.prompt_token_ids.length, want2.length]));
    check('openai tool result answer = dsv4 generate', same(r2.choices[0].token_ids, generateIds(want2, 6)), show(r2.choices[0].token_ids));
    // Anthropic: the same conversation as tool_use / tool_result blocks renders to the same prompt
    const atools = [{ name: 'get_weather', description: 'Weather of a city', input_schema: tools[0].function.parameters }];
    const amsgs = [q[0],
        { role: 'assistant', content: [{ type: 'tool_use', id: 'call_1', name: 'get_weather', input: { city: 'Paris' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_1', content: 'sunny, 21 C' }] }];
    const a2 = await anthropic.messages.create({ model: MODEL_NAME, max_tokens: 6, temperature: 0, tools: atools, messages: amsgs });
    const convA = [...q, { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
                   { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' }];
    const wantA = renderIds(convA, 'chat', { tools });
    check('anthropic tool round trip prompt', a2.usage.input_tokens === wantA.length, show([a2.usage, wantA.length]));
    const wantAText = decode(generateIds(wantA, 6));
    const gotAText = a2.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    check('anthropic tool answer', a2.type === 'message' && a2.role === 'assistant' && ['end_turn', 'max_tokens', 'tool_use'].includes(a2.stop_reason),
          show(a2));
    check('anthropic tool answer text', gotAText.length > 0 || a2.stop_reason !== 'max_tokens' || wantAText === '', show([gotAText, wantAText]));
}

// ---- 7. Anthropic messages, streamed and not ----------------------------------------------------------------------------
{
    const m = await anthropic.messages.create({ model: MODEL_NAME, max_tokens: 12, temperature: 0, system: 'Be brief.',
                                                messages: [{ role: 'user', content: 'hello there' }] });
    check('anthropic usage = chat prompt', m.usage.input_tokens === helloIds.length && m.usage.output_tokens === helloWant.length, show(m.usage));
    const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    check('anthropic text = openai chat text', text === helloText, () => show([text, helloText]));
    const s = anthropic.messages.stream({ model: MODEL_NAME, max_tokens: 12, temperature: 0, system: 'Be brief.',
                                          messages: [{ role: 'user', content: 'hello there' }] });
    const fin = await s.finalMessage();
    const stext = fin.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    check('anthropic stream = non-stream', stext === text && fin.stop_reason === m.stop_reason, () => show([stext, text, fin.stop_reason]));
    const ev = await sse('/v1/messages', { model: MODEL_NAME, max_tokens: 12, temperature: 0, stream: true,
                                           messages: [{ role: 'user', content: 'hello there' }], thinking: { type: 'enabled' } });
    const names = ev.events.map((e) => e.event);
    const order = names.join(',');
    const okOrder = /^message_start,(content_block_start,(content_block_delta,)*content_block_stop,)*message_delta,message_stop$/.test(order);
    check('anthropic event order', okOrder && ev.type.startsWith('text/event-stream'), order);
    check('anthropic event types match', ev.events.every((e) => e.data.type === e.event), order);
}

// ---- 7b. response_format: the content is JSON that matches the schema (checked by ajv), and greedy output equals
//          `dsv4 generate --json-schema` (its own constrained loop, no scheduler). The quick (sanitizer) run keeps only
//          the short json_object request: masks under ASan cost 10-50x -----------------------------------------------------
if (!QUICK) {
    const { default: Ajv } = await import('ajv');
    const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 150 },
                                                   tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 } },
                     required: ['name', 'age', 'tags'], additionalProperties: false };
    const validate = new Ajv().compile(schema);
    const q = [{ role: 'user', content: 'describe a person as JSON' }];
    const rf = { type: 'json_schema', json_schema: { name: 'person', schema } };
    const r = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, response_format: rf, max_tokens: 96, n: 4,
                                                     temperature: 1.0, seed: 11, return_token_ids: true });
    const want = renderIds(q, 'chat', { response_format: rf });
    check('response_format prompt = render', same(r.prompt_token_ids, want), () => show([r.prompt_token_ids.length, want.length]));
    let valid = 0;
    for (const c of r.choices) {
        let v = null;
        try { v = JSON.parse(c.message.content); } catch { /* counted as invalid */ }
        if (v !== null && validate(v) && c.finish_reason === 'stop') valid++;
        else console.log('  invalid', show([c.message.content, c.finish_reason, validate.errors]));
    }
    check('response_format json_schema: every choice valid', valid === 4, `${valid}/4`);
    const sf = path.join(TMP, 'schema.json');
    fs.writeFileSync(sf, JSON.stringify(schema));
    const g = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, response_format: rf, max_tokens: 96,
                                                     temperature: 0, return_token_ids: true });
    const gen = cli(['generate', '-m', MODEL, '--tokens', want.join(','), '-n', '96', '--ids', '--json-schema', sf]).trim().split(',').map(Number);
    check('response_format greedy = dsv4 generate --json-schema', same(g.choices[0].token_ids, gen), () => show([g.choices[0].token_ids, gen]));
}
{
    const q = [{ role: 'user', content: 'JSON please' }];
    const jo = await openai.chat.completions.create({ model: MODEL_NAME, messages: q, response_format: { type: 'json_object' },
                                                      max_tokens: QUICK ? 16 : 64, temperature: 1.0, seed: 3, stream: true });
    let text = '', finish = null;
    for await (const ch of jo) {
        text += ch.choices[0]?.delta?.content ?? '';
        finish = ch.choices[0]?.finish_reason ?? finish;
    }
    let v = null;
    try { v = JSON.parse(text); } catch { v = undefined; }
    // JSON mode promises an object (a reply cut by max_tokens is the documented exception)
    const isObject = v !== null && typeof v === 'object' && !Array.isArray(v);
    check('response_format json_object (streamed) is a JSON object', finish === 'length' || isObject, show({ text, finish }));
}

// ---- 8. abort mid-stream, then the next request is fine -------------------------------------------------------------------
{
    const ac = new AbortController();
    const st = await openai.chat.completions.create({ model: MODEL_NAME, messages: [{ role: 'user', content: 'go on forever' }],
                                                      max_tokens: 30000, temperature: 0.8, seed: 1, stream: true, ignore_eos: true },
                                                    { signal: ac.signal });
    // The SDK may hand over chunks it had already buffered after abort(), and it ends the loop either by throwing
    // or quietly (openai-node swallows its own AbortError), so the check is that the stream ended early and unfinished.
    let n = 0, finish = null;
    try {
        for await (const ch of st) {
            finish = ch.choices[0]?.finish_reason ?? finish;
            if (++n === 5) ac.abort();
        }
    } catch { /* an AbortError is one of the two ways the loop ends */ }
    check('abort: the client stopped the stream', n >= 5 && n < 1000 && finish === null, show({ n, finish }));
    let running = NaN, disc = NaN;
    for (let i = 0; i < 100; i++) {
        const t = await metricsText();
        running = metric(t, 'dsv4_running_streams');
        disc = metric(t, 'dsv4_client_disconnects_total');
        if (running === 0 && disc >= 1) break;
        await sleep(50);
    }
    check('abort: the stream was cancelled', running === 0 && disc >= 1, show({ running, disc }));
    const r = await openai.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 12, temperature: 0, return_token_ids: true });
    check('after abort: next request exact', same(r.choices[0].token_ids, helloWant), show(r.choices[0].token_ids));
}

// ---- 9. 32 concurrent greedy clients (plus sampled neighbours): each equals itself alone and dsv4 generate ------------------
{
    const convs = [];
    const NC = QUICK ? 8 : 32;
    for (let i = 0; i < NC; i++) convs.push([{ role: 'user', content: `question ${i}: ${'abc '.repeat(i % 7)}x${i * 37}` }]);
    const wants = convs.map((c) => generateIds(renderIds(c), 10));
    const sampled = (i) => ({ model: MODEL_NAME, messages: convs[i], max_tokens: 10, temperature: 1.0, top_p: 0.9, seed: 100 + i,
                              return_token_ids: true });
    const aloneSampled = [];
    for (let i = 0; i < 8; i++) aloneSampled.push((await openai.chat.completions.create(sampled(i))).choices[0].token_ids);
    const greedy = (i, stream) => ({ model: MODEL_NAME, messages: convs[i], max_tokens: 10, temperature: 0, return_token_ids: true, stream });
    const alone = [];
    for (let i = 0; i < NC; i++) alone.push((await openai.chat.completions.create(greedy(i, false))).choices[0].token_ids);
    const collect = async (i) => {
        if (i % 2 === 0) return (await openai.chat.completions.create(greedy(i, false))).choices[0].token_ids;
        const ids = [];
        for await (const ch of await openai.chat.completions.create(greedy(i, true))) if (ch.choices[0]?.token_ids) ids.push(...ch.choices[0].token_ids);
        return ids;
    };
    const [conc, concSampled] = await Promise.all([
        Promise.all(convs.map((_, i) => collect(i))),
        Promise.all([0, 1, 2, 3, 4, 5, 6, 7].map(async (i) => (await openai.chat.completions.create(sampled(i))).choices[0].token_ids)),
    ]);
    let eqGen = 0, eqAlone = 0;
    for (let i = 0; i < NC; i++) { if (same(conc[i], wants[i])) eqGen++; else if (eqGen + 3 > i) console.log('  differs', i, show([conc[i], wants[i]])); if (same(conc[i], alone[i])) eqAlone++; }
    check(`${NC} concurrent = dsv4 generate`, eqGen === NC, `${eqGen}/${NC}`);
    check(`${NC} concurrent = alone`, eqAlone === NC, `${eqAlone}/${NC}`);
    check('sampled neighbours = alone (same seed)', same(concSampled, aloneSampled), show([concSampled[0], aloneSampled[0]]));
}

// ---- 10. bad inputs: status, error shape and field; nothing else changes -----------------------------------------------------
{
    const big = 'x'.repeat(9 << 20);
    const chat = (o) => JSON.stringify({ model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], ...o });
    const cases = [
        ['malformed JSON', '/v1/chat/completions', '{"messages": [', 400, null],
        ['body not an object', '/v1/chat/completions', '[1,2]', 400, null],
        ['messages missing', '/v1/chat/completions', '{}', 400, 'messages'],
        ['messages empty', '/v1/chat/completions', '{"messages": []}', 400, 'messages'],
        ['unknown role', '/v1/chat/completions', '{"messages": [{"role": "wizard", "content": "x"}]}', 400, 'messages[0].role'],
        ['content a number', '/v1/chat/completions', '{"messages": [{"role": "user", "content": 5}]}', 400, 'messages[0].content'],
        ['image part', '/v1/chat/completions', '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}', 400, 'messages[0].content[0]'],
        ['tool message without id', '/v1/chat/completions', '{"messages": [{"role": "tool", "content": "x"}]}', 400, 'messages[0].tool_call_id'],
        ['temperature a string', '/v1/chat/completions', chat({ temperature: 'hot' }), 400, 'temperature'],
        ['temperature too high', '/v1/chat/completions', chat({ temperature: 7 }), 400, 'temperature'],
        ['top_p zero', '/v1/chat/completions', chat({ top_p: 0 }), 400, 'top_p'],
        ['n zero', '/v1/chat/completions', chat({ n: 0 }), 400, 'n'],
        ['n huge', '/v1/chat/completions', chat({ n: 1000 }), 400, 'n'],
        ['n a float', '/v1/chat/completions', chat({ n: 1.5 }), 400, 'n'],
        ['max_tokens zero', '/v1/chat/completions', chat({ max_tokens: 0 }), 400, 'max_tokens'],
        ['max_tokens negative', '/v1/chat/completions', chat({ max_tokens: -5 }), 400, 'max_tokens'],
        ['max_tokens a string', '/v1/chat/completions', chat({ max_tokens: '10' }), 400, 'max_tokens'],
        ['context overflow', '/v1/chat/completions', chat({ max_tokens: 1e9 }), 400, 'max_tokens'],
        ['top_logprobs without logprobs', '/v1/chat/completions', chat({ top_logprobs: 2 }), 400, 'top_logprobs'],
        ['top_logprobs too many', '/v1/chat/completions', chat({ logprobs: true, top_logprobs: 50 }), 400, 'top_logprobs'],
        ['presence_penalty out of range', '/v1/chat/completions', chat({ presence_penalty: 3 }), 400, 'presence_penalty'],
        ['stop too many', '/v1/chat/completions', chat({ stop: Array.from({ length: 20 }, (_, i) => `s${i}`) }), 400, 'stop'],
        ['stop empty string', '/v1/chat/completions', chat({ stop: [''] }), 400, 'stop[0]'],
        ['tools not an array', '/v1/chat/completions', chat({ tools: {} }), 400, 'tools'],
        ['tool schema not an object', '/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] }), 400, 'tools[0].function.parameters'],
        ['tool_choice required without tools', '/v1/chat/completions', chat({ tool_choice: 'required' }), 400, 'tool_choice'],
        ['tool_choice names an unknown tool', '/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } }), 400, 'tool_choice'],
        ['tool_choice required, schema keyword unsupported', '/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'string', format: 'email' } } } } }], tool_choice: 'required' }), 400, 'tool_choice'],
        ['tool_choice required with response_format', '/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: 'required', response_format: { type: 'json_object' } }), 400, 'response_format'],
        ['response_format schema keyword unsupported', '/v1/chat/completions', chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', format: 'email' } } } }), 400, 'response_format.json_schema.schema'],
        ['logit_bias', '/v1/chat/completions', chat({ logit_bias: { 5: 10 } }), 400, 'logit_bias'],
        ['stream_options without stream', '/v1/chat/completions', chat({ stream_options: { include_usage: true } }), 400, 'stream_options'],
        ['reasoning_effort unknown', '/v1/chat/completions', chat({ reasoning_effort: 'extreme' }), 400, 'reasoning_effort'],
        ['unknown model', '/v1/chat/completions', chat({ model: 'gpt-17' }), 404, 'model'],
        ['duplicate key', '/v1/chat/completions', '{"messages": [{"role": "user", "content": "a"}], "n": 1, "n": 2}', 400, null],
        ['NUL escape', '/v1/chat/completions', '{"messages": [{"role": "user", "content": "a\\u0000b"}]}', 400, null],
        ['completions: prompt missing', '/v1/completions', '{"max_tokens": 3}', 400, 'prompt'],
        ['completions: token out of vocab', '/v1/completions', '{"prompt": [1, 99999], "max_tokens": 3}', 400, 'prompt[1]'],
        ['completions: negative token', '/v1/completions', '{"prompt": [1, -3], "max_tokens": 3}', 400, 'prompt[1]'],
        ['completions: several prompts', '/v1/completions', '{"prompt": ["a", "b"], "max_tokens": 3}', 400, 'prompt'],
        ['ignore_eos not a boolean', '/v1/completions', '{"prompt": "a", "ignore_eos": 1}', 400, 'ignore_eos'],
        ['completions: empty prompt', '/v1/completions', '{"prompt": "", "max_tokens": 3}', 400, 'prompt'],
        ['messages: max_tokens missing', '/v1/messages', '{"messages": [{"role": "user", "content": "hi"}]}', 400, 'max_tokens'],
        ['messages: system role in messages', '/v1/messages', '{"max_tokens": 3, "messages": [{"role": "system", "content": "hi"}]}', 400, 'messages[0].role'],
        ['messages: tool_choice any without tools', '/v1/messages', '{"max_tokens": 3, "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "hi"}]}', 400, 'tool_choice'],
        ['messages: tool_choice tool without name', '/v1/messages', '{"max_tokens": 3, "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool"}, "messages": [{"role": "user", "content": "hi"}]}', 400, 'tool_choice.name'],
        ['messages: tool schema not an object', '/v1/messages', '{"max_tokens": 3, "tools": [{"name": "f", "input_schema": 3}], "messages": [{"role": "user", "content": "hi"}]}', 400, 'tools[0].input_schema'],
        ['messages: empty', '/v1/messages', '{"max_tokens": 3, "messages": []}', 400, 'messages'],
        ['body too large', '/v1/chat/completions', big, 413, null],
    ];
    for (const [name, url, body, status, param] of cases) {
        const r = await raw('POST', url, body);
        const anth = url === '/v1/messages';
        const shapeOk = anth ? r.json?.type === 'error' && typeof r.json?.error?.type === 'string' && typeof r.json?.error?.message === 'string'
                             : typeof r.json?.error?.message === 'string' && typeof r.json?.error?.type === 'string';
        const paramOk = param === null || (anth ? r.json?.error?.message?.includes(param) : r.json?.error?.param === param);
        check(`bad input: ${name}`, r.status === status && shapeOk && paramOk, () => `${r.status} ${r.text.slice(0, 200)}`);
    }
    const utf = await fetch(BASE + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
        body: Buffer.concat([Buffer.from('{"messages": [{"role": "user", "content": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]) });
    check('bad input: invalid UTF-8', utf.status === 400 && (await utf.json()).error?.message?.length > 0, utf.status);
    const wrongMethod = await raw('GET', '/v1/chat/completions');
    check('bad input: wrong method', wrongMethod.status === 405, wrongMethod.status);
    const nowhere = await raw('GET', '/nowhere');
    check('bad input: unknown path', nowhere.status === 404, nowhere.status);
    const r = await openai.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 12, temperature: 0, return_token_ids: true });
    check('after bad inputs: still exact', same(r.choices[0].token_ids, helloWant), show(r.choices[0].token_ids));
    // stop strings end the content before the match
    const full = await openai.completions.create({ model: MODEL_NAME, prompt: [5, 9, 13], max_tokens: 12, temperature: 0 });
    const t = full.choices[0].text;
    if (t.length >= 4) {
        const stop = t.slice(2, 4);
        const cut = await openai.completions.create({ model: MODEL_NAME, prompt: [5, 9, 13], max_tokens: 12, temperature: 0, stop: [stop] });
        check('stop string', cut.choices[0].text === t.slice(0, t.indexOf(stop)) && cut.choices[0].finish_reason === 'stop',
              show([cut.choices[0], t, stop]));
    } else ok('stop string (output too short to test)');
}

// ---- 11. /metrics is Prometheus text -------------------------------------------------------------------------------------------
{
    const r = await raw('GET', '/metrics');
    const types = new Map();
    const problems = [];
    const samples = [];
    for (const line of r.text.split('\n')) {
        if (!line) continue;
        let m;
        if ((m = line.match(/^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$/))) continue;
        if ((m = line.match(/^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/))) { types.set(m[1], m[2]); continue; }
        m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\})? ([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))$/);
        if (!m) { problems.push(line); continue; }
        const fam = m[1].replace(/_(bucket|sum|count)$/, '');
        if (!types.has(m[1]) && !types.has(fam)) problems.push('no TYPE: ' + line);
        samples.push({ name: m[1], labels: m[3] || '', value: Number(m[4]) });
    }
    check('metrics content type', (r.headers.get('content-type') || '').startsWith('text/plain'), r.headers.get('content-type'));
    check('metrics parse', problems.length === 0 && samples.length > 20, show(problems));
    const ttft = samples.filter((s) => s.name === 'dsv4_time_to_first_token_seconds_bucket');
    const cum = ttft.every((s, i) => i === 0 || s.value >= ttft[i - 1].value);
    const count = samples.find((s) => s.name === 'dsv4_time_to_first_token_seconds_count')?.value;
    check('metrics histogram cumulative', ttft.length > 3 && cum && ttft.at(-1).value === count && count > 0, show(ttft.map((s) => s.value)));
    check('metrics requests by status', samples.some((s) => s.name === 'dsv4_requests_total' && s.labels.includes('status="200"') && s.value > 10) &&
          samples.some((s) => s.name === 'dsv4_requests_total' && s.labels.includes('status="400"')), 'missing series');
    check('metrics tokens and cache', metric(r.text, 'dsv4_prompt_tokens_total') > 0 && metric(r.text, 'dsv4_generation_tokens_total') > 0 &&
          metric(r.text, 'dsv4_prefix_cache_hits_total') > 0, 'counters');
}

// ---- 12. soak: a few thousand requests, 64 concurrent; every response checked, zero errors; resident memory flat ------
//      Greedy requests (OpenAI non-streamed, Anthropic) must give `dsv4 generate`'s tokens / text for their prompt;
//      sampled streamed ones must end properly within their budget. RSS is sampled at every tenth of the run.
{
    const rss = () => { try { return Number(fs.readFileSync(`/proc/${PID}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]); } catch { return NaN; } };
    const total = Number(process.env.SOAK_REQUESTS || (QUICK ? 32 : 3000)), conc = QUICK ? 8 : 64, P = QUICK ? 8 : 40;
    const msgsOf = (k) => [{ role: 'user', content: `soak ${k}` }];
    // expectations from the CLI, one per distinct prompt
    const wantIds = [], wantText = [];
    for (let k = 0; k < P; k++) {
        wantIds.push(generateIds(renderIds(msgsOf(k)), 6));
        wantText.push(decode(wantIds[k]));
    }
    let next = 0, errors = 0, wrong = 0, done = 0;
    const marks = [];
    const bad1 = (what) => { if (++wrong <= 3) console.log('  soak: wrong response:', what); };
    const worker = async () => {
        while (next < total) {
            const i = next++, k = i % P;
            try {
                if (i % 3 === 0) {
                    let ids = [], finish = null, text = '';
                    for await (const ch of await openai.chat.completions.create({ model: MODEL_NAME, messages: msgsOf(k), max_tokens: 6,
                                                                                  temperature: 0.7, seed: i, stream: true, return_token_ids: true })) {
                        const c = ch.choices[0];
                        if (!c) continue;
                        if (c.token_ids) ids.push(...c.token_ids);
                        if (c.delta?.content) text += c.delta.content;
                        if (c.finish_reason) finish = c.finish_reason;
                    }
                    if (!(ids.length >= 1 && ids.length <= 6 && (finish === 'stop' || finish === 'length') &&
                          (finish === 'stop' || ids.length === 6))) bad1(show({ i, ids, finish }));
                } else if (i % 3 === 1) {
                    const r = await openai.chat.completions.create({ model: MODEL_NAME, messages: msgsOf(k), max_tokens: 6, temperature: 0,
                                                                     return_token_ids: true });
                    if (!same(r.choices[0].token_ids, wantIds[k]) || r.usage.completion_tokens !== wantIds[k].length) bad1(show({ i, got: r.choices[0].token_ids, want: wantIds[k] }));
                } else {
                    const r = await anthropic.messages.create({ model: MODEL_NAME, max_tokens: 6, temperature: 0, messages: msgsOf(k) });
                    const text = r.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
                    if (r.type !== 'message' || text !== wantText[k] || r.usage.output_tokens !== wantIds[k].length) bad1(show({ i, text, want: wantText[k] }));
                }
            } catch (e) { errors++; if (errors < 3) console.log('  soak error', String(e).slice(0, 200)); }
            if (++done % Math.ceil(total / 10) === 0) marks.push(rss());
        }
    };
    const t0 = Date.now();
    await Promise.all(Array.from({ length: conc }, worker));
    const secs = (Date.now() - t0) / 1000;
    console.log(`soak: ${total} requests, ${conc} concurrent, ${secs.toFixed(1)} s (${(total / secs).toFixed(1)} req/s), ` +
                `RSS kB at each tenth: ${marks.join(' ')}`);
    check('soak: zero errors', errors === 0, errors);
    check('soak: every response right', wrong === 0, `${wrong} wrong of ${total}`);
    // flat after warm-up: from the third tenth on (prefix cache full, every slot used), at most 16 MB more
    if (!QUICK) check('soak: resident memory flat after warm-up', marks.length >= 10 && Math.max(...marks.slice(2)) - marks[2] < 16384, marks.join(' '));
}

console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
