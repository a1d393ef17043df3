/* `dsv4 --help`, `dsv4 help [COMMAND]`, `dsv4 COMMAND --help`: every command and every option, from this one
 * table. docs/dsv4.1 (the man page) documents the same set, and tests/cli/help_man.sh checks that the table, the
 * man page and the options the commands actually parse (their strcmp literals in src/cli/cmd_*.c) agree, so none
 * of the three can drift. An option line starts with the option's spellings ("-m, --model DIR"). */
#include "cli/cli.h"
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *spelling;   /* "-m, --model DIR" */
    const char *text;
} opt_help;

typedef struct {
    const char *name, *summary, *synopsis;
    opt_help opts[40];      /* ends at the first {NULL} */
} cmd_help;

/* Options several commands share, spelled once so they read the same everywhere. */
#define O_MODEL     {"-m, --model DIR", "checkpoint folder (config.json + safetensors shards, as published)"}
#define O_MODE      {"--mode exact|official", "numeric mode: exact (fp32, default) or the official rounding points"}
#define O_KV        {"--kv f32|bf16|fp8", "KV cache storage (default f32; fp8 = E4M3 per 64 dims, indexer rows FP4)"}
#define O_THREADS   {"--threads N", "worker threads (default 0 = one per online CPU)"}
#define O_DEVICE    {"--device cpu|cuda", "where weights, state and steps live (default cpu; cuda needs make CUDA=1 " \
                                          "and a GPU; its kernel switches are environment variables, DSV4_CUDA_GRAPHS, " \
                                          "_MMA, _GEMM, _STREAM (decode linears streamed, default 0), _EXPERT_LEAN (default 1), ...: dsv4(1))"}, \
                    {"--gpus N", "with --device cuda: spread the routed experts over GPUs 0..N-1 (expert parallelism over " \
                                 "NCCL, the same bits as one GPU; default 1)"}, \
                    {"--gpu-mem GB", "with --device cuda: GiB of GPU memory for the weights (default: what is free); " \
                                     "routed experts beyond it stay in host memory, computed by the CPU"}, \
                    {"--expert-profile FILE", "which experts stay on the GPU then: the most used by this routing " \
                                              "profile (default DIR/expert_profile.json if present, else even)"}, \
                    {"--bus-share F", "with --gpu-mem: the share (0-1) of the experts in host memory that the GPU " \
                                      "computes, reading them over PCIe, beside the CPU computing the rest (default by a token's " \
                                      "expected routes r to a layer's host experts, from the profile: 1 where r < 0.25, 0.15 " \
                                      "where r >= 2, 0.25 where r >= 4, else 0)"}, \
                    {"--bus-by-token", "with --gpu-mem: split each token's routes to host experts instead, about the " \
                                       "share F (default 0.25) of them over PCIe, the rest on the CPU; every host expert " \
                                       "page-locked"}, \
                    {"--amx", "official mode on the CPU: the linears whose inputs are bf16 (FP8-quantized or rounded) " \
                              "on AMX tiles, in their own accumulation order (faster prefill and batches, slower decode)"}
#define O_SAMPLING  {"--temp T", "sampling temperature (default 0 = greedy, lowest id wins ties)"}, \
                    {"--top-p P", "nucleus sampling: keep the smallest set of tokens with probability >= P (default 1)"}, \
                    {"--top-k K", "keep only the K most likely tokens (default 0 = all)"}, \
                    {"--min-p P", "drop tokens less likely than P times the most likely one (default 0)"}, \
                    {"--seed S", "sampler seed (default 0)"}
#define O_PCACHE    {"--prefix-cache-dir DIR", "reuse stored states of prompt prefixes, kept in DIR (shared by " \
                                               "processes)"}, \
                    {"--prefix-cache-mb N", "byte budget of the prefix cache folder, in MiB (least recently used " \
                                            "files are evicted)"}

