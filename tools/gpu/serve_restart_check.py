#!/usr/bin/env python3
"""dsv4 serve --spec METHOD --prefix-cache-dir DIR across a restart, on the lent GPU machine (standard library only:
node is not there; tests/node/serve_restart.mjs is the full version CI runs on the CPU). The same requests, one at
a time, against a server with an empty cache folder (cold) and then against a new server process on the same
folder (warm): warm requests must reuse a prefix from disk (cached_tokens > 0), with the drafter's state stored
beside it, and give exactly the cold run's token ids, with the same speculative acceptance (/metrics).
usage: serve_restart_check.py DSV4_BIN MODEL_DIR DEVICE METHOD; prints one summary line, exit 0 when all held."""
import json, re, shutil, subprocess, sys, tempfile, time, urllib.request

BIN, MODEL, DEV, METHOD = sys.argv[1:5]
CACHE = tempfile.mkdtemp(prefix="dsv4-restart-")

def start():
    srv = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", "0", "--device", DEV, "--spec", METHOD,
                            "--prefix-cache-dir", CACHE], stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 120:
        line = srv.stderr.readline()
        m = re.search(r"listening on http://[^:]+:(\d+)", line or "")
        if m:
            return srv, f"http://127.0.0.1:{m.group(1)}"
        if srv.poll() is not None:
            break
    sys.exit(f"serve --spec {METHOD} on {DEV}: did not start")

def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())

def spec_counts(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=60).read().decode()
    return [float(re.search(rf'^dsv4_spec_{k}_tokens_total\{{method="{METHOD}"\}} (\S+)$', text, re.M).group(1))
            for k in ("draft", "accepted")]

LONG = [1 + (k * 29 + 7) % 250 for k in range(40)]   # past the tiny model's window: the drafter's rings wrap
def run(base):
    model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=60).read())["data"][0]["id"]
    out = []
    for prompt, n in ((LONG, 16), (LONG[:25], 12), (LONG + [3, 4, 5], 12)):
        r = post(base, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
                                            "ignore_eos": True, "return_token_ids": True})
        out.append((r["choices"][0]["token_ids"], r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)))
    return out, spec_counts(base)

results = []
for phase in ("cold", "warm"):
    srv, base = start()
    try:
        results.append(run(base))
    finally:
        srv.terminate()
        srv.wait(timeout=60)
shutil.rmtree(CACHE, ignore_errors=True)
(cold, cold_spec), (warm, warm_spec) = results
same = all(c[0] == w[0] for c, w in zip(cold, warm))
hits = sum(1 for w in warm if w[1] > 0)
ok = same and hits == len(warm) and cold_spec == warm_spec and cold_spec[0] > 0
print(f"serve --spec {METHOD} on {DEV} across a restart: ids {'equal' if same else 'DIFFER'}; warm prefix hits {hits}/{len(warm)} "
      f"(cached {[w[1] for w in warm]}); drafted/accepted cold {cold_spec} warm {warm_spec}; {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
