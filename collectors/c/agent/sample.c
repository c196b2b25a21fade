#include "sample.h"

#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <string.h>

/* A generated table's schema: NAME is its table (NAME_TAGS its tags), as gen_schema_header.py names them. */
#define FLAT_SCHEMA(measurement, name, count, time_field, kind)                                                    \
    {                                                                                                              \
        measurement, name, count, name##_TAGS, (int)(sizeof name##_TAGS / sizeof name##_TAGS[0]), time_field, kind \
    }

const struct fs_schema FS_SAMPLE_SCHEMA = FLAT_SCHEMA(FS_MEASUREMENT, FS_FIELDS, FS_NFIELDS, FS_F_TIME, FS_DOC_NODE);
const struct fs_schema FS_AGENT_SCHEMA =
    FLAT_SCHEMA(FS_AGENT_MEASUREMENT, FS_AGENT_FIELDS, FS_NAGENT_FIELDS, FS_A_TIME, FS_DOC_AGENT);
const struct fs_schema FS_EDGE_SCHEMA =
    FLAT_SCHEMA(FS_EDGE_MEASUREMENT, FS_EDGE_FIELDS, FS_NEDGE_FIELDS, FS_E_TIME, FS_DOC_EDGE);

void sample_clear_as(struct fs_sample *s, const struct fs_schema *schema)
{
    s->schema = schema;
    s->set = 0;
    s->time_ms = 0;
}

void sample_clear(struct fs_sample *s)
{
    sample_clear_as(s, &FS_SAMPLE_SCHEMA);
}

void sample_set_str(struct fs_sample *s, int f, const char *value)
{
    fs_strlcpy(s->v[f].s, value, sizeof s->v[f].s);
    s->set |= UINT64_C(1) << f;
}

void sample_set_int(struct fs_sample *s, int f, long long value)
{
    s->v[f].i = value;
    s->set |= UINT64_C(1) << f;
}

void sample_set_num(struct fs_sample *s, int f, double value)
{
    s->v[f].d = value;
    s->set |= UINT64_C(1) << f;
}

void sample_set_bool(struct fs_sample *s, int f, int value)
{
    s->v[f].i = value ? 1 : 0;
    s->set |= UINT64_C(1) << f;
}

/* The schemas' patterns, each compiled once (a table's pattern is a string constant: known by its
 * address). POSIX extended syntax, in the C locale the agent runs in: [a-z] is ASCII. */
#define PATTERNS_MAX 8
static struct compiled_pattern {
    const char *pattern;
    regex_t re;
    int ok;
} compiled[PATTERNS_MAX];
static int ncompiled;
static pthread_mutex_t compiled_lock = PTHREAD_MUTEX_INITIALIZER;

/* NULL if the pattern does not compile, or the table is full: then no value matches. */
static const regex_t *compiled_pattern(const char *pattern)
{
    const regex_t *re = NULL;
    pthread_mutex_lock(&compiled_lock);
    int i = 0;
    while (i < ncompiled && compiled[i].pattern != pattern)
        i++;
    if (i == ncompiled && i < PATTERNS_MAX) {
        compiled[i].pattern = pattern;
        compiled[i].ok = regcomp(&compiled[i].re, pattern, REG_EXTENDED | REG_NOSUB) == 0;
        ncompiled++;
    }
    if (i < ncompiled && compiled[i].ok)
        re = &compiled[i].re;
    pthread_mutex_unlock(&compiled_lock);
    return re;
}

static int matches_pattern(const char *pattern, const char *value)
{
    const regex_t *re = compiled_pattern(pattern);
    return re && regexec(re, value, 0, NULL, 0) == 0;
}

int field_value_allowed(const struct fs_field_def *def, const char *value)
{
    if (def->pattern && !matches_pattern(def->pattern, value))
        return 0;
    for (int k = 0; k < def->nvalues; k++)
        if (strcmp(def->values[k], value) == 0)
            return 1;
    return def->values == NULL;
}

int sample_value_allowed(enum fs_field f, const char *value)
{
    return field_value_allowed(&FS_FIELDS[f], value);
}

/* Line protocol escaping: measurement, tag keys and values and field keys escape , = space and
 * backslash; string field values escape " and backslash. */
#define LP_KEY_ESCAPES ",= \\"
#define LP_STRING_ESCAPES "\"\\"