static const cmd_help HELP[] = {
    {"tiny", "write a synthetic checkpoint in the official format",
     "dsv4 tiny -o DIR [options]",
     {{"-o, --out DIR", "folder to write (config.json, index, safetensors shards)"},
      {"--preset flash-tiny|pro-tiny", "the model's shape (default flash-tiny)"},
      {"--seed N", "seed of the random weights (default 0)"},
      {"--set KEY=VALUE", "override a config.json field, repeatable (Hugging Face name, dotted for nested "
                          "ones; VALUE is JSON)"},
      {"--mtp none|v4|dspark", "speculative head to include (default none)"},
      {"--shards N", "number of safetensors shards (default 2)"},
      {"--tokenizer FILE_OR_DIR", "ship this tokenizer.json (and the tokenizer_config.json next to it)"},
      {NULL, NULL}}},
    {"inspect", "show a checkpoint's config, tensors, memory and problems",
     "dsv4 inspect -m DIR [--gpu-mem GB [--expert-profile FILE] [--bus-share F] [--bus-by-token]]",
     {O_MODEL,
      {"--gpu-mem GB", "also show where a GPU load with this budget puts the routed experts (GPU or host memory)"},
      {"--expert-profile FILE", "with --gpu-mem: the routing profile that placement uses (default DIR/expert_profile.json)"},
      {"--bus-share F", "with --gpu-mem: also split the host experts between the CPU and the GPU over the bus"},
      {"--bus-by-token", "with --gpu-mem: split each token's routes to host experts instead (--bus-share: the share)"},
      {NULL, NULL}}},
    {"logits", "per-position logits as .npy",
     "dsv4 logits -m DIR (--tokens LIST | --batch FILE) [options]",
     {O_MODEL,
      {"--tokens LIST", "comma-separated token ids, or @FILE to read the list from a file"},
      {"--batch FILE", "one token list per line, all run together as concurrent streams"},
      {"--out FILE", "write float32 .npy [positions, vocab]; with --batch a prefix: FILE.<line>.npy"},
      {"--chunks A,B,C", "feed the tokens as calls of these sizes, the rest one token per call"},
      {"--save-at K", "process the first K tokens, save the state to --state FILE, stop"},
      {"--state FILE", "where --save-at writes the sequence state"},
      {"--resume FILE", "restore a saved state (its tokens must be a prefix of --tokens) and process the rest"},
      O_MODE, O_KV, O_DEVICE, O_THREADS, {NULL, NULL}}},
    {"generate", "generate tokens",
     "dsv4 generate -m DIR (-p TEXT | --tokens LIST | --batch FILE) [options]",
     {O_MODEL,
      {"-p, --prompt TEXT", "prompt text (needs the checkpoint's tokenizer.json)"},
      {"--tokens LIST", "prompt as comma-separated token ids, or @FILE"},
      {"--batch FILE", "one prompt per non-empty line (text or ids), run by the continuous-batching scheduler"},
      {"-n N", "tokens to generate per prompt (default 64)"},
      O_SAMPLING,
      {"--spec none|ngram|self|mtp|dspark", "speculative decoding drafter (default none; output is lossless)"},
      {"--draft N", "tokens drafted per step"},
      {"--spec-threshold C", "DSpark: stop drafting when the survival product falls below C (0..1, default 0 = off)"},
      {"--max-streams N", "--batch: streams decoding at once (default 16)"},
      {"--step-tokens N", "--batch: token budget of one step (default 256)"},
      O_PCACHE,
      {"--json-schema FILE", "constrain the output to JSON valid for this schema (a JSON Schema subset)"},
      {"--json", "constrain the output to one JSON value"},
      {"--grammar FILE", "constrain the output to this grammar (GBNF-like: name ::= alternatives)"},
      {"--json-ws N", "with --json-schema / --json: at most N whitespace bytes in each gap JSON allows (default 4)"},
      {"--ids", "print the generated token ids, comma-separated, on one line"},
      {"--stats", "timing, acceptance and cache statistics on stderr"},
      O_MODE, O_KV, O_DEVICE, O_THREADS, {NULL, NULL}}},
    {"chat", "interactive chat",
     "dsv4 chat -m DIR [options]   (then /think /nothink /reset /quit)",
     {O_MODEL,
      {"--system TEXT", "system prompt"},
      {"--think", "start in thinking mode"},
      {"-n N", "maximum tokens per reply (default 512)"},
      O_SAMPLING, O_PCACHE,
      {"--stats", "after each reply, one stderr line: turn, tokens, position"},
      O_MODE, O_KV, O_DEVICE, O_THREADS, {NULL, NULL}}},
    {"tokenize", "text <-> token ids",
     "dsv4 tokenize (-m DIR | --tokenizer FILE) (--text T | --file F) [options]",
     {{"-m DIR", "use the checkpoint folder's tokenizer.json"},
      {"--tokenizer FILE", "use this tokenizer.json"},
      {"--text T", "the input"},
      {"--file F", "read the input from a file"},
      {"--lines", "one output line per input line"},
      {"--jsonl", "like --lines, every line a JSON string (so texts may hold newlines)"},
      {"--decode", "input is token ids, output text"},
      {"--plain", "do not match added/special tokens (untrusted text)"},
      {NULL, NULL}}},
    {"render", "print the V4 prompt for a conversation",
     "dsv4 render --messages FILE.json [options]",
     {{"--messages FILE.json", "{\"messages\": [...], \"mode\": ..., \"effort\": ...} in the OpenAI shapes"},
      {"--encoder v4|v4-0731", "prompt encoder (overrides the file's)"},
      {"--mode chat|thinking", "overrides the file's mode"},
      {"--effort none|high|max", "reasoning effort (overrides the file's)"},
      {NULL, NULL}}},
    {"state", "inspect saved sequence state",
     "dsv4 state inspect FILE   (header, writer version, per-layer sizes, bytes per token; checksum verified)",
     {{NULL, NULL}}},
    {"bench", "benchmarks",
     "dsv4 bench (-m DIR | --synthetic flash-2g|small|flash|pro) [options]",
     {O_MODEL,
      {"--synthetic flash-2g|small|flash|pro", "write (once, to /tmp) and load a synthetic model of this size; flash and pro "
                                              "are the real V4 shapes, generated where the model reads them (GPU or host memory; DSV4_SYNTHETIC_HOST_GB)"},
      {"--route-skew S", "with --synthetic: a router bias of -S ln(1 + rank) over a random ranking of each layer's experts, so that "
                         "routing favours a few (a separate folder, ...-skewS); measure it with dsv4 profile and inspect"},
      {"--prompt N", "prompt tokens of the single-stream run (default 128)"},
      {"--prefill-chunk N", "prefill the prompt in steps of at most N tokens (default: one step)"},
      {"--warmup", "time the prefill after an untimed one of the same prompt on another sequence (the step's buffers grown and touched, as after a server's first request; llama-bench warms up likewise)"},
      {"--decode N", "decoded tokens per run (default 32)"},
      {"--streams LIST", "also decode with 1,2,4,... streams together"},
      {"--spec LIST", "also compare drafters: none,ngram,self,mtp,dspark (with --streams: also inside the scheduler)"},
      {"--tokenizer", "benchmark the tokenizer instead (-m DIR holds tokenizer.json)"},
      {"--context LIST", "also decode after contexts of these lengths (e.g. 4096,131072,1048576; the sequence jumps there with all-zero rows instead of a prefill)"},
      {"--json FILE", "also write the numbers (model, bandwidth, single stream, host experts, streams) as JSON to FILE"},
      {"--no-bandwidth", "skip the memory bandwidth and multiply-add peak measurements"},
      {"--profile", "time of each stage of the step (GPU or CPU), prefill and decode separately, the decode at each --context, and the decode steps of the last --streams count"},
      {"--kernel-trace", "with --device cuda: 8 more decode steps and a verify step with every GPU kernel's times recorded (CUPTI, libcupti loaded at run time): a step's span, the time no kernel ran, its kernels by time"},
      {"--isa avx512bf16|avx512|avx2|scalar", "the CPU kernels' instruction set (default: $DSV4_ISA, else the best this CPU "
                                   "has; the same bits whichever runs)"},
      {"--grammar", "constrained-decoding masks instead: trie build, schema compile, per-token mask time "
                    "(-m DIR holds tokenizer.json; when DIR is also a checkpoint, the masks' share of a batched "
                    "decode step)"},
      O_MODE, O_KV, O_DEVICE, O_THREADS, {NULL, NULL}}},
    {"profile", "record how often each layer routes to each expert (the placement profile for --gpu-mem)",
     "dsv4 profile -m DIR --file PROMPTS [options]",
     {O_MODEL,
      {"--file PROMPTS", "one prompt per line: text (needs the tokenizer) or token ids 1,2,3"},
      {"--out FILE", "where to write the profile (default DIR/expert_profile.json, where loads find it)"},
      {"--generate N", "also decode N greedy tokens after each prompt (default 0)"},
      {"--chunk N", "prefill chunk in tokens (default 512; the counts do not depend on it)"},
      O_MODE, O_DEVICE, O_THREADS, {NULL, NULL}}},
    {"serve", "OpenAI- and Anthropic-compatible HTTP server",
     "dsv4 serve -m DIR [options]   (prints `dsv4: listening on http://HOST:PORT` on stderr when ready)",
     {O_MODEL,
      {"--host ADDR", "address to bind: IPv4, IPv6 or localhost (default 127.0.0.1)"},
      {"--port N", "port (default 8000; 0 = any free port, printed in the listening line)"},
      {"--api-key KEY", "require Authorization: Bearer KEY or x-api-key: KEY on every endpoint but /health"},
      {"--max-streams N", "requests generating at once in the scheduler (default 16)"},
      {"--max-queue N", "requests waiting beyond those; more get 429 (default 256)"},
      {"--ctx N", "prompt + max_tokens limit (default the model's positions, at most 65536)"},
      {"--step-tokens N", "token budget of one scheduler step (default 512)"},
      {"--spec none|ngram|mtp|dspark|self", "speculative decoding of every stream inside the scheduler (default none; lossless)"},
      {"--draft N", "tokens drafted per step (default: mtp 1, dspark its block size, others 4)"},
      {"--spec-threshold C", "DSpark: stop drafting when the survival product falls below C (0..1, default 0 = off)"},
      {"--prefix-cache-mb N", "in-memory prefix cache budget in MiB (default 1024; 0 = off)"},
      {"--prefix-cache-dir DIR", "also keep prefix states in DIR"},
      {"--prefix-cache-disk-mb N", "byte budget of that folder in MiB (default 4096)"},
      {"--served-model-name NAME", "model name clients use (default the folder's name)"},
      {"--encoder v4|v4-0731", "chat encoder of the checkpoint (default v4)"},
      {"--max-connections N", "open connections at once (default 512)"},
      {"--max-body-mb N", "largest request body in MiB; larger get 413 (default 8)"},
      O_MODE, O_KV, O_DEVICE, O_THREADS, {NULL, NULL}}},
};

