#!/usr/bin/env bash
# `dsv4 --help`, the man page docs/dsv4.1 and the options the commands really parse cannot drift apart (issue 19):
# the set of (command, option) pairs is extracted from each of the three and must be the same, and so must the
# lists of commands. The checker is first run on a man page with one option removed, which it must reject.
# Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"
MAN=${DSV4_ROOT:-.}/docs/dsv4.1
SRC=${DSV4_ROOT:-.}/src/cli

# "command option" lines from --help: sections start with "dsv4 NAME ..." (global options: "dsv4"), option lines
# with two spaces and a dash; the spellings end at the first run of two spaces.
help_pairs() {
    awk '
        /^global options:/ { cmd = "dsv4"; next }
        /^dsv4 [a-z]/      { cmd = $2; next }
        cmd != "" && /^  -/ {
            s = substr($0, 3); sub(/  .*/, "", s)
            n = split(s, w, /[ ,]+/)
            for (i = 1; i <= n; i++) if (w[i] ~ /^-/) print cmd, w[i]
        }' "$1" | sort -u
}
help_commands() { awk '/^commands:/ { on = 1; next } on && /^$/ { on = 0 } on { print $1 }' "$1" | sort; }
help_sections() { awk '/^dsv4 [a-z]/ { print $2 }' "$1" | sort; }

# The same from the man page: .TP tags under OPTIONS (global) and under each ".SS dsv4 NAME" of COMMANDS.
man_pairs() {
    awk '
        /^\.SH/ { sect = $2; cmd = (sect == "OPTIONS") ? "dsv4" : ""; next }
        /^\.SS/ { if (sect == "COMMANDS") { s = $0; gsub(/"/, "", s); split(s, w, " "); cmd = w[3] } next }
        /^\.TP/ { tag = 1; next }
        tag {
            tag = 0
            if (cmd == "") next
            s = $0; gsub(/\\f[BIRP]/, "", s); gsub(/\\-/, "-", s)
            n = split(s, w, /[ ,]+/)
            for (i = 1; i <= n; i++) if (w[i] ~ /^-/) print cmd, w[i]
        }' "$1" | sort -u
}
man_sections() { awk '/^\.SH/ { sect = $2 } /^\.SS/ && sect == "COMMANDS" { s = $0; gsub(/"/, "", s); split(s, w, " "); print w[3] }' "$1" | sort; }

# What the code parses: every strcmp(..., "-x") literal of src/cli/cmd_NAME.c (the sampling options of common.c
# where the command calls cli_sampling_option) and every getopt_long table entry, and main.c's global ones. -h/--help of a command is answered by
# main.c for every command, so it is not listed per command.
source_pairs() {
    local f name
    for f in "$SRC"/cmd_*.c; do
        name=$(basename "$f" .c); name=${name#cmd_}
        { grep -oE 'strcmp\([^,()]*, *"-[^"]*"\)' "$f"
          grep -q cli_sampling_option "$f" && grep -oE 'strcmp\([^,()]*, *"-[^"]*"\)' "$SRC/common.c"
          # getopt_long tables: {"port", required_argument, ...} is --port
          grep -oE '\{ *"[a-z][a-z0-9-]*", *(no|required|optional)_argument' "$f" | sed -E 's/^\{ *"([^"]*)".*/"--\1"/'
        } | grep -oE '"-[^"]*"' | tr -d '"' | grep -vxE -- '-h|--help' | sed "s/^/$name /"
    done
    grep -oE 'strcmp\([^,()]*, *"-[^"]*"\)' "$SRC/main.c" | grep -oE '"-[^"]*"' | tr -d '"' | sed 's/^/dsv4 /'
}
main_commands() { grep -oE '^ *\{"[a-z]+", cmd_[a-z]+\}' "$SRC/main.c" | grep -oE '"[a-z]+"' | tr -d '"' | sort; }

# same_set NAME A B: equal sorted lists, or a failure that names what differs
same_set() {
    if cmp -s "$2" "$3"; then ok; else bad "$1 differ: $(diff "$2" "$3" | grep '^[<>]' | tr '\n' ' ')"; fi
}

"$BIN" --help >"$T/help.txt" || bad "--help exits non-zero"
help_pairs "$T/help.txt" >"$T/help.pairs"
man_pairs "$MAN" >"$T/man.pairs"
source_pairs | sort -u >"$T/src.pairs"

# the checker itself: a man page missing one option must be caught (else this test could never fail)
[ "$(wc -l <"$T/help.pairs")" -gt 60 ] && ok || bad "only $(wc -l <"$T/help.pairs") options parsed from --help"
grep -v '^\\fB\\-\\-spec\\-threshold' "$MAN" >"$T/broken.1"
man_pairs "$T/broken.1" >"$T/broken.pairs"
cmp -s "$T/broken.pairs" "$T/help.pairs" && bad "the checker misses an option removed from the man page" || ok

same_set "options (< --help, > man page)" "$T/help.pairs" "$T/man.pairs"
same_set "options (< --help, > parsed in src/cli)" "$T/help.pairs" "$T/src.pairs"
help_commands "$T/help.txt" >"$T/c.help"
help_sections "$T/help.txt" >"$T/c.sect"
man_sections "$MAN" >"$T/c.man"
main_commands >"$T/c.main"
same_set "commands (< --help list, > main.c)" "$T/c.help" "$T/c.main"
same_set "commands (< --help list, > --help sections)" "$T/c.help" "$T/c.sect"
same_set "commands (< --help list, > man page)" "$T/c.help" "$T/c.man"

# one command's help, three ways, the same text; unknown commands are one-line errors
expect_ok "help tiny" "$BIN" help tiny
cp "$T/out" "$T/h1"
expect_ok "tiny --help" "$BIN" tiny --help
cmp -s "$T/out" "$T/h1" && ok || bad "dsv4 tiny --help differs from dsv4 help tiny"
awk '/^dsv4 tiny /{on=1} on && /^$/{exit} on' "$T/help.txt" | cmp -s - "$T/h1" && ok || bad "dsv4 help tiny is not the tiny section of --help"
expect_err "help of an unknown command" "no command" "$BIN" help nosuch
expect_err "unknown command" "unknown command" "$BIN" nosuch

# the man page renders without warnings (when groff is here)
if command -v groff >/dev/null; then
    w=$(groff -man -ww -z "$MAN" 2>&1)
    [ -z "$w" ] && ok || bad "groff warnings: $w"
fi
finish
