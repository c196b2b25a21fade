/* A sample: one value slot per schema field (src/flowstat/schema/sample.schema.json, via the
 * generated schema_fields.h), and its two encodings. An agent's self-sample (agent.schema.json) is
 * a sample of the agent schema, and an edge counter (edge.schema.json) one of the edge schema: the
 * same slots and encoders, their own fields, measurement, index and _id. */
#ifndef FLOWSTAT_SAMPLE_H
#define FLOWSTAT_SAMPLE_H

#include <stdint.h>

#include "schema_fields.h"
#include "util.h"

#define FS_STR_MAX 128

struct fs_value {
    long long i; /* integer, boolean */
    double d; /* number */
    char s[FS_STR_MAX];
};

/* What a sample is a sample of: it says where Elasticsearch keeps it and its _id. */
enum fs_doc_kind { FS_DOC_NODE, FS_DOC_AGENT, FS_DOC_EDGE };

/* A flat schema: its fields (the slots of a sample that follows it), and how it is stored. */
struct fs_schema {
    const char *measurement;
    const struct fs_field_def *fields;
    int nfields;
    const int *tags; /* its tag fields, sorted by key: line protocol's order */
    int ntags;
    int time_field;
    enum fs_doc_kind kind; /* a self-sample's index is FS_AGENTS_INDEX, an edge counter's FS_EDGES_INDEX */
};
extern const struct fs_schema FS_SAMPLE_SCHEMA, FS_AGENT_SCHEMA, FS_EDGE_SCHEMA;

/* Where the Elasticsearch sink puts self-samples, beside the samples index its URL names (as
 * flowstat.stores.elasticsearch.AGENTS_INDEX). */
#define FS_AGENTS_INDEX "flowstat-agents"
/* ... and edge counters, in the edges' daily indices (as flowstat.stores.elasticsearch.EDGES_INDEX). */
#define FS_EDGES_INDEX "flowstat-edges"
/* A run file's line {"flowstat_agent": {...}} holds one self-sample (flowstat.schema.agent). */
#define FS_RUN_FILE_AGENT_KEY FS_AGENT_MEASUREMENT
/* ... and {"flowstat_edge": {...}} one edge counter (flowstat.schema.flow.EDGE_RUN_FILE_KEY). */
#define FS_RUN_FILE_EDGE_KEY FS_EDGE_MEASUREMENT

struct fs_sample {
    const struct fs_schema *schema;
    /* Which fields hold a value, bit f for field f: a sample is cleared and its fields walked
     * thousands of times a second, and one word is all it takes (the slots are 5 kB). */
    uint64_t set;
    struct fs_value v[FS_MAX_FIELDS]; /* indexed by enum fs_field, or enum fs_agent_field */
    int64_t time_ms; /* the time field, as epoch milliseconds */
};
_Static_assert(FS_MAX_FIELDS <= 64, "struct fs_sample's set holds one bit per field");

static inline int sample_has(const struct fs_sample *s, int f)
{
    return (int)((s->set >> f) & 1u);
}

/* Unset every field: a sample of the sample schema, or of `schema`. */
void sample_clear(struct fs_sample *s);
void sample_clear_as(struct fs_sample *s, const struct fs_schema *schema);
/* f: a field of the sample's schema (enum fs_field, or enum fs_agent_field). */
void sample_set_str(struct fs_sample *s, int f, const char *value);
void sample_set_int(struct fs_sample *s, int f, long long value);
void sample_set_num(struct fs_sample *s, int f, double value);
void sample_set_bool(struct fs_sample *s, int f, int value);
/* Whether a string field may take this value: in its schema enumeration and matching its pattern
 * (whole: the schemas' patterns are anchored), if it has them. */
int field_value_allowed(const struct fs_field_def *def, const char *value);
int sample_value_allowed(enum fs_field f, const char *value); /* a field of the sample schema */

/* Append one line (with its newline) to out. */
void sample_line_protocol(const struct fs_sample *s, struct fs_buf *out);
void sample_json(const struct fs_sample *s, struct fs_buf *out);
/* Deterministic Elasticsearch _id: run_id/agent/node_id/seq; a self-sample's host/agent/time/seq; an
 * edge counter's run_id/from/to/agent/time. Appended to out as a JSON string. */
void sample_document_id(const struct fs_sample *s, struct fs_buf *out);

#endif
