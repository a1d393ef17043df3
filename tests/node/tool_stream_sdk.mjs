// Streamed tool calls read back by the official clients. The streams are the server's own stream builders fed a
// scripted DSML reply token by token (tests/unit/test_server.c, tool_calls_stream_as_deltas, writes them to
// DIR); here each SDK gets one through a fetch that returns it, parses it as it would a live server's, and its
// stream helpers must see the arguments arrive in several pieces and assemble exactly the reported calls.
//
// usage: node tool_stream_sdk.mjs DIR; prints "N passed, N failed".
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const dir = process.argv[2];
let pass = 0, fail = 0;
const check = (name, cond, detail) => { if (cond) pass++; else { fail++; console.log(`FAIL: ${name}: ${detail}`); } };
const show = (x) => JSON.stringify(x)?.slice(0, 300);
const calls = JSON.parse(fs.readFileSync(path.join(dir, 'calls.json'), 'utf8'));
const served = (file) => async () => new Response(fs.readFileSync(path.join(dir, file)),
                                                  { status: 200, headers: { 'content-type': 'text/event-stream' } });

{
    const openai = new OpenAI({ apiKey: 'x', baseURL: 'http://127.0.0.1:9/v1', fetch: served('openai.sse'), maxRetries: 0 });
    const stream = openai.chat.completions.stream({ model: 'm', messages: [{ role: 'user', content: 'x' }] });
    const pieces = [0, 0];
    stream.on('tool_calls.function.arguments.delta', (e) => { pieces[e.index]++; });
    const done = await stream.finalChatCompletion();
    const tc = done.choices[0].message.tool_calls ?? [];
    check('openai: two tool calls', tc.length === 2, show(tc));
    for (let k = 0; k < Math.min(2, tc.length); k++) {
        check(`openai: call ${k} name`, tc[k].function.name === calls[k].name, show(tc[k]));
        check(`openai: call ${k} arguments`, tc[k].function.arguments === calls[k].arguments, show([tc[k].function.arguments, calls[k].arguments]));
        check(`openai: call ${k} id`, typeof tc[k].id === 'string' && tc[k].id.length > 0, show(tc[k]));
    }
    check('openai: finish_reason tool_calls', done.choices[0].finish_reason === 'tool_calls', done.choices[0].finish_reason);
    check('openai: the long arguments arrived in pieces', pieces[1] >= 5, show(pieces));
}
{
    const anthropic = new Anthropic({ apiKey: 'x', baseURL: 'http://127.0.0.1:9', fetch: served('anthropic.sse'), maxRetries: 0 });
    const stream = anthropic.messages.stream({ model: 'm', max_tokens: 10, messages: [{ role: 'user', content: 'x' }] });
    let pieces = 0;
    stream.on('inputJson', () => { pieces++; });
    const msg = await stream.finalMessage();
    const uses = msg.content.filter((b) => b.type === 'tool_use');
    check('anthropic: two tool_use blocks', uses.length === 2, show(msg.content));
    for (let k = 0; k < Math.min(2, uses.length); k++) {
        check(`anthropic: call ${k} name`, uses[k].name === calls[k].name, show(uses[k]));
        check(`anthropic: call ${k} input`, JSON.stringify(uses[k].input) === JSON.stringify(JSON.parse(calls[k].arguments)),
              show([uses[k].input, calls[k].arguments]));
    }
    check('anthropic: stop_reason tool_use', msg.stop_reason === 'tool_use', msg.stop_reason);
    check('anthropic: input arrived in pieces', pieces >= 10, pieces);
}
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
