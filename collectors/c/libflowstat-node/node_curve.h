/* ZeroMQ CURVE key files: the ZPL certificates flowstat.node.curve writes in RUN_DIR/keys
 * (node.key, node.key_secret, client.key, client.key_secret), read by libflowstat-node (a node's
 * keys) and by the agent (its client key). Self-contained, so that the agent and a fuzzer compile
 * it as it is. Messages name the file (and the line), never a key. */
#ifndef FLOWSTAT_NODE_CURVE_H
#define FLOWSTAT_NODE_CURVE_H

#include <stddef.h>

#define FSN_CURVE_KEY_LEN 40 /* a Z85 key: 32 bytes as 40 characters */
#define FSN_CURVE_FILE_MAX (64 * 1024) /* a certificate is a few hundred bytes: a bigger file is none */

/* A key file's keys, Z85 text; secret_key "" when the file holds none (a public .key file). */
struct fsn_curve_keys {
    char public_key[FSN_CURVE_KEY_LEN + 1];
    char secret_key[FSN_CURVE_KEY_LEN + 1];
};

/* Whether key[0..len) is Z85 text of a 32-byte key. */
int fsn_curve_key_valid(const char *key, size_t len);

/* The keys of a certificate's text (path names it in messages): lines `public-key = "Z85"` and
 * `secret-key = "Z85"`, anywhere, `#` comments and other lines skipped, as
 * flowstat.node.curve.read_key_file reads them. 0, or -1 with why saying what (naming path and
 * line). */
int fsn_curve_parse(const char *text, size_t len, const char *path, struct fsn_curve_keys *out, char *why,
                    size_t why_len);

/* The keys of a key file; with need_secret, a file without a secret-key is refused. 0, or -1 with
 * why naming the file. Nothing of the file stays in memory but *out (fsn_curve_wipe it). */
int fsn_curve_read(const char *path, int need_secret, struct fsn_curve_keys *out, char *why, size_t why_len);

/* Forget the keys (a secret is not left in memory once used). */
void fsn_curve_wipe(struct fsn_curve_keys *keys);

/* printf into why (if given): the one way the library and the agent's key reading say why. */
void fsn_say(char *why, size_t why_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
