/* The dsv4 command-line tool: one file per command, each exporting `int cmd_NAME(int argc, char **argv)`
 * (argv[0] is the command name). A command prints a one-line message on stderr and returns non-zero on error. */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H
#include "dsv4.h"

/* Print "dsv4 <cmd>: <message>" on stderr and return 1. */
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, from a dsv4_error. */
int cli_fail(const char *cmd, const dsv4_error *err);

/* Parse helpers: return 0 on success, print an error and return 1 otherwise. */
int cli_parse_int(const char *cmd, const char *opt, const char *s, long long lo, long long hi, long long *out);
int cli_parse_float(const char *cmd, const char *opt, const char *s, double *out);
/* Parse "1,2,3" or "@FILE" (a file holding such a list) into a heap array of int32. */
int cli_parse_tokens(const char *cmd, const char *s, int32_t **out, int *n);
/* --mode exact|official into *mode. */
int cli_parse_mode(const char *cmd, const char *s, dsv4_mode *mode);
/* --device cpu|cuda into *device (a dsv4_device). */
int cli_parse_device(const char *cmd, const char *s, int *device);
/* --gpus N: 1..16 */
int cli_parse_gpus(const char *cmd, const char *s, int *gpus);
/* Where and by which kernels the weights are computed: --gpu-mem GB, --expert-profile FILE, --bus-share F and
 * --bus-by-token (experts in host memory when the weights do not fit the GPU budget, and the share of them, or of
 * each token's routes to them, the GPU reads over the bus; cli_placement_option: when argv[*i] is one, consume it and
 * its value into pl and return 1; 0 when it is not one; -1 after printing an error) and --amx (OFFICIAL mode on
 * the CPU: the linears with bf16 inputs on AMX tiles; cli_amx_option: 1 when arg is it). cli_placement_apply
 * copies them into load options. */
typedef struct {
    double gpu_mem_gb;
    const char *expert_profile;
    double bus_share;   /* --bus-share F: as dsv4_load_opts.bus_share (0 = the default, negative = none) */
    int bus_by_token;   /* --bus-by-token: dsv4_load_opts.bus_by_token */
    int cpu_amx;
} cli_placement;
int  cli_placement_option(const char *cmd, int argc, char **argv, int *i, cli_placement *pl);
int  cli_amx_option(const char *arg, cli_placement *pl);
void cli_placement_apply(const cli_placement *pl, dsv4_load_opts *lo);
/* The sampling options (--temp --top-p --min-p --top-k --seed), shared by generate and chat: when argv[*i] is
 * one, consume it (and its value) into sp and return 1; 0 when it is not one; -1 after printing an error. */
int cli_sampling_option(const char *cmd, int argc, char **argv, int *i, void *sampling /* dsv4_sampling * */);
/* argv[i+1] for option argv[i], or an error when it is missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

/* help.c: the one table of commands and options behind --help (and checked against docs/dsv4.1). */
#include <stdio.h>
const char *cli_help_summary(const char *name);
int  cli_help_command(FILE *f, const char *name);   /* -1: no such command */
void cli_help_options(FILE *f);

int cmd_tiny(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_state(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_profile(int argc, char **argv);
#endif
