/* dsv4 entry point: dispatch to one command. Commands not linked into this build are reported as such. */
#include "cli/cli.h"
#include <stdio.h>
#include <string.h>

/* Weak references: a command whose file is not part of the build resolves to NULL. */
#pragma weak cmd_tiny
#pragma weak cmd_inspect
#pragma weak cmd_logits
#pragma weak cmd_generate
#pragma weak cmd_bench
#pragma weak cmd_tokenize
#pragma weak cmd_render
#pragma weak cmd_chat
#pragma weak cmd_state
#pragma weak cmd_serve

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"tiny", cmd_tiny, "write a synthetic checkpoint in the official format"},
    {"inspect", cmd_inspect, "show a checkpoint's config, tensors, memory and problems"},
    {"logits", cmd_logits, "per-position logits as .npy"},
    {"generate", cmd_generate, "generate tokens"},
    {"chat", cmd_chat, "interactive chat"},
    {"tokenize", cmd_tokenize, "text <-> token ids"},
    {"render", cmd_render, "print the V4 prompt for a conversation"},
    {"state", cmd_state, "inspect saved sequence state"},
    {"bench", cmd_bench, "benchmarks"},
    {"serve", cmd_serve, "OpenAI- and Anthropic-compatible HTTP server"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].fn) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) { usage(stdout); return 0; }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        if (!commands[i].fn) {
            fprintf(stderr, "dsv4 %s: this command is not built yet\n", argv[1]);
            return 2;
        }
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "dsv4: unknown command '%s' (try dsv4 --help)\n", argv[1]);
    return 2;
}
