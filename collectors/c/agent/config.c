/* The config files: read, checked against the schema's keys, kept as items for options.c; and the
 * settings in force as --print-config shows them. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const struct fs_config_key fs_config_keys[FS_NCONFIG_KEYS] = FS_CONFIG_KEYS_INIT;

static int by_key(const void *name, const void *key)
{
    return strcmp(name, ((const struct fs_config_key *)key)->name);
}

int config_key_find(const char *name)
{
    const struct fs_config_key *k = bsearch(name, fs_config_keys, FS_NCONFIG_KEYS, sizeof *k, by_key);
    return k ? (int)(k - fs_config_keys) : -1;
}

/* -- a document's entries ---------------------------------------------------------------------- */

static const char *type_name(enum fs_config_type t, int plural)
{
    static const char *const one[] = {"a string", "an integer", "a number", "a boolean"};
    static const char *const many[] = {"strings", "integers", "numbers", "booleans"};
    return plural ? many[t] : one[t];
}

static const char *kind_name(enum toml_kind k)
{
    static const char *const names[] = {"a string", "an integer", "a float", "a boolean"};
    return names[k];
}

static int fits(enum fs_config_type t, enum toml_kind k)
{
    switch (t) {
    case FS_CT_STRING:
        return k == TOML_STRING;
    case FS_CT_INTEGER:
        return k == TOML_INTEGER;
    case FS_CT_NUMBER:
        return k == TOML_INTEGER || k == TOML_FLOAT;
    default:
        return k == TOML_BOOLEAN;
    }
}

static int wrong_type(const struct fs_config_key *k, const char *got, char *err, size_t errlen)
{
    if (k->list)
        snprintf(err, errlen, "%s: expected %s or an array of %s, got %s", k->name, type_name(k->type, 0),
                 type_name(k->type, 1), got);
    else
        snprintf(err, errlen, "%s: expected %s, got %s", k->name, type_name(k->type, 0), got);
    return -1;
}

/* The value as the key's option takes it, in *out (to free): its text; a float where an integer
 * is wanted, if it is one, in digits. */
static int option_text(const struct fs_config_key *k, const struct toml_value *v, char **out, char *err, size_t errlen)
{
    char digits[400]; /* %.0f of any double */
    const char *text = v->text;
    if (k->type == FS_CT_INTEGER && v->kind == TOML_FLOAT) {
        double d = strtod(v->text, NULL);
        if (!isfinite(d) || d != floor(d)) {
            snprintf(err, errlen, "%s: expected an integer, got %s", k->name, v->text);
            return -1;
        }
        snprintf(digits, sizeof digits, "%.0f", d);
        text = digits;
    } else if (!fits(k->type, v->kind)) {
        return wrong_type(k, kind_name(v->kind), err, errlen);
    }
    if (!(*out = strdup(text))) {
        snprintf(err, errlen, "%s: out of memory", k->name);
        return -1;
    }
    return 0;
}

/* Takes value, freeing it if it cannot. */
static int add_item(struct config_files *f, int key, const char *path, int line, char *value)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 32;
        struct config_item *grown = realloc(f->items, cap * sizeof *grown);
        if (!grown) {
            free(value);
            return -1;
        }
        f->items = grown;
        f->cap = cap;
    }
    f->items[f->n++] = (struct config_item){key, path, line, value};
    return 0;
}

static int take_entry(const struct toml_entry *e, const char *path, struct config_files *out, char *err, size_t errlen)
{
    int key = config_key_find(e->key);
    if (key < 0) {
        snprintf(err, errlen, "%s: unknown key (not one of agent-config.schema.json's)", e->key);
        return -1;
    }
    const struct fs_config_key *k = &fs_config_keys[key];
    if (e->array && !k->list)
        return wrong_type(k, "an array", err, errlen);
    for (size_t i = 0; i < e->n; i++) {
        char *value;
        if (option_text(k, &e->values[i], &value, err, errlen) != 0)
            return -1;
        if (add_item(out, key, path, e->line, value) != 0) {
            snprintf(err, errlen, "%s: out of memory", k->name);
            return -1;
        }
    }
    return 0;
}

