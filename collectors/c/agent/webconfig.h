/* prometheus://HOST:PORT?web_config=PATH: TLS and basic authentication on /metrics, read from a
 * web-config.yml in the format of Prometheus' exporter-toolkit (its docs/web-configuration.md), as
 * the Python agent reads it (src/flowstat/agent/sinks/webconfig.py), with the same messages:
 *
 *   tls_server_config:
 *     cert_file: server.crt                 # relative paths: from the web-config file's folder
 *     key_file: server.key
 *     client_ca_file: clients-ca.crt        # with a client_auth_type that verifies client certificates
 *     client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven; default NoClientCert
 *     min_version: TLS12                    # TLS12 (default) or TLS13; max_version alike (default TLS13)
 *   basic_auth_users:                       # user: bcrypt hash ($2y$, $2b$, $2a$: htpasswd -nBC 10 "")
 *     prometheus: $2y$10$...
 *
 * Read with libyaml at the start, where a file that cannot be used stops the agent; then again at a
 * connection when it, or a certificate, key or client CA file it names, changed since it was last
 * read (webconfig_reload: a stat of each, nothing read when none did), as exporter-toolkit reads it at
 * every request and handshake. A changed file that cannot be used, or that would change what the
 * start decided (TLS or not; beyond loopback, users), refuses every connection until it changes
 * again, as exporter-toolkit refuses it. Any key it does not know is an error naming the file and the
 * key, and so are exporter-toolkit's keys flowstat does not do (inline cert, key and client_ca,
 * cipher_suites, curve_preferences, prefer_server_cipher_suites, client_allowed_sans,
 * http_server_config, rate_limit). A password is checked with bcrypt through libxcrypt (crypt_rn);
 * the one that last matched a user is kept as an HMAC-SHA256 under a key of this config's (a reload
 * forgets them), so that a scraper's every scrape does not pay bcrypt's 50-100 ms again; hashes and
 * HMACs are compared in constant time. An unknown user is checked against a fixed hash, as
 * exporter-toolkit does. */
#ifndef FLOWSTAT_WEBCONFIG_H
#define FLOWSTAT_WEBCONFIG_H

#include <openssl/ssl.h>
#include <stddef.h>
#include <sys/types.h>
#include <time.h>

#define WEBCONFIG_REALM "flowstat"
#define WEBCONFIG_FILES 4 /* the file, then the cert_file, key_file and client_ca_file it names */

/* What tells a file changed: its stat's device, inode, size, mtime and ctime (a chmod); or its error. */
struct webconfig_stamp {
    int err;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
};

struct webconfig_user {
    char *name, *hash;
    unsigned char matched[32]; /* HMAC-SHA256 of the password that last matched */
    int has_matched;
};

struct webconfig {
    SSL_CTX *tls; /* tls_server_config; NULL: plain HTTP */
    struct webconfig_user *users; /* basic_auth_users; none: no password asked */
    size_t nusers;
    unsigned char key[32]; /* the HMAC key, this config's own */
    void *crypt_data; /* libxcrypt's struct crypt_data (32 KB), kept between checks */
    /* the files read, stamped before they were: what webconfig_reload compares */
    char *files[WEBCONFIG_FILES];
    struct webconfig_stamp stamps[WEBCONFIG_FILES];
    size_t nfiles;
    int tls_fixed; /* whether the start's file gave TLS: a reload cannot change it */
    int users_needed; /* beyond loopback: a reload that leaves no user cannot be used (the caller sets it) */
    int unusable; /* the file, changed, cannot be used: no TLS, no user, every connection refused */
};

/* Read and check the file at path (its certificate and key loaded, its hashes bcrypt's): 0, or -1
 * with a message naming the file and the key in err. w is to be freed (webconfig_free) either way. */
int webconfig_load(const char *path, struct webconfig *w, char *err, size_t errlen);
/* The file read again when it or a file it names changed since it was last read (a stat of each:
 * nothing read when none did): 0 unchanged; 1 read again (the users' remembered passwords
 * forgotten); -1 changed but not usable (w->unusable, until it changes again; err says why, naming
 * the file). */
int webconfig_reload(struct webconfig *w, char *err, size_t errlen);
/* Whether the Authorization header's value (NULL: none) holds a user's password. One thread at a time. */
int webconfig_allows(struct webconfig *w, const char *authorization);
void webconfig_free(struct webconfig *w);

#endif
