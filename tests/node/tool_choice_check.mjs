// tool_choice guarantees through the official clients, checked by an independent validator (ajv, JSON Schema
// 2020-12): against a running `dsv4 serve` on a tiny random-weight model, temperature 1, many seeds.
//   OpenAI  required            every reply: finish_reason tool_calls, >= 1 call, each to a given tool, arguments valid
//           named function      exactly one call, to that function, arguments valid
//           auto, strict tools  text (finish stop) or calls whose arguments are valid for the strict tools
//   Anthropic any / tool        stop_reason tool_use, tool_use blocks (one for tool) whose input is valid
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

async function openaiCase(label, tool_choice, seed, only, stream) {
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
    const name = `${label} seed ${seed}${stream ? ' (stream)' : ''}`;
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

async function anthropicCase(tool_choice, seed, only) {
    const r = await anthropic.messages.create({ model: MODEL, max_tokens: 300, temperature: 1, messages,
        tools: Object.entries(schemas).map(([name, input_schema]) => ({ name, input_schema })), tool_choice,
        metadata: undefined, top_k: undefined }, { headers: { 'x-seed': String(seed) } });
    const uses = r.content.filter((b) => b.type === 'tool_use');
    const name = `anthropic ${tool_choice.type} seed ${seed}`;
    check(name + ' stop', r.stop_reason === 'tool_use', `stop ${r.stop_reason}`);
    check(name + ' calls', only ? uses.length === 1 : uses.length >= 1, `${uses.length} tool_use blocks`);
    for (const u of uses) { const why = validCall(u.name, u.input, only); check(name + ' input valid', !why, why); }
}

let autoCalls = 0;
for (let seed = 1; seed <= SEEDS; seed++) {
    await openaiCase('required', 'required', seed, null, seed % 3 === 0);
    await openaiCase('named', { type: 'function', function: { name: seed % 2 ? 'get_weather' : 'tag' } }, seed,
                     seed % 2 ? 'get_weather' : 'tag', seed % 4 === 1);
    autoCalls += await openaiCase('auto', 'auto', seed, null, false);
    await anthropicCase({ type: 'any' }, seed, null);
    await anthropicCase({ type: 'tool', name: 'get_weather' }, seed, 'get_weather');
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
