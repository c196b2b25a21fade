/* libFuzzer target: a control request from the network, read by libflowstat-node (libflowstat-node/node_request.c),
 * and its error text and echoed id written into a reply as the control thread writes them. */
#include <stddef.h>
#include <stdint.h>

#include "node_json.h"
#include "node_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fsn_request r;
    if (fsn_request_parse((const char *)data, size, &r) == 0) {
        struct fsn_json j;
        fsn_json_open(&j);
        fsn_json_str(&j, "error", r.error);
        if (r.command_text) {
            fsn_json_key(&j, "command");
            fsn_json_string(&j.buf, r.command_text, r.command_len);
        }
        if (r.id_json)
            fsn_json_raw(&j, "id", r.id_json);
        fsn_json_close(&j);
        fsn_buf_free(&j.buf);
    }
    fsn_request_free(&r);
    return 0;
}
