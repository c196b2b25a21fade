/* The agents' config files (src/flowstat/schema/agent-config.schema.json): --config FILE, then the
 * *.toml files of --config-dir DIR in name order. Each key stands for an option of the command line
 * (build/config_keys.h, generated from the schema: never a list written by hand); each value is
 * checked against the key's type and written as that option would be given it, for options.c to
 * take as it takes the option, with the same checks. */
#ifndef FLOWSTAT_CONFIG_H
#define FLOWSTAT_CONFIG_H

#include <stddef.h>

#include "config_keys.h"
#include "tomlread.h"
#include "util.h"

#define CONFIG_FILE_MAX (1 << 20) /* bytes: a larger config file is refused */

extern const struct fs_config_key fs_config_keys[FS_NCONFIG_KEYS];

/* The key's index in fs_config_keys, or -1. */
int config_key_find(const char *name);

/* One value of a file, as its option would be given it. */
struct config_item {
    int key; /* in fs_config_keys */
    const char *path; /* the file: as given, or joined to its folder */
    int line; /* the key's, from 1 */
    char *value; /* a number's text, "true" or "false", a string; one item of a list */
};

/* What the files said, in their order: a list's items one by one. */
struct config_files {
    struct config_item *items;
    size_t n, cap;
    char **paths; /* the files read: the items' paths */
    size_t npaths, paths_cap;
};

/* Read file (NULL: none), then every *.toml not starting with '.' of dir in strcmp order (dir
 * NULL: the agent.d beside file, if there is one). 0, or -1 once a message on stderr said why
 * ("flowstat-agent: FILE: cannot read: ...", "flowstat-agent: FILE:LINE: KEY: WHY"). Call
 * config_files_free after it, whatever it answered. */
int config_read(const char *file, const char *dir, struct config_files *out);
/* The entries of a document read from path, as items: each key one of the schema's, each value of
 * its type (a list's: an array, or one value). 0, or -1 with the line in *line and "KEY: WHY" in
 * err. */
int config_take_doc(const struct toml_doc *doc, const char *path, struct config_files *out, int *line, char *err,
                    size_t errlen);
void config_files_free(struct config_files *f);

/* The settings in force: each key's values as its option took them (a scalar's last one, a list's
 * all). The values are not copied. */
struct config_settings {
    struct config_slot {
        const char **values;
        size_t n, cap;
    } slot[FS_NCONFIG_KEYS];
};
/* A scalar key's value replaced, or a list key's added to: 0, or -1 if out of memory. */
int config_settings_put(struct config_settings *s, int key, const char *value);
void config_settings_clear(struct config_settings *s, int key);
void config_settings_free(struct config_settings *s);
/* One JSON object on one line: every key, sorted; a list as an array, an unset scalar as null. */
void config_settings_json(const struct config_settings *s, struct fs_buf *out);

#endif