int config_take_doc(const struct toml_doc *doc, const char *path, struct config_files *out, int *line, char *err,
                    size_t errlen)
{
    for (size_t i = 0; i < doc->n; i++)
        if (take_entry(&doc->entries[i], path, out, err, errlen) != 0) {
            *line = doc->entries[i].line;
            return -1;
        }
    return 0;
}

void config_files_free(struct config_files *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->items[i].value);
    free(f->items);
    for (size_t i = 0; i < f->npaths; i++)
        free(f->paths[i]);
    free(f->paths);
    memset(f, 0, sizeof *f);
}

/* -- the files --------------------------------------------------------------------------------- */

static const char *environment(const char *name)
{
    return getenv(name);
}

static int cannot_read(const char *path, int err)
{
    fs_refuse("%s: cannot read: %s", path, strerror(err));
    return -1;
}

/* A copy of path, kept as long as the items that name it: NULL if out of memory. */
static const char *keep_path(struct config_files *f, const char *path)
{
    if (f->npaths == f->paths_cap) {
        size_t cap = f->paths_cap ? f->paths_cap * 2 : 8;
        char **grown = realloc(f->paths, cap * sizeof *grown);
        if (!grown)
            return NULL;
        f->paths = grown;
        f->paths_cap = cap;
    }
    char *copy = strdup(path);
    if (copy)
        f->paths[f->npaths++] = copy;
    return copy;
}

/* The whole file in *text (to free), its length in *len: 0, or -1 once a message said why. */
static int slurp(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return cannot_read(path, errno);
    char *buf = malloc(CONFIG_FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, CONFIG_FILE_MAX + 1, f) : 0;
    int err = !buf ? ENOMEM : ferror(f) ? errno : 0;
    fclose(f);
    if (err) {
        free(buf);
        return cannot_read(path, err);
    }
    if (n > CONFIG_FILE_MAX) {
        free(buf);
        fs_refuse("%s: larger than the limit of %d bytes", path, CONFIG_FILE_MAX);
        return -1;
    }
    *text = buf;
    *len = n;
    return 0;
}

static int read_file(const char *given, struct config_files *out)
{
    const char *path = keep_path(out, given);
    char *text = NULL, err[700];
    size_t len = 0;
    if (!path)
        return cannot_read(given, ENOMEM);
    if (slurp(path, &text, &len) != 0)
        return -1;
    struct toml_doc doc;
    int line = 0;
    int rc = toml_parse(text, len, environment, &doc, &line, err, sizeof err);
    if (rc == 0)
        rc = config_take_doc(&doc, path, out, &line, err, sizeof err);
    if (rc != 0)
        fs_refuse("%s:%d: %s", path, line, err);
    toml_free(&doc);
    free(text);
    return rc;
}

