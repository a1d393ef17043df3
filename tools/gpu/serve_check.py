#!/usr/bin/env python3
"""dsv4 serve --device cuda on the lent GPU machine (standard library only; node is not there): 32 concurrent
greedy /v1/completions requests with token-id prompts must each return the ids `dsv4 generate --device cuda`
gives for that prompt alone (the batching guarantee through the server, on GPU sequences), then one streamed
chat request, /health and /metrics. Further arguments go to `dsv4 serve` (e.g. `--spec mtp`: speculation inside
the scheduler; the ids must still equal generate's without speculation, and the line reports the acceptance).
Prints one summary line; exit 0 when everything held."""
import json, os, re, subprocess, sys, threading, time, urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
DEV = sys.argv[3] if len(sys.argv) > 3 else "cuda"
EXTRA = sys.argv[4:]
srv = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", "0", "--device", DEV, "--max-streams", "64", *EXTRA],
                       stderr=subprocess.PIPE, text=True)
port = None
t0 = time.time()
while time.time() - t0 < 120:
    line = srv.stderr.readline()
    m = re.search(r"listening on http://[^:]+:(\d+)", line or "")
    if m:
        port = int(m.group(1)); break
    if srv.poll() is not None:
        break
if not port:
    print(f"serve on {DEV}: did not start:", line.strip() if line else srv.returncode); sys.exit(1)
base = f"http://127.0.0.1:{port}"

def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read().decode()

MODEL_ID = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=30).read())["data"][0]["id"]
prompts = [[5 + (i * 7 + k * 3) % 250 for k in range(3 + (i * 5) % 40)] for i in range(32)]
want = []
for p in prompts:
    out = subprocess.run([BIN, "generate", "-m", MODEL, "--device", DEV, "--tokens", ",".join(map(str, p)), "-n", "12",
                          "--ids"], capture_output=True, text=True).stdout.strip()
    want.append([int(x) for x in out.split(",") if x])
got, errors = [None] * len(prompts), []
def one(i):
    try:
        r = json.loads(post("/v1/completions", {"model": MODEL_ID, "prompt": prompts[i], "max_tokens": 12, "temperature": 0,
                                                "return_token_ids": True}))
        got[i] = r["choices"][0]["token_ids"]
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(repr(e))
th = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
t1 = time.time()
for t in th: t.start()
for t in th: t.join()
dt = time.time() - t1
same = sum(1 for i in range(len(prompts)) if got[i] is not None and got[i][:len(want[i])] == want[i])
chat = post("/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
                                     "stream": True})
health = urllib.request.urlopen(base + "/health", timeout=30).status
metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
srv.terminate()
rc = srv.wait(timeout=60)
ok = same == len(prompts) and not errors and "data: [DONE]" in chat and health == 200 and "dsv4_" in metrics and rc == 0
print(f"serve on {DEV}: {same}/{len(prompts)} concurrent greedy completions = dsv4 generate alone; {len(prompts)} requests in "
      f"{dt:.2f} s; streamed chat {'ok' if '[DONE]' in chat else 'FAILED'}; /health {health}; exit {rc}; "
      f"{'errors: ' + '; '.join(errors[:3]) if errors else 'no errors'}")
spec = re.findall(r'^dsv4_spec_(draft|accepted)_tokens_total\{method="([^"]+)"\} (\S+)$', metrics, re.M)
if EXTRA and spec:
    print("  " + ", ".join(f"{kind} {val} ({method})" for kind, method, val in spec))
sys.exit(0 if ok else 1)
