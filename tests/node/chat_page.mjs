// The built-in chat page in headless chromium (playwright-core). Expected replies never come from the page: the
// test asks the server itself for the same request, not streamed, and the page must show exactly that text.
// The page sends no temperature (the server's default samples); the test's route adds temperature 0 to the
// page's request so the reply is the greedy one, and, for the stop button, a budget that does not end by itself.
//
// usage: node chat_page.mjs BASE_URL CHROMIUM_PATH MODEL_NAME; prints "N passed, N failed".
import { chromium } from 'playwright-core';

const [BASE, CHROMIUM, MODEL] = process.argv.slice(2);
let pass = 0, fail = 0;
const check = (name, cond, detail) => { if (cond) pass++; else { fail++; console.log(`FAIL: ${name}: ${detail}`); } };
const show = (x) => JSON.stringify(x)?.slice(0, 300);

async function metric(name) {
    const t = await (await fetch(`${BASE}/metrics`)).text();
    return Number(t.match(new RegExp(`^${name} ([^\\s]+)$`, 'm'))?.[1]);
}
// The same conversation as the page sends, asked without streaming.
async function reference(messages, thinking) {
    const r = await fetch(`${BASE}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, messages, thinking, max_tokens: 512, temperature: 0 }) });
    return (await r.json()).choices[0].message;
}

const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
try {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    let extra = {};
    await page.route('**/v1/chat/completions', async (route) => {
        const body = JSON.parse(route.request().postData());
        await route.continue({ postData: JSON.stringify({ ...body, temperature: 0, ...extra }) });
    });

    // 1. it loads: title, the served model's name from /v1/models
    await page.goto(BASE + '/');
    check('title', (await page.title()) === 'dsv4 chat', await page.title());
    await page.waitForFunction((m) => document.getElementById('model').textContent === m, MODEL, { timeout: 10000 });
    ok('model name shown');

    // 2. a message: the reply streams in (the answer changes several times) and ends as the server's own reply.
    //    Count the answer's updates from inside the page (a MutationObserver on the log).
    await page.evaluate(() => {
        window.__updates = 0;
        new MutationObserver(() => { window.__updates++; }).observe(document.getElementById('log'),
                                                                   { childList: true, subtree: true, characterData: true });
    });
    const q1 = 'hello there';
    const want1 = await reference([{ role: 'user', content: q1 }], false);
    await page.fill('#input', q1);
    await page.press('#input', 'Enter');
    await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 60000 });
    const got1 = await page.textContent('.msg.assistant .answer');
    check('the reply = the server\'s non-streamed reply', got1 === (want1.content ?? ''), show([got1, want1.content]));
    check('the reply is not empty', got1.length > 0, show(got1));
    const updates = await page.evaluate(() => window.__updates);
    check('the reply was rendered as it streamed', updates >= 4, updates);
    check('the user bubble', (await page.textContent('.msg.user')) === q1, await page.textContent('.msg.user'));
    check('send enabled, stop disabled after the reply', !(await page.isDisabled('#send')) && (await page.isDisabled('#stop')), 'buttons');

    // 3. stop: a reply that would go on for a long time; Stop ends it, the page says so, the server cancels it
    extra = { max_tokens: 20000, ignore_eos: true };
    await page.fill('#input', 'tell me a very long story');
    await page.press('#input', 'Enter');
    // Stop is clicked inside the page in the poll that first sees 20 characters of the reply, not by a later
    // page.click: on a loaded 2-core machine the stream could end in between (CI, 2026-12-02: page.click waited 30 s
    // on a Stop button that was disabled again)
    const stopped = await page.waitForFunction(() => {
        const a = document.querySelectorAll('.msg.assistant .answer'), stop = document.querySelector('#stop');
        if (a.length !== 2 || a[1].textContent.length <= 20) return false;
        if (stop.disabled) return 'disabled';
        stop.click();
        return 'clicked';
    }, null, { timeout: 60000 });
    const how = await stopped.jsonValue();
    check('stop enabled while streaming', how === 'clicked', how);
    await page.waitForSelector('.msg.assistant[data-state="stopped"]', { timeout: 10000 });
    ok('stopped');
    let running = NaN;
    for (let i = 0; i < 100; i++) { running = await metric('dsv4_running_streams'); if (running === 0) break; await new Promise((r) => setTimeout(r, 50)); }
    check('the server cancelled the stream', running === 0, running);
    const n1 = (await page.textContent('.msg.assistant[data-state="stopped"] .answer')).length;
    await new Promise((r) => setTimeout(r, 300));
    const n2 = (await page.textContent('.msg.assistant[data-state="stopped"] .answer')).length;
    check('no text after stop', n1 === n2, `${n1} -> ${n2}`);
    extra = {};

    // 4. thinking: the reasoning streams into a folded <details>, the answer beside it; the conversation so far
    //    (the stopped reply included) is what the page sends
    await page.click('#clear');
    await page.check('#think');
    const q2 = 'what is abc?';
    const want2 = await reference([{ role: 'user', content: q2 }], true);
    await page.fill('#input', q2);
    await page.press('#input', 'Enter');
    await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 60000 });
    const det = await page.$('.msg.assistant details.thinking');
    check('reasoning shown in a details element', det !== null, 'none');
    if (det) {
        check('reasoning folded', !(await det.evaluate((d) => d.open)), 'open');
        check('reasoning summary', (await det.evaluate((d) => d.querySelector('summary').textContent)) === 'thinking', 'summary');
        const shown = await det.evaluate((d) => d.querySelector('div').textContent);
        check('reasoning = the server\'s reasoning_content', shown === (want2.reasoning_content ?? ''), show([shown, want2.reasoning_content]));
        // unfold it: the text is there to read
        await page.click('.msg.assistant details.thinking summary');
        check('reasoning unfolds', await det.evaluate((d) => d.open), 'still folded');
    }
    const ans2 = await page.textContent('.msg.assistant .answer');
    check('thinking answer = the server\'s content', ans2 === (want2.content ?? ''), show([ans2, want2.content]));
    check('no page errors', errors.length === 0, show(errors));
} catch (e) {
    fail++;
    console.log('FAIL: browser test threw:', String(e).slice(0, 500));
} finally {
    await browser.close();
}
function ok() { pass++; }
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
