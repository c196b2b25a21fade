/* libFuzzer target: a control reply from the network, through to both sample encodings; and the
 * --encode reader, samples and a run file's self-samples (seed corpus/reply/self-sample). */
#include <stddef.h>
#include <stdint.h>

#include "control.h"
#include "sample_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cJSON *reply = control_parse_reply((const char *)data, size, 1);
    if (!reply)
        reply = cJSON_ParseWithLength((const char *)data, size); /* reach the field copy with any JSON */
    if (reply) {
        struct fs_sample s;
        struct fs_buf out = {0};
        sample_clear(&s);
        control_fill_sample(reply, &s);
        sample_line_protocol(&s, &out);
        sample_json(&s, &out);
        fs_buf_free(&out);
        cJSON_Delete(reply);
    }
    struct fs_sample s;
    char err[256];
    if (sample_from_json((const char *)data, size, &s, err, sizeof err) == 0) { /* the --encode reader */
        struct fs_buf out = {0};
        sample_line_protocol(&s, &out);
        sample_json(&s, &out);
        fs_buf_free(&out);
    }
    return 0;
}
