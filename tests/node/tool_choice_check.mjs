// tool_choice guarantees through the official clients, checked by an independent validator (ajv, JSON Schema
// 2020-12): against a running `dsv4 serve` on a tiny random-weight model, temperature 1, many seeds.
//   OpenAI  required            every reply: finish_reason tool_calls, >= 1 call, each to a given tool, arguments valid
//           named function      exactly one call, to that function, arguments valid
//           auto, strict tools  text (finish stop) or calls whose arguments are valid for the strict tools
//   Anthropic any / tool        stop_reason tool_use, tool_use blocks (one for tool) whose input is valid
// Every request is seeded (OpenAI `seed`; Anthropic has no such field, dsv4 reads the same `seed` from the Messages
// body), so the replies, and with them the number of checks, are the same from run to run; the first seeds' requests
// are sent again all at once (batched on the server) and each reply must equal its serial one byte for byte.
// usage: node tool_choice_check.mjs BASE_URL MODEL_NAME; prints "N passed, N failed". TOOL_SEEDS=N: seeds per case
// (default 4; make test keeps it short, a longer run is TOOL_SEEDS=50 bash tests/node/tool_choice.sh).
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import Ajv2020 from 'ajv/dist/2020.js';

const [BASE, MODEL] = process.argv.slice(2);
const SEEDS = Number(process.env.TOOL_SEEDS || (process.env.DSV4_QUICK ? 2 : 4));
const openai = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 600000 });
const anthropic = new Anthropic({ baseURL: BASE, apiKey: 'unused', maxRetries: 0, timeout: 600000 });
const ajv = new Ajv2020({ strict: false });
let pass = 0, fail = 0;
const check = (name, cond, detail) => { if (cond) pass++; else { fail++; console.log(`FAIL: ${name}: ${detail}`); } };

