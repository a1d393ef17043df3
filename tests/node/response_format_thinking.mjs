// response_format in thinking mode through the official clients (see response_format_thinking.sh). The model is
// random: its reasoning is noise and ends only because the constraint's length bound makes room for </think> and
// a complete answer within max_tokens. Every reply must carry its reasoning apart from the answer, and the answer
// must be JSON that ajv validates (finish stop / end_turn), or the reply ended with length.
//
// usage: node response_format_thinking.mjs BASE_URL MODEL_NAME
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';

const [BASE, MODEL] = process.argv.slice(2);
const SEEDS = process.env.DSV4_QUICK ? 2 : 4;
let pass = 0, fail = 0;
const check = (name, cond, detail) => { if (cond) pass++; else { fail++; console.log(`FAIL: ${name}: ${typeof detail === 'function' ? detail() : detail}`); } };
const show = (x) => JSON.stringify(x)?.slice(0, 400);
const openai = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 600000 });
const anthropic = new Anthropic({ baseURL: BASE, apiKey: 'unused', maxRetries: 0, timeout: 600000 });

const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 150 },
                                               tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 } },
                 required: ['name', 'age'], additionalProperties: false };
const validate = new Ajv().compile(schema);
const messages = [{ role: 'user', content: 'describe a person as JSON' }];
const stats = { valid: 0, length: 0, reasoning: 0 };

// the answer validates (and the reply stopped), or the reply ran out of tokens
function judge(name, answer, reasoning, finish, stopped, withSchema) {
    let v, parsed = true;
    try { v = JSON.parse(answer); } catch { parsed = false; }
    const ok = parsed && (withSchema ? validate(v) : v !== null && typeof v === 'object' && !Array.isArray(v));   // json_object: an object
    if (ok && finish === stopped) stats.valid++;
    else if (finish === 'length' || finish === 'max_tokens') stats.length++;
    check(`${name}: the answer validates or the reply hit the length`, (ok && finish === stopped) || finish === 'length' || finish === 'max_tokens',
          () => show({ answer, finish, errors: withSchema && parsed ? validate.errors : 'not JSON' }));
    check(`${name}: reasoning apart from the answer`, typeof reasoning === 'string' && !answer.includes('</think>') && !reasoning.includes('</think>'),
          () => show({ reasoning, answer }));
    if (reasoning.length > 0) stats.reasoning++;
}

const rfSchema = { type: 'json_schema', json_schema: { name: 'person', schema } };
for (let seed = 1; seed <= SEEDS; seed++) {
    // OpenAI, reasoning_effort, json_schema, not streamed
    const r = await openai.chat.completions.create({ model: MODEL, messages, response_format: rfSchema, reasoning_effort: 'high',
                                                     temperature: 1, seed, max_tokens: 120 });
    const m = r.choices[0].message;
    judge(`openai json_schema seed ${seed}`, m.content ?? '', m.reasoning_content, r.choices[0].finish_reason, 'stop', true);
    // OpenAI, the thinking switch, json_object, streamed
    const st = await openai.chat.completions.create({ model: MODEL, messages, response_format: { type: 'json_object' }, thinking: true,
                                                      temperature: 1, seed: 100 + seed, max_tokens: 80, stream: true });
    let content = '', reasoning = '', finish = null;
    for await (const ch of st) {
        content += ch.choices[0]?.delta?.content ?? '';
        reasoning += ch.choices[0]?.delta?.reasoning_content ?? '';
        finish = ch.choices[0]?.finish_reason ?? finish;
    }
    judge(`openai json_object streamed seed ${seed}`, content, reasoning, finish, 'stop', false);
    // Anthropic: thinking + output_config.format (odd seeds: the beta's output_format)
    const fmt = { type: 'json_schema', schema };
    // seeded in the body (dsv4 reads `seed` from the Messages body as from OpenAI's): the same replies every run
    const body = { model: MODEL, max_tokens: 120, temperature: 1, seed: 200 + seed, messages, thinking: { type: 'enabled', budget_tokens: 1024 },
                   ...(seed % 2 ? { output_format: fmt } : { output_config: { format: fmt } }) };
    const a = await fetch(`${BASE}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const am = await a.json();
    const blocks = am.content ?? [];
    const think = blocks.filter((b) => b.type === 'thinking').map((b) => b.thinking).join('');
    const text = blocks.filter((b) => b.type === 'text').map((b) => b.text).join('');
    check(`anthropic seed ${seed}: a thinking block first`, blocks[0]?.type === 'thinking', () => show(blocks));
    judge(`anthropic seed ${seed}`, text, think, am.stop_reason, 'end_turn', true);
}
// Anthropic through the official SDK, streamed (output_config.format)
{
    const s = anthropic.messages.stream({ model: MODEL, max_tokens: 120, temperature: 1, seed: 300, messages,
                                          thinking: { type: 'enabled', budget_tokens: 1024 }, output_config: { format: { type: 'json_schema', schema } } });
    const fin = await s.finalMessage();
    const think = fin.content.filter((b) => b.type === 'thinking').map((b) => b.thinking).join('');
    const text = fin.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    judge('anthropic sdk streamed', text, think, fin.stop_reason, 'end_turn', true);
}
// a bad schema names the Anthropic field
{
    const a = await fetch(`${BASE}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, max_tokens: 8, messages, output_config: { format: { type: 'json_schema', schema: { type: 'string', format: 'email' } } } }) });
    const j = await a.json();
    check('anthropic: unsupported schema keyword -> 400 naming output_config.format.schema', a.status === 400 && /output_config\.format\.schema/.test(j.error?.message ?? ''), () => show([a.status, j]));
}
console.log(`thinking + response_format: ${stats.valid} valid answers, ${stats.length} cut by length, ${stats.reasoning} with reasoning text`);
// the reasoning is really free and the answer really constrained: most replies are complete and reasoned
check('most replies complete with a valid answer', stats.valid >= 2 * SEEDS, show(stats));
check('the reasoning is not empty in most replies', stats.reasoning >= 2 * SEEDS, show(stats));
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
