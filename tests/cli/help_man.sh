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

# What the code parses: every strcmp(..., "-x") literal of src/cli/cmd_NAME.c and every getopt_long table entry
# there; the options of the shared helpers in the other src/cli files (cli_sampling_option in common.c,
# cli_constraint_option in gen_constraint.c, ...), function by function, for the commands that call them; main.c's
# global ones. -h/--help of a command is answered by main.c for every command, so it is not listed per command.
opt_literals() {   # stdin: C source -> option spellings
    { tee "$T/src.tmp" | grep -oE 'strcmp\([^,()]*, *"-[^"]*"\)'
      grep -oE '\{ *"[a-z][a-z0-9-]*", *(no|required|optional)_argument' "$T/src.tmp" | sed -E 's/^\{ *"([^"]*)".*/"--\1"/'
    } | grep -oE '"-[^"]*"' | tr -d '"' | grep -vxE -- '-h|--help'
}
helper_options() {   # "function option" for every non-static function of the helper files
    local f
    for f in "$SRC"/*.c; do
        case $(basename "$f") in cmd_*|main.c|help.c) continue ;; esac
        awk '/^[a-z][^;]*\(/ && !/^static/ { fn = $0; sub(/\(.*/, "", fn); sub(/.*[ *]/, "", fn) }
             /^}/ { print "@@end"; fn = "" }
             fn != "" { print fn "\t" $0 }' "$f"
    done | awk -F'\t' 'NF > 1 { print $1 "\t" $2 }' >"$T/helpers.src"
    cut -f1 "$T/helpers.src" | sort -u | while read -r fn; do
        awk -F'\t' -v fn="$fn" '$1 == fn { print $2 }' "$T/helpers.src" | opt_literals | sed "s/^/$fn /"
    done
}
source_pairs() {
    local f name
    helper_options >"$T/helper.pairs"
    for f in "$SRC"/cmd_*.c; do
        name=$(basename "$f" .c); name=${name#cmd_}
        { opt_literals <"$f"
          cut -d' ' -f1 "$T/helper.pairs" | sort -u | while read -r fn; do
              grep -qE "\b$fn\(" "$f" && awk -v fn="$fn" '$1 == fn { print $2 }' "$T/helper.pairs"
          done
        } | sed "s/^/$name /"
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
