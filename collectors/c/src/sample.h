/* A sample: one value slot per schema field (src/flowstat/schema/sample.schema.json, via the
 * generated schema_fields.h), and its two encodings. */
#ifndef FLOWSTAT_SAMPLE_H
#define FLOWSTAT_SAMPLE_H

#include <stdint.h>

#include "schema_fields.h"
#include "util.h"

#define FS_STR_MAX 128

struct fs_value {
    int set;
    long long i; /* integer, boolean */
    double d;    /* number */
    char s[FS_STR_MAX];
};

struct fs_sample {
    struct fs_value v[FS_NFIELDS];
    int64_t time_ms; /* the time field, as epoch milliseconds */
};

void sample_clear(struct fs_sample *s);
void sample_set_str(struct fs_sample *s, enum fs_field f, const char *value);
void sample_set_int(struct fs_sample *s, enum fs_field f, long long value);
void sample_set_num(struct fs_sample *s, enum fs_field f, double value);
void sample_set_bool(struct fs_sample *s, enum fs_field f, int value);
/* Whether a string field may take this value (its schema enumeration, if it has one). */
int sample_value_allowed(enum fs_field f, const char *value);

/* Append one line (with its newline) to out. */
void sample_line_protocol(const struct fs_sample *s, struct fs_buf *out);
void sample_json(const struct fs_sample *s, struct fs_buf *out);
/* Deterministic Elasticsearch _id: run_id/agent/node_id/seq. */
void sample_document_id(const struct fs_sample *s, char *out, size_t n);

#endif
