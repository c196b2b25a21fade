/* Reading a sample back from its JSON document (for --encode and the conformance tests). */
#ifndef FLOWSTAT_SAMPLE_JSON_H
#define FLOWSTAT_SAMPLE_JSON_H

#include <stddef.h>

#include "sample.h"

/* A sample's JSON document, or a run file's self-sample or edge counter line ({"flowstat_agent":
 * {...}}, {"flowstat_edge": {...}}: then s follows the agent or the edge schema). 0 on success; -1
 * with a message naming the field in err. */
int sample_from_json(const char *text, size_t len, struct fs_sample *s, char *err, size_t errlen);
/* Epoch milliseconds of "YYYY-MM-DDTHH:MM:SS.mmmZ"; -1 if it is not that. */
long long parse_iso_ms(const char *text);

#endif