static void put_value(struct fs_buf *out, const struct fs_value *v, enum fs_type type, int json)
{
    switch (type) {
    case FS_T_INTEGER:
        fs_buf_int(out, v->i);
        if (!json)
            fs_buf_append(out, "i", 1);
        break;
    case FS_T_NUMBER:
        fs_buf_double(out, v->d);
        break;
    case FS_T_BOOLEAN:
        fs_buf_puts(out, v->i ? "true" : "false");
        break;
    case FS_T_STRING:
        if (json) {
            fs_buf_json_string(out, v->s);
        } else {
            fs_buf_append(out, "\"", 1);
            fs_buf_escaped(out, v->s, LP_STRING_ESCAPES);
            fs_buf_append(out, "\"", 1);
        }
        break;
    }
}

void sample_line_protocol(const struct fs_sample *s, struct fs_buf *out)
{
    const struct fs_schema *schema = s->schema;
    fs_buf_escaped(out, schema->measurement, LP_KEY_ESCAPES);
    for (int t = 0; t < schema->ntags; t++) {
        int f = schema->tags[t];
        if (!sample_has(s, f) || !s->v[f].s[0])
            continue;
        fs_buf_append(out, ",", 1);
        fs_buf_append(out, schema->fields[f].lp_key, schema->fields[f].lp_key_len);
        fs_buf_escaped(out, s->v[f].s, LP_KEY_ESCAPES);
    }
    int first = 1;
    for (uint64_t left = s->set; left; left &= left - 1) {
        int f = __builtin_ctzll(left);
        const struct fs_field_def *def = &schema->fields[f];
        if (def->influx != FS_I_FIELD)
            continue;
        fs_buf_append(out, first ? " " : ",", 1);
        first = 0;
        fs_buf_append(out, def->lp_key, def->lp_key_len);
        put_value(out, &s->v[f], def->type, 0);
    }
    fs_buf_append(out, " ", 1);
    fs_buf_int(out, (long long)s->time_ms);
    fs_buf_append(out, "000000\n", 7);
}

void sample_json(const struct fs_sample *s, struct fs_buf *out)
{
    const struct fs_schema *schema = s->schema;
    fs_buf_append(out, "{", 1);
    for (uint64_t left = s->set; left; left &= left - 1) {
        int f = __builtin_ctzll(left);
        if (left != s->set)
            fs_buf_append(out, ",", 1);
        fs_buf_append(out, schema->fields[f].json_key, schema->fields[f].json_key_len);
        put_value(out, &s->v[f], schema->fields[f].type, 1);
    }
    fs_buf_append(out, "}\n", 2);
}

/* The parts of an _id, '/' between them; each escaped as a JSON string's inside. */
static void put_id(struct fs_buf *out, const char *a, const char *b, const char *c, long long seq)
{
    fs_buf_append(out, "\"", 1);
    const char *parts[] = {a, b, c};
    for (int k = 0; k < 3; k++) {
        fs_buf_json_inner(out, parts[k]);
        fs_buf_append(out, "/", 1);
    }
    fs_buf_int(out, seq);
    fs_buf_append(out, "\"", 1);
}

/* An edge counter's _id, run_id/from/to/agent/time (flowstat.schema.flow.document_id). */
static void put_edge_id(struct fs_buf *out, const struct fs_sample *s)
{
    static const int parts[] = {FS_E_RUN_ID, FS_E_FROM, FS_E_TO, FS_E_AGENT, FS_E_TIME};
    fs_buf_append(out, "\"", 1);
    for (int k = 0; k < 5; k++) {
        if (k)
            fs_buf_append(out, "/", 1);
        fs_buf_json_inner(out, s->v[parts[k]].s);
    }
    fs_buf_append(out, "\"", 1);
}

void sample_document_id(const struct fs_sample *s, struct fs_buf *out)
{
    if (s->schema->kind == FS_DOC_EDGE)
        put_edge_id(out, s);
    else if (s->schema->kind == FS_DOC_AGENT) /* the time keeps apart namesakes without a run id, and restarts */
        put_id(out, s->v[FS_A_HOST].s, s->v[FS_A_AGENT].s, s->v[FS_A_TIME].s, s->v[FS_A_SEQ].i);
    else
        put_id(out, s->v[FS_F_RUN_ID].s, s->v[FS_F_AGENT].s, s->v[FS_F_NODE_ID].s, s->v[FS_F_SEQ].i);
}