static int is_config_name(const char *name)
{
    size_t n = strlen(name);
    return name[0] != '.' && n > 5 && strcmp(name + n - 5, ".toml") == 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* The config files' names in dir, sorted: 0, or -1 once a message said why. */
static int list_dir(const char *dir, char ***names, size_t *count)
{
    DIR *d = opendir(dir);
    if (!d)
        return cannot_read(dir, errno);
    size_t n = 0, cap = 0;
    char **list = NULL;
    int err = 0;
    for (;;) { /* errno tells readdir's end from its failure */
        errno = 0;
        struct dirent *ent = readdir(d);
        if (!ent) {
            err = errno;
            break;
        }
        if (!is_config_name(ent->d_name))
            continue;
        if (n == cap) {
            size_t bigger = cap ? cap * 2 : 16;
            char **grown = realloc(list, bigger * sizeof *grown);
            if (!grown) {
                err = ENOMEM;
                break;
            }
            list = grown;
            cap = bigger;
        }
        if (!(list[n] = strdup(ent->d_name))) {
            err = ENOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (err) {
        free_names(list, n);
        return cannot_read(dir, err);
    }
    qsort(list, n, sizeof *list, by_name);
    *names = list;
    *count = n;
    return 0;
}

static int read_dir(const char *dir, struct config_files *out)
{
    char **names = NULL;
    size_t n = 0;
    if (list_dir(dir, &names, &n) != 0)
        return -1;
    size_t dl = strlen(dir);
    const char *sep = dl && dir[dl - 1] == '/' ? "" : "/";
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *path = NULL;
        if (asprintf(&path, "%s%s%s", dir, sep, names[i]) < 0)
            rc = cannot_read(dir, ENOMEM);
        else
            rc = read_file(path, out);
        free(path);
    }
    free_names(names, n);
    return rc;
}

int config_read(const char *file, const char *dir, struct config_files *out)
{
    memset(out, 0, sizeof *out);
    if (file && read_file(file, out) != 0)
        return -1;
    if (dir || !file)
        return dir ? read_dir(dir, out) : 0;
    const char *slash = strrchr(file, '/');
    char *beside = NULL; /* agent.d in file's folder, if there is one */
    if (asprintf(&beside, "%.*sagent.d", slash ? (int)(slash - file + 1) : 0, file) < 0)
        return cannot_read(file, ENOMEM);
    struct stat st;
    int rc = stat(beside, &st) != 0 && errno == ENOENT ? 0 : read_dir(beside, out);
    free(beside);
    return rc;
}

/* -- the settings in force --------------------------------------------------------------------- */

int config_settings_put(struct config_settings *s, int key, const char *value)
{
    struct config_slot *slot = &s->slot[key];
    if (!fs_config_keys[key].list)
        slot->n = 0;
    if (slot->n == slot->cap) {
        size_t cap = slot->cap ? slot->cap * 2 : 1;
        const char **grown = realloc(slot->values, cap * sizeof *grown);
        if (!grown)
            return -1;
        slot->values = grown;
        slot->cap = cap;
    }
    slot->values[slot->n++] = value;
    return 0;
}

void config_settings_clear(struct config_settings *s, int key)
{
    s->slot[key].n = 0;
}

void config_settings_free(struct config_settings *s)
{
    for (int k = 0; k < FS_NCONFIG_KEYS; k++)
        free(s->slot[k].values);
    memset(s, 0, sizeof *s);
}

/* A value as its option took it (checked by then): a JSON number, boolean or string. */
static void json_value(enum fs_config_type type, const char *value, struct fs_buf *out)
{
    switch (type) {
    case FS_CT_INTEGER:
        fs_buf_int(out, strtoll(value, NULL, 10));
        break;
    case FS_CT_NUMBER:
        fs_buf_double(out, strtod(value, NULL));
        break;
    case FS_CT_BOOLEAN:
        fs_buf_puts(out, strcmp(value, "true") == 0 ? "true" : "false");
        break;
    default:
        fs_buf_json_string(out, value);
    }
}

void config_settings_json(const struct config_settings *s, struct fs_buf *out)
{
    fs_buf_puts(out, "{");
    for (int k = 0; k < FS_NCONFIG_KEYS; k++) {
        const struct fs_config_key *key = &fs_config_keys[k];
        const struct config_slot *slot = &s->slot[k];
        fs_buf_puts(out, k ? ", " : "");
        fs_buf_json_string(out, key->name);
        fs_buf_puts(out, key->list ? ": [" : ": ");
        for (size_t i = 0; i < slot->n; i++) {
            fs_buf_puts(out, i ? ", " : "");
            json_value(key->type, slot->values[i], out);
        }
        fs_buf_puts(out, key->list ? "]" : slot->n ? "" : "null");
    }
    fs_buf_puts(out, "}\n");
}
