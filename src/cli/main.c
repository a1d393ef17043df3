/* dsv4 entry point: dispatch to one command. Commands not linked into this build are reported as such.
 * The help texts live in help.c; --version here. */
#include "backend/cpu/isa.h"
#include "cli/cli.h"
#include "util/version.h"
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
#pragma weak cmd_profile

static const struct {
    const char *name;
    int (*fn)(int, char **);
} commands[] = {
    {"tiny", cmd_tiny},
    {"inspect", cmd_inspect},
    {"logits", cmd_logits},
    {"generate", cmd_generate},
    {"chat", cmd_chat},
    {"tokenize", cmd_tokenize},
    {"render", cmd_render},
    {"state", cmd_state},
    {"bench", cmd_bench},
    {"serve", cmd_serve},
    {"profile", cmd_profile},
};

static int is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help") || !strcmp(a, "help"); }

/* The command list, then (full) every command's synopsis and options. */
static void usage(FILE *f, int full) {
    fprintf(f, "usage: dsv4 <command> [options]\n       dsv4 --version | --help | help [COMMAND]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].fn) fprintf(f, "  %-10s %s\n", commands[i].name, cli_help_summary(commands[i].name));
    if (full) cli_help_options(f);
    else fprintf(f, "\ndsv4 --help lists every option.\n");
}

static void version(void) {
    printf("dsv4 %s\n", dsv4_version());
    printf("commit: %s\n", dsv4_build_commit());
    printf("build: %s; cpu kernels %s, this cpu runs %s\n", dsv4_build_options(), cpu_kernels_built(),
           cpu_kernels_best()->name);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr, 0); return 2; }
    if (!strcmp(argv[1], "--version")) { version(); return 0; }
    if (is_help(argv[1])) {
        if (argc > 2) {
            if (cli_help_command(stdout, argv[2])) {
                fprintf(stderr, "dsv4: no command '%s' (try dsv4 --help)\n", argv[2]);
                return 2;
            }
            return 0;
        }
        usage(stdout, 1);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        if (!commands[i].fn) {
            fprintf(stderr, "dsv4 %s: this command is not built yet\n", argv[1]);
            return 2;
        }
        /* dsv4 COMMAND --help: the same text as dsv4 help COMMAND, for every command */
        if (argc == 3 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help")) && !cli_help_command(stdout, argv[1]))
            return 0;
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "dsv4: unknown command '%s' (try dsv4 --help)\n", argv[1]);
    return 2;
}
