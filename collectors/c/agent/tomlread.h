/* The TOML the agents' config files are written in (agent-config.schema.json), a subset: blank
 * lines, # comments, and `key = value` lines with a bare key; a value is a string ("..." with
 * TOML's escapes, or '...'), an integer, a float, true or false, or an array of those (over several
 * lines if need be, comments and a trailing comma allowed). ${NAME} in a string is the environment
 * variable NAME ($${ a literal ${). Refused, as TOML or as flowstat's agent config does not take
 * them: tables, inline tables, dotted and quoted keys, dates and times, multi-line strings, arrays
 * of arrays, a key given twice, text that is not UTF-8, anything malformed. */
#ifndef FLOWSTAT_TOMLREAD_H
#define FLOWSTAT_TOMLREAD_H

#include <stddef.h>

#define TOML_KEY_MAX 100 /* a longer key is refused: no schema key is near it */

enum toml_kind { TOML_STRING, TOML_INTEGER, TOML_FLOAT, TOML_BOOLEAN };

struct toml_value {
    enum toml_kind kind;
    /* A string's text (UTF-8, no NUL, ${NAME} replaced); an integer in decimal; a float as written
     * without its '_' (strtod reads it: "1.5e3", "inf", "-nan"); "true" or "false". */
    char *text;
};

struct toml_entry {
    char *key;
    int line; /* where the key is, from 1 */
    int array; /* written [ ... ]: its values are the items (none, for []) */
    struct toml_value *values;
    size_t n, cap;
};

struct toml_doc {
    struct toml_entry *entries; /* in the order written */
    size_t n, cap;
};

/* The environment: a variable's value, or NULL when it is not set. */
typedef const char *(*toml_lookup_fn)(const char *name);

/* Read text[0..len) into doc (zeroed first): 0, or -1 with the line of the error (from 1) in
 * *err_line and what is wrong in err ("KEY: WHY" while a key's value is read, else "WHY"). Either
 * way call toml_free after it. */
int toml_parse(const char *text, size_t len, toml_lookup_fn lookup, struct toml_doc *doc, int *err_line, char *err,
               size_t errlen);
void toml_free(struct toml_doc *doc);

#endif
