/* The grammar form of constrained output (dsv4 generate --grammar FILE): a GBNF-like text compiled into the
 * byte grammar of grammar_ir.h.
 *
 *   # a comment runs to the end of the line
 *   root   ::= answer " because " reason "."        # generation starts at the rule named root
 *   answer ::= "yes" | "no"
 *   reason ::= [a-z ]{1,40}
 *
 * A rule is `name ::= alternatives`; names are [A-Za-z0-9_-]+ and may be used before they are defined; a rule
 * ends where the next `name ::=` starts, so rules may span lines. Alternatives are separated by |; an
 * alternative is a sequence of items, each optionally followed by a quantifier:
 *   "text"        a literal (UTF-8), escapes \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH
 *   [a-z0-9_]     one character from a class; [^...] negates; ranges and the escapes above (plus \] \[ \- \^)
 *   .             any one character
 *   @"text"       the special (added) token with this text, as one token: e.g. @"｜DSML｜" or @"</think>"
 *                 (one line, no escapes). The vocabulary must have it (an error at matcher creation
 *                 otherwise); it counts as one byte of the length bound
 *   name          a rule
 *   ( ... )       a group of alternatives
 *   x* x+ x?      zero or more, one or more, optional
 *   x{n} x{n,} x{n,m}   counted (n, m <= 100000)
 * Characters are Unicode scalar values; the output is always well-formed UTF-8. Special tokens appear only where
 * the grammar names them with @"...": text is never matched by a special token, nor a special token by text. Errors give the line: left recursion (a rule that can start with itself), a
 * rule used but never defined, a rule that can never finish, a missing root. */
#ifndef DSV4_ENGINE_GRAMMAR_H
#define DSV4_ENGINE_GRAMMAR_H
#include "dsv4.h"
#include "engine/grammar_ir.h"
#include <stddef.h>

int dsv4_grammar_from_gbnf(const char *text, size_t n, dsv4_grammar **out, dsv4_error *err);
#endif
