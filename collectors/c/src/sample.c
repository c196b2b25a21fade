#include "sample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sample_clear(struct fs_sample *s)
{
    for (int f = 0; f < FS_NFIELDS; f++) /* not a memset of every string buffer: this runs per sample */
        s->v[f].set = 0;
    s->time_ms = 0;
}

void sample_set_str(struct fs_sample *s, enum fs_field f, const char *value)
{
    fs_strlcpy(s->v[f].s, value, sizeof s->v[f].s);
    s->v[f].set = 1;
}

void sample_set_int(struct fs_sample *s, enum fs_field f, long long value)
{
    s->v[f].i = value;
    s->v[f].set = 1;
}

void sample_set_num(struct fs_sample *s, enum fs_field f, double value)
{
    s->v[f].d = value;
    s->v[f].set = 1;
}

void sample_set_bool(struct fs_sample *s, enum fs_field f, int value)
{
    s->v[f].i = value ? 1 : 0;
    s->v[f].set = 1;
}

int sample_value_allowed(enum fs_field f, const char *value)
{
    const struct fs_field_def *def = &FS_FIELDS[f];
    for (int k = 0; k < def->nvalues; k++)
        if (strcmp(def->values[k], value) == 0)
            return 1;
    return def->values == NULL;
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

static int cmp_tag(const void *a, const void *b)
{
    return strcmp(FS_FIELDS[*(const int *)a].name, FS_FIELDS[*(const int *)b].name);
}

/* The tag fields sorted by key (Influx's preferred order), worked out once. */
static const int *sorted_tags(int *count)
{
    static int tags[FS_NFIELDS], ntags = -1;
    if (ntags < 0) {
        int n = 0;
        for (int f = 0; f < FS_NFIELDS; f++)
            if (FS_FIELDS[f].influx == FS_I_TAG)
                tags[n++] = f;
        qsort(tags, (size_t)n, sizeof tags[0], cmp_tag);
        ntags = n;
    }
    *count = ntags;
    return tags;
}

void sample_line_protocol(const struct fs_sample *s, struct fs_buf *out)
{
    int ntags;
    const int *tags = sorted_tags(&ntags);
    fs_buf_escaped(out, FS_MEASUREMENT, LP_KEY_ESCAPES);
    for (int t = 0; t < ntags; t++) {
        const struct fs_value *v = &s->v[tags[t]];
        if (!v->set || !v->s[0])
            continue;
        fs_buf_append(out, ",", 1);
        fs_buf_escaped(out, FS_FIELDS[tags[t]].name, LP_KEY_ESCAPES);
        fs_buf_append(out, "=", 1);
        fs_buf_escaped(out, v->s, LP_KEY_ESCAPES);
    }
    int first = 1;
    for (int f = 0; f < FS_NFIELDS; f++) {
        if (FS_FIELDS[f].influx != FS_I_FIELD || !s->v[f].set)
            continue;
        fs_buf_append(out, first ? " " : ",", 1);
        first = 0;
        fs_buf_escaped(out, FS_FIELDS[f].name, LP_KEY_ESCAPES);
        fs_buf_append(out, "=", 1);
        put_value(out, &s->v[f], FS_FIELDS[f].type, 0);
    }
    fs_buf_append(out, " ", 1);
    fs_buf_int(out, (long long)s->time_ms);
    fs_buf_append(out, "000000\n", 7);
}

void sample_json(const struct fs_sample *s, struct fs_buf *out)
{
    int first = 1;
    fs_buf_append(out, "{", 1);
    for (int f = 0; f < FS_NFIELDS; f++) {
        if (!s->v[f].set)
            continue;
        if (!first)
            fs_buf_append(out, ",", 1);
        first = 0;
        fs_buf_json_string(out, FS_FIELDS[f].name);
        fs_buf_append(out, ":", 1);
        put_value(out, &s->v[f], FS_FIELDS[f].type, 1);
    }
    fs_buf_append(out, "}\n", 2);
}

void sample_document_id(const struct fs_sample *s, char *out, size_t n)
{
    snprintf(out, n, "%s/%s/%s/%lld", s->v[FS_F_RUN_ID].s, s->v[FS_F_AGENT].s, s->v[FS_F_NODE_ID].s,
             s->v[FS_F_SEQ].i);
}
