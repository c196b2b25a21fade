/* Reading a control request (docs/control-protocol.md): one frame holding one JSON object. The
 * refusals are worded as the harness's (flowstat.node.protocol.parse_request): the same checks
 * in the same order, the same texts, Python's json and utf-8 codec messages included, for requests
 * in UTF-8 (Python would also take UTF-16 and UTF-32 ones; here they are refused as not UTF-8). */
#ifndef FLOWSTAT_NODE_REQUEST_H
#define FLOWSTAT_NODE_REQUEST_H

#include <stddef.h>

#define FSN_MAX_REQUEST_BYTES (64 * 1024)
#define FSN_MAX_NESTING 900 /* deeper requests are refused (Python's json gives up near 1000) */

enum fsn_command { FSN_CHECK_STATE, FSN_GET_METRICS, FSN_START, FSN_STOP, FSN_CLOCK, FSN_NO_COMMAND };

struct fsn_request {
    enum fsn_command command;
    char *command_text; /* the request's "command" when it is a string (UTF-8, NUL-terminated), else NULL */
    size_t command_len;
    char *id_json; /* the request's "id" as JSON to echo (an integer, a boolean or a string), else NULL */
    char *error; /* why the request is refused, else NULL */
};

/* Read one request. Returns 0, or -1 when memory ran out (the request then reads as refused with
 * error NULL). */
int fsn_request_parse(const char *payload, size_t len, struct fsn_request *out);
void fsn_request_free(struct fsn_request *r);

#endif