const weather = { type: 'object', properties: { location: { type: 'string', description: 'city' },
    unit: { enum: ['celsius', 'fahrenheit'] }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['location', 'unit'], additionalProperties: false };
const tag = { type: 'object', properties: { items: { type: 'array', items: { $ref: '#/$defs/t' }, maxItems: 3 },
    note: { type: ['string', 'null'] } }, required: ['items', 'note'], additionalProperties: false,
    $defs: { t: { type: 'string', pattern: '^[a-z]{1,4}$' } } };
const ping = { type: 'object', properties: {}, additionalProperties: false };
const schemas = { get_weather: weather, tag, ping };
const validators = Object.fromEntries(Object.entries(schemas).map(([k, s]) => [k, ajv.compile(s)]));
const tools = Object.entries(schemas).map(([name, parameters]) => ({ type: 'function', function: { name, parameters, strict: true } }));
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

function validCall(name, args, only) {
    if (only && name !== only) return `call to ${name}, not ${only}`;
    if (!validators[name]) return `unknown tool ${name}`;
    if (!validators[name](args)) return `${name}(${JSON.stringify(args)}): ${ajv.errorsText(validators[name].errors)}`;
    return null;
}

// the reply without its ids and timestamps: what a seed must reproduce
async function openaiReply(tool_choice, seed, stream) {
    const req = { model: MODEL, messages, tools, tool_choice, temperature: 1, seed, max_tokens: 300 };
    let finish, calls = [], content = '';
    if (stream) {
        const acc = {};
        for await (const chunk of await openai.chat.completions.create({ ...req, stream: true })) {
            const ch = chunk.choices[0];
            if (!ch) continue;
            if (ch.delta?.content) content += ch.delta.content;
            for (const tc of ch.delta?.tool_calls || []) {
                const a = (acc[tc.index] ||= { name: '', arguments: '' });
                if (tc.function?.name) a.name += tc.function.name;
                if (tc.function?.arguments) a.arguments += tc.function.arguments;
            }
            if (ch.finish_reason) finish = ch.finish_reason;
        }
        calls = Object.values(acc);
    } else {
        const r = await openai.chat.completions.create(req);
        finish = r.choices[0].finish_reason;
        content = r.choices[0].message.content || '';
        calls = (r.choices[0].message.tool_calls || []).map((c) => c.function);
    }
    return { finish, content, calls: calls.map((c) => ({ name: c.name, arguments: c.arguments })) };
}

const replies = new Map();   // case name -> the serial reply, JSON
async function openaiCase(label, tool_choice, seed, only, stream) {
    const reply = await openaiReply(tool_choice, seed, stream);
    const { finish, content, calls } = reply;
    const name = `${label} seed ${seed}${stream ? ' (stream)' : ''}`;
    replies.set(name, JSON.stringify(reply));
    if (label === 'auto' && calls.length === 0) { check(name, finish === 'stop' || finish === 'length', `finish ${finish}`); return 0; }
    check(name + ' finish', finish === 'tool_calls', `finish ${finish}, content ${JSON.stringify(content).slice(0, 200)}`);
    check(name + ' calls', only ? calls.length === 1 : calls.length >= 1, `${calls.length} calls`);
    for (const c of calls) {
        let args;
        try { args = JSON.parse(c.arguments); } catch (e) { check(name + ' arguments parse', false, c.arguments); continue; }
        const why = validCall(c.name, args, only);
        check(name + ' arguments valid', !why, why);
    }
    return calls.length;
}

async function anthropicReply(tool_choice, seed) {
    const r = await anthropic.messages.create({ model: MODEL, max_tokens: 300, temperature: 1, messages,
        tools: Object.entries(schemas).map(([name, input_schema]) => ({ name, input_schema })), tool_choice, seed });
    return { stop_reason: r.stop_reason, content: r.content.map(({ id, ...b }) => b), output_tokens: r.usage?.output_tokens };
}

async function anthropicCase(tool_choice, seed, only) {
    const r = await anthropicReply(tool_choice, seed);
    const uses = r.content.filter((b) => b.type === 'tool_use');
    const name = `anthropic ${tool_choice.type} seed ${seed}`;
    replies.set(name, JSON.stringify(r));
    check(name + ' stop', r.stop_reason === 'tool_use', `stop ${r.stop_reason}`);
    check(name + ' calls', only ? uses.length === 1 : uses.length >= 1, `${uses.length} tool_use blocks`);
    for (const u of uses) { const why = validCall(u.name, u.input, only); check(name + ' input valid', !why, why); }
}

const named = (seed) => ({ type: 'function', function: { name: seed % 2 ? 'get_weather' : 'tag' } });
let autoCalls = 0;
for (let seed = 1; seed <= SEEDS; seed++) {
    await openaiCase('required', 'required', seed, null, seed % 3 === 0);
    await openaiCase('named', named(seed), seed, seed % 2 ? 'get_weather' : 'tag', seed % 4 === 1);
    autoCalls += await openaiCase('auto', 'auto', seed, null, false);
    await anthropicCase({ type: 'any' }, seed, null);
    await anthropicCase({ type: 'tool', name: 'get_weather' }, seed, 'get_weather');
}
// the same seeded requests again, the first two seeds' all at once (up to --max-streams share a batch): each reply
// must be the serial one, byte for byte
{
    const again = [];
    for (let seed = 1; seed <= Math.min(2, SEEDS); seed++) {
        again.push([`required seed ${seed}${seed % 3 === 0 ? ' (stream)' : ''}`, openaiReply('required', seed, seed % 3 === 0)]);
        again.push([`named seed ${seed}${seed % 4 === 1 ? ' (stream)' : ''}`, openaiReply(named(seed), seed, seed % 4 === 1)]);
        again.push([`auto seed ${seed}`, openaiReply('auto', seed, false)]);
        again.push([`anthropic any seed ${seed}`, anthropicReply({ type: 'any' }, seed)]);
        again.push([`anthropic tool seed ${seed}`, anthropicReply({ type: 'tool', name: 'get_weather' }, seed)]);
    }
    const got = await Promise.all(again.map(([, p]) => p));
    again.forEach(([name], i) => {
        const serial = replies.get(name), batched = JSON.stringify(got[i]);
        check(`${name}: the same reply sent again, batched`, serial === batched,
              `serial ${serial?.slice(0, 200)}, batched ${batched.slice(0, 200)}`);
    });
}
// thinking mode: the reasoning, </think>, then the forced call
for (let seed = 1; seed <= Math.max(2, SEEDS / 3); seed++) {
    const r = await openai.chat.completions.create({ model: MODEL, messages, tools, tool_choice: 'required', temperature: 1,
        seed, max_tokens: 300, reasoning_effort: 'high' });
    const calls = r.choices[0].message.tool_calls || [];
    check(`thinking required seed ${seed}`, r.choices[0].finish_reason === 'tool_calls' && calls.length >= 1,
          `finish ${r.choices[0].finish_reason}, ${calls.length} calls`);
    for (const c of calls) { const why = validCall(c.function.name, JSON.parse(c.function.arguments)); check(`thinking seed ${seed} valid`, !why, why); }
}
console.log(`auto: ${autoCalls} calls in ${SEEDS} replies`);
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