static const cmd_help *find(const char *name) {
    for (size_t i = 0; i < sizeof HELP / sizeof HELP[0]; i++)
        if (!strcmp(HELP[i].name, name)) return &HELP[i];
    return NULL;
}

const char *cli_help_summary(const char *name) {
    const cmd_help *h = find(name);
    return h ? h->summary : "(undocumented)";
}

static void print_command(FILE *f, const cmd_help *h) {
    fprintf(f, "%s\n", h->synopsis);
    for (const opt_help *o = h->opts; o->spelling; o++) {
        /* long spellings get their own line, so the text column stays readable */
        if (strlen(o->spelling) < 28) fprintf(f, "  %-28s %s\n", o->spelling, o->text);
        else fprintf(f, "  %s\n  %-28s %s\n", o->spelling, "", o->text);
    }
}

int cli_help_command(FILE *f, const char *name) {
    const cmd_help *h = find(name);
    if (!h) return -1;
    print_command(f, h);
    return 0;
}

void cli_help_options(FILE *f) {
    fprintf(f, "\nglobal options:\n");
    fprintf(f, "  %-28s %s\n", "-h, --help", "this text (also: dsv4 help [COMMAND], dsv4 COMMAND --help)");
    fprintf(f, "  %-28s %s\n", "--version", "version, git commit and build options");
    for (size_t i = 0; i < sizeof HELP / sizeof HELP[0]; i++) {
        fputc('\n', f);
        print_command(f, &HELP[i]);
    }
    fprintf(f, "\nEvery command exits 0 on success and otherwise prints one line on stderr and exits non-zero.\n"
               "The manual: man dsv4. The C library: include/dsv4.h, docs/API.md.\n");
}
