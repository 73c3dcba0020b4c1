/*
 * The Redis/Valkey tier: blobs as string keys of one or more servers, or of
 * a Cluster, shared by every process that uses the same servers and prefix.
 *
 * A call is one pipelined exchange per server. Keys are routed first (a
 * Cluster's slot map, or rendezvous hashing over standalone servers), each
 * server's commands are appended to its connection's output buffer, and one
 * poll() loop then writes every buffer and reads every reply at once,
 * full duplex, until all replies are in or the call's budget is spent.
 * Sockets are non-blocking after the connection is made, so nothing in a
 * call can wait past the budget: the loop's poll() gets the time left, and
 * hiredis's reads and writes return at once. A server that fails (an I/O
 * error, a closed connection, the budget spent with replies outstanding) is
 * disconnected (a late reply would belong to no command) and left alone for
 * a backoff that doubles with each failure in a row; its keys are misses
 * until then.
 *
 * Cluster: a key's slot is CRC16 (XMODEM) of the key, or of its hash tag,
 * modulo 16384. A MOVED reply points the slot at the named node (added to
 * the node list if new) and sends the key there in the next round of the
 * same call; ASK sends it once, after ASKING, without touching the map. Any
 * redirect, or a node failure, makes the next call read the whole map again
 * (CLUSTER SLOTS). Rounds per call are bounded.
 *
 * hiredis writes with write(2): a server that closed its end would raise
 * SIGPIPE, whose default action ends the process. Every exchange blocks
 * SIGPIPE in the calling thread and consumes one it raised itself.
 *
 * One mutex serializes the tier's calls (hiredis contexts are not
 * thread-safe); waiting for it counts against the budget.
 */
#define _POSIX_C_SOURCE 200809L
#include "blobtier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvp_redis_tier_params_init(kvp_redis_tier_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->cluster = -1;
    p->prefix = "kvp:";
    p->connect_timeout_ms = 250;
    p->timeout_ms = 100;
    p->retry_min_ms = 100;
    p->retry_max_ms = 5000;
}

#ifndef KVP_HAVE_REDIS

int kvp_redis_tier_create(const kvp_redis_tier_params_t *params, kvp_blob_tier_t **out,
                          char *err, size_t err_size) {
    (void)params;
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    return kvp__errf(err, err_size, KVP_ENOTSUP,
                     "this build of libkvpage has no Redis tier: hiredis (Debian: "
                     "libhiredis-dev) was not found when it was built");
}

int kvp_redis_tier_info(kvp_blob_tier_t *tier, kvp_redis_tier_info_t *info) {
    (void)info;
    if (tier == NULL) return KVP_EINVAL;
    return kvp__blob_tier_fail(tier, KVP_EINVAL, "not a Redis tier");
}

int kvp_redis_tier_reconnect(kvp_blob_tier_t *tier) {
    if (tier == NULL) return KVP_EINVAL;
    return kvp__blob_tier_fail(tier, KVP_EINVAL, "not a Redis tier");
}

#else /* KVP_HAVE_REDIS */

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_NODES 64
#define HOST_BYTES 256
#define CRED_BYTES 256
#define PREFIX_MAX 64
#define KEY_BYTES (PREFIX_MAX + 64 + 1)
#define NSLOTS 16384
#define NO_NODE (-1)
/* Exchanges per call: the first, and redirected keys' resends. */
#define MAX_ROUNDS 4
/* Longest timeout or backoff a caller may ask for, in ms (one hour). */
#define MAX_MS 3600000
/* Bytes read from a socket per recv(): replies of pages are megabytes, and
 * hiredis's own read takes 16 KiB a call. */
#define READ_BYTES (256u << 10)

enum op { OP_GET, OP_PUT, OP_EXISTS, OP_REMOVE, OP_ADMIN };
/* Reply parser states (data calls). */
enum { P_LINE, P_BULK, P_CRLF };
/* A bulk payload this large is read straight into the caller's buffer. */
#define DIRECT_BYTES (16u << 10)
/* A command in flight: the key it is for, or ASKING before one. */
enum { CMD_KEY = 0, CMD_ASKING = 1 };

typedef struct {
    char host[HOST_BYTES];
    int port;
    int db;
    char user[CRED_BYTES];
    char pass[CRED_BYTES];
    uint64_t seed;   /* rendezvous hashing weight seed (standalone) */
    redisContext *ctx;
    int64_t retry_at; /* ns (monotonic): no connection attempt before then */
    int32_t backoff_ms;
    bool down;        /* failed, not connected again since */
    /* the reply parser of data calls (admin calls use hiredis's reader) */
    int32_t pstate;   /* P_LINE, P_BULK or P_CRLF */
    int32_t linelen;  /* bytes of the current line kept in `line` */
    uint64_t remain;  /* P_BULK: payload bytes still to come; P_CRLF: 2 or 1 */
    uint64_t bulklen;
    uint8_t *dest;    /* where the payload goes (a get's buffer), or NULL */
    char line[256];   /* a reply's first line (longer error text is cut) */
    /* per exchange */
    int32_t first, count; /* its commands in the call's command list */
    int32_t got;          /* replies read */
    bool written;         /* its output buffer is written out */
    bool active;
} node_t;

typedef struct {
    int32_t key;  /* index in the call's batch */
    int32_t kind; /* CMD_KEY or CMD_ASKING */
} cmd_t;

typedef struct {
    kvp_allocator_t alloc;
    pthread_mutex_t lock;
    bool cluster;
    char prefix[PREFIX_MAX + 1];
    size_t prefix_len;
    int32_t connect_timeout_ms, timeout_ms, ttl_s, retry_min_ms, retry_max_ms;
    node_t nodes[MAX_NODES];
    int32_t nnodes;
    int16_t slots[NSLOTS];  /* Cluster: node per slot, NO_NODE if unknown */
    bool need_refresh;      /* Cluster: read the slot map at the next call */
    int64_t refresh_at;     /* ...not before then (after a failed refresh) */
    /* per call scratch, grown as needed */
    int32_t cap;
    char *keys;             /* [cap][KEY_BYTES] */
    int32_t *route;         /* [cap] node per key, NO_NODE when settled */
    uint8_t *asking;        /* [cap] send ASKING first */
    uint8_t *failed;        /* [cap] put/remove: not done */
    cmd_t *cmds;            /* [2 * cap] */
    char *rbuf;             /* [READ_BYTES] */
    /* the current call */
    enum op op;
    int32_t n;
    void *const *bufs;
    const uint64_t *caps;
    uint64_t *sizes;
    uint8_t *present;
    const void *const *blobs;
    const uint64_t *blob_sizes;
    redisReply *admin;      /* OP_ADMIN: the reply kept */
    bool denied;            /* a reply said NOPERM/NOAUTH/WRONGPASS */
    kvp_redis_tier_info_t info;
    char err[KVP_ERR_SIZE];
} rtier_t;

/* ---- time and signals ----------------------------------------------------- */

static int64_t now_ns(void) {
    struct timespec ts = {0, 0};
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t ms_ns(int32_t ms) { return (int64_t)ms * 1000000; }

/* Milliseconds left until `deadline`, rounded up; 0 when it has passed. */
static int ms_left(int64_t deadline) {
    int64_t left = deadline - now_ns();
    if (left <= 0) return 0;
    return (int)((left + 999999) / 1000000);
}

typedef struct {
    sigset_t old;
    bool pending_before;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g) {
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigemptyset(&pending);
    sigpending(&pending);
    g->pending_before = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
}

static void sigpipe_restore(sigpipe_guard *g) {
    if (!g->pending_before) {
        sigset_t pipe, pending;
        sigemptyset(&pipe);
        sigaddset(&pipe, SIGPIPE);
        sigemptyset(&pending);
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE) == 1) {
            struct timespec zero = {0, 0};
            while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {
            }
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- failures ------------------------------------------------------------- */

static int fail(rtier_t *t, int status, const char *fmt, ...) KVP__PRINTF(3, 4);
static int fail(rtier_t *t, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(t->err, sizeof t->err, status, fmt, ap);
    va_end(ap);
    return status;
}

/* A server's error reply that a configuration change, not a retry, fixes. */
static bool is_denial(const char *s, size_t len) {
    static const char *const words[] = {"NOPERM", "NOAUTH", "WRONGPASS"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t w = strlen(words[i]);
        if (len >= w && memcmp(s, words[i], w) == 0) return true;
    }
    return false;
}

static void drop(node_t *nd) {
    if (nd->ctx != NULL) redisFree(nd->ctx);
    nd->ctx = NULL;
}

/* The node failed: disconnect it and wait a backoff before the next try. */
static void node_failed(rtier_t *t, node_t *nd, const char *why) {
    drop(nd);
    nd->down = true;
    t->info.failures++;
    nd->retry_at = now_ns() + ms_ns(nd->backoff_ms);
    int64_t next = (int64_t)nd->backoff_ms * 2;
    nd->backoff_ms = (int32_t)(next > t->retry_max_ms ? t->retry_max_ms : next);
    fail(t, KVP_EIO, "redis %s:%d: %s", nd->host, nd->port, why);
    if (t->cluster) t->need_refresh = true;
}

/* ---- URIs ------------------------------------------------------------------ */

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decode [s, s+len) into out (room `cap`); false if malformed. */
static bool decode(const char *s, size_t len, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            if (i + 2 >= len) return false;
            int h = hexval((unsigned char)s[i + 1]), l = hexval((unsigned char)s[i + 2]);
            if (h < 0 || l < 0) return false;
            c = h * 16 + l;
            i += 2;
        }
        if (c == 0 || o + 1 >= cap) return false;
        out[o++] = (char)c;
    }
    out[o] = 0;
    return true;
}

/* Parse a decimal integer of [s, s+len) within [lo, hi]. */
static bool parse_int(const char *s, size_t len, long lo, long hi, int *out) {
    if (len == 0 || len > 9) return false;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static uint64_t fnv1a(const char *s, uint64_t h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The URI [u, u+len) as error messages show it: credentials masked. */
static void masked(const char *u, size_t len, char *out, size_t cap) {
    const char *at = NULL, *scheme = NULL;
    for (size_t i = 0; i + 2 < len; i++)
        if (u[i] == ':' && u[i + 1] == '/' && u[i + 2] == '/') {
            scheme = u + i + 3;
            break;
        }
    const char *from = scheme ? scheme : u;
    for (const char *q = from; q < u + len && *q != '/'; q++)
        if (*q == '@') at = q;
    if (at == NULL) snprintf(out, cap, "%.*s", (int)len, u);
    else snprintf(out, cap, "%.*s***%.*s", (int)(from - u), u, (int)(u + len - at), at);
}

/* One URI [u, u+len) into `nd`; credentials default to the parameters'. */
static int parse_uri(const char *u, size_t len, const kvp_redis_tier_params_t *p, node_t *nd,
                     char *err, size_t err_size) {
    char shown[160]; /* for messages, without credentials */
    masked(u, len, shown, sizeof shown);
    const char *end = u + len, *s;
    memset(nd, 0, sizeof *nd);
    nd->port = 6379;
    if (len >= 8 && memcmp(u, "redis://", 8) == 0) {
        s = u + 8;
    } else if (len >= 9 && memcmp(u, "valkey://", 9) == 0) {
        s = u + 9;
    } else if ((len >= 9 && memcmp(u, "rediss://", 9) == 0) ||
               (len >= 10 && memcmp(u, "valkeys://", 10) == 0)) {
        return kvp__errf(err, err_size, KVP_EINVAL, "uri '%s': TLS is not supported",
                         shown);
    } else {
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "uri '%s': expected redis://[user:password@]host[:port][/db]",
                         shown);
    }
    if (p->user != NULL) snprintf(nd->user, sizeof nd->user, "%s", p->user);
    if (p->password != NULL) snprintf(nd->pass, sizeof nd->pass, "%s", p->password);
    const char *at = NULL;
    for (const char *q = s; q < end && *q != '/'; q++)
        if (*q == '@') at = q;
    if (at != NULL) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        const char *uend = colon ? colon : at;
        bool ok = true;
        if (uend > s) ok = decode(s, (size_t)(uend - s), nd->user, sizeof nd->user);
        if (ok && colon) ok = decode(colon + 1, (size_t)(at - colon - 1), nd->pass, sizeof nd->pass);
        if (!ok)
            return kvp__errf(err, err_size, KVP_EINVAL,
                             "uri: the user or password is malformed (percent-encode "
                             "special characters; at most %d bytes each)", CRED_BYTES - 1);
        s = at + 1;
    }
    const char *hs = s, *he;
    if (s < end && *s == '[') { /* [IPv6] */
        const char *close = memchr(s, ']', (size_t)(end - s));
        if (close == NULL)
            return kvp__errf(err, err_size, KVP_EINVAL, "uri '%s': unclosed '['", shown);
        hs = s + 1;
        he = close;
        s = close + 1;
    } else {
        while (s < end && *s != ':' && *s != '/') s++;
        he = s;
    }
    if (he == hs || (size_t)(he - hs) >= sizeof nd->host)
        return kvp__errf(err, err_size, KVP_EINVAL, "uri '%s': no host (or too long)",
                         shown);
    memcpy(nd->host, hs, (size_t)(he - hs));
    if (s < end && *s == ':') {
        const char *ps = ++s;
        while (s < end && *s != '/') s++;
        if (!parse_int(ps, (size_t)(s - ps), 1, 65535, &nd->port))
            return kvp__errf(err, err_size, KVP_EINVAL, "uri '%s': the port must be 1..65535",
                             shown);
    }
    if (s < end && *s == '/') {
        s++;
        if (s < end && !parse_int(s, (size_t)(end - s), 0, 1000000, &nd->db))
            return kvp__errf(err, err_size, KVP_EINVAL, "uri '%s': the database must be a "
                             "number", shown);
        s = end;
    }
    if (s != end)
        return kvp__errf(err, err_size, KVP_EINVAL, "uri '%s': unexpected '%c'", shown,
                         *s);
    char id[HOST_BYTES + 32];
    snprintf(id, sizeof id, "%s:%d/%d", nd->host, nd->port, nd->db);
    nd->seed = fnv1a(id, 0xcbf29ce484222325ull);
    return KVP_OK;
}

/* ---- routing ---------------------------------------------------------------- */

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), Redis Cluster's
 * key hash. */
static uint16_t crc16(const char *s, size_t len) {
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)s[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

/* A key's Cluster slot: of its hash tag (the bytes between the first '{'
 * and the next '}', when not empty), else of the whole key. */
static int32_t key_slot(const char *key, size_t len) {
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        const char *close = memchr(open + 1, '}', len - (size_t)(open + 1 - key));
        if (close != NULL && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) % NSLOTS;
    }
    return crc16(key, len) % NSLOTS;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The server of a key: its slot's node, or the standalone server with the
 * highest rendezvous weight (adding a server moves only the keys it wins). */
static int32_t route_key(const rtier_t *t, const kvp_hash_t *h, const char *key) {
    if (t->cluster) return t->slots[key_slot(key, t->prefix_len + 64)];
    if (t->nnodes == 1) return 0;
    uint64_t k;
    memcpy(&k, h->bytes, sizeof k);
    int32_t best = 0;
    uint64_t top = 0;
    for (int32_t i = 0; i < t->nnodes; i++) {
        uint64_t w = mix64(k ^ t->nodes[i].seed);
        if (i == 0 || w > top) {
            top = w;
            best = i;
        }
    }
    return best;
}

/* The node at host:port, added (with the first node's credentials) if new;
 * NO_NODE if the list is full. */
static int32_t node_at(rtier_t *t, const char *host, size_t host_len, int port) {
    for (int32_t i = 0; i < t->nnodes; i++)
        if (t->nodes[i].port == port && strlen(t->nodes[i].host) == host_len &&
            memcmp(t->nodes[i].host, host, host_len) == 0)
            return i;
    if (t->nnodes == MAX_NODES || host_len == 0 || host_len >= HOST_BYTES) return NO_NODE;
    node_t *nd = &t->nodes[t->nnodes];
    memset(nd, 0, sizeof *nd);
    memcpy(nd->host, host, host_len);
    nd->port = port;
    memcpy(nd->user, t->nodes[0].user, sizeof nd->user);
    memcpy(nd->pass, t->nodes[0].pass, sizeof nd->pass);
    nd->backoff_ms = t->retry_min_ms;
    return t->nnodes++;
}

/* ---- the exchange ------------------------------------------------------------ */

/* Key i is done: answered (`ok`), or given up on. */
static void settle(rtier_t *t, int32_t i, bool ok) {
    t->route[i] = NO_NODE;
    if (!ok) t->failed[i] = 1;
}

/* A redirect "MOVED|ASK <slot> <host>:<port>": the node it names. */
static int32_t redirect_node(rtier_t *t, const char *s, size_t len, int32_t *slot) {
    const char *sp = memchr(s, ' ', len);
    if (sp == NULL) return NO_NODE;
    const char *end = s + len, *a = sp + 1;
    const char *sp2 = memchr(a, ' ', (size_t)(end - a));
    if (sp2 == NULL || !parse_int(a, (size_t)(sp2 - a), 0, NSLOTS - 1, slot)) return NO_NODE;
    const char *h = sp2 + 1;
    const char *colon = NULL;
    for (const char *q = h; q < end; q++)
        if (*q == ':') colon = q; /* the last one: IPv6 hosts have more */
    int port;
    if (colon == NULL || !parse_int(colon + 1, (size_t)(end - colon - 1), 1, 65535, &port))
        return NO_NODE;
    return node_at(t, h, (size_t)(colon - h), port);
}

/* A data call's reply, as the parser delivers it. For a get's bulk string
 * the payload is already in the caller's buffer when `copied`. */
typedef struct {
    int type;          /* REDIS_REPLY_STRING, _NIL, _STATUS, _ERROR or _INTEGER */
    const char *str;   /* STATUS, ERROR: the text (not NUL-terminated) */
    size_t len;        /* its length; STRING: the payload's length */
    long long integer; /* INTEGER */
    bool copied;       /* STRING: the payload is in bufs[key] */
} reply_t;

/* One reply to command `c` of node `ni`. */
static void on_reply(rtier_t *t, int32_t ni, const cmd_t *c, const reply_t *r) {
    int32_t i = c->key;
    if (c->kind == CMD_ASKING) return;
    if (r->type == REDIS_REPLY_ERROR) {
        const char *s = r->str;
        size_t len = r->len;
        bool moved = len > 6 && memcmp(s, "MOVED ", 6) == 0;
        bool ask = len > 4 && memcmp(s, "ASK ", 4) == 0;
        if (moved || ask) {
            int32_t slot = 0, to = redirect_node(t, s, len, &slot);
            if (to != NO_NODE) {
                t->route[i] = to;
                t->asking[i] = ask;
                if (moved) {
                    t->slots[slot] = (int16_t)to;
                    t->info.moved++;
                    t->need_refresh = true;
                } else {
                    t->info.asked++;
                }
                return; /* resent in the next round */
            }
        }
        t->info.server_errors++;
        if (is_denial(s, len)) t->denied = true;
        fail(t, KVP_EIO, "redis %s:%d: %.*s", t->nodes[ni].host, t->nodes[ni].port,
             (int)(len > 160 ? 160 : len), s);
        settle(t, i, false);
        return;
    }
    switch (t->op) {
    case OP_GET:
        if (r->type == REDIS_REPLY_STRING && r->copied) t->sizes[i] = (uint64_t)r->len;
        settle(t, i, r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_NIL);
        break;
    case OP_PUT:
        settle(t, i, r->type == REDIS_REPLY_STATUS);
        break;
    case OP_EXISTS:
        if (r->type == REDIS_REPLY_INTEGER && r->integer > 0) t->present[i] = 1;
        settle(t, i, r->type == REDIS_REPLY_INTEGER);
        break;
    default:
        settle(t, i, r->type == REDIS_REPLY_INTEGER);
        break;
    }
}

/* The node's commands not answered: their keys settle as failures. */
static void abandon(rtier_t *t, node_t *nd) {
    for (int32_t k = nd->got; k < nd->count; k++) {
        const cmd_t *c = &t->cmds[nd->first + k];
        if (c->kind == CMD_KEY && t->op != OP_ADMIN) settle(t, c->key, false);
    }
    nd->active = false;
}

/* Connect node `nd` (authenticate, select its db) within the deadline. */
static int node_connect(rtier_t *t, node_t *nd, int64_t deadline);

/* Admin calls: hand the reply hiredis's reader holds to t->admin; false
 * (and why) when the replies are out of step or malformed. */
static bool drain(rtier_t *t, node_t *nd, char *why, size_t why_size) {
    for (;;) {
        void *reply = NULL;
        if (redisGetReply(nd->ctx, &reply) != REDIS_OK) {
            snprintf(why, why_size, "%s", nd->ctx->errstr[0] ? nd->ctx->errstr
                                                              : "protocol error");
            return false;
        }
        if (reply == NULL) return true;
        if (nd->got >= nd->count) { /* a reply to nothing */
            freeReplyObject(reply);
            snprintf(why, why_size, "unexpected reply");
            return false;
        }
        t->admin = (redisReply *)reply;
        nd->got++;
    }
}

/* Data calls: a reply is complete; hand it on. */
static bool deliver(rtier_t *t, node_t *nd, const reply_t *r, char *why, size_t why_size) {
    if (nd->got >= nd->count) {
        snprintf(why, why_size, "unexpected reply");
        return false;
    }
    on_reply(t, (int32_t)(nd - t->nodes), &t->cmds[nd->first + nd->got], r);
    nd->got++;
    return true;
}

/* A reply's first line (without CRLF): a simple reply, or a bulk header
 * that starts the payload. */
static bool on_line(rtier_t *t, node_t *nd, char *why, size_t why_size) {
    const char *l = nd->line;
    size_t n = (size_t)nd->linelen;
    reply_t r = {REDIS_REPLY_STATUS, l + 1, n ? n - 1 : 0, 0, false};
    char *end = NULL;
    switch (n ? l[0] : 0) {
    case '+': return deliver(t, nd, &r, why, why_size);
    case '-':
        r.type = REDIS_REPLY_ERROR;
        return deliver(t, nd, &r, why, why_size);
    case ':':
        r.type = REDIS_REPLY_INTEGER;
        nd->line[n] = 0;
        r.integer = strtoll(l + 1, &end, 10);
        if (end == l + 1) break;
        return deliver(t, nd, &r, why, why_size);
    case '$': {
        nd->line[n] = 0;
        long long len = strtoll(l + 1, &end, 10);
        if (end == l + 1 || len < -1) break;
        if (len == -1) {
            r.type = REDIS_REPLY_NIL;
            return deliver(t, nd, &r, why, why_size);
        }
        nd->bulklen = (uint64_t)len;
        nd->remain = (uint64_t)len;
        nd->dest = NULL;
        if (nd->got < nd->count && t->op == OP_GET) {
            const cmd_t *c = &t->cmds[nd->first + nd->got];
            if (c->kind == CMD_KEY && len > 0 && (uint64_t)len <= t->caps[c->key])
                nd->dest = (uint8_t *)t->bufs[c->key];
        }
        nd->pstate = P_BULK;
        if (len == 0) {
            nd->pstate = P_CRLF;
            nd->remain = 2;
        }
        return true;
    }
    default: break;
    }
    snprintf(why, why_size, "protocol error (a reply starting '%.20s')", l);
    return false;
}

/* Parse `n` bytes of a data call's replies. */
static bool parse(rtier_t *t, node_t *nd, const char *p, size_t n, char *why, size_t why_size) {
    while (n > 0) {
        if (nd->pstate == P_LINE) {
            const char *nl = memchr(p, '\n', n);
            size_t take = nl ? (size_t)(nl - p) + 1 : n;
            for (size_t k = 0; k < take; k++) /* keep what fits; the text is cut */
                if (nd->linelen < (int32_t)sizeof nd->line - 1) nd->line[nd->linelen++] = p[k];
            p += take;
            n -= take;
            if (nl == NULL) continue;
            if (nd->linelen < 2 || nd->line[nd->linelen - 2] != '\r') {
                if (nd->linelen < (int32_t)sizeof nd->line - 1) {
                    snprintf(why, why_size, "protocol error (a line without CRLF)");
                    return false;
                }
            } else {
                nd->linelen -= 2;
            }
            nd->line[nd->linelen] = 0;
            bool ok = on_line(t, nd, why, why_size);
            nd->linelen = 0;
            if (!ok) return false;
        } else if (nd->pstate == P_BULK) {
            size_t take = nd->remain < n ? (size_t)nd->remain : n;
            if (nd->dest != NULL) memcpy(nd->dest + (nd->bulklen - nd->remain), p, take);
            nd->remain -= take;
            p += take;
            n -= take;
            if (nd->remain == 0) {
                nd->pstate = P_CRLF;
                nd->remain = 2;
            }
        } else { /* P_CRLF */
            char want = nd->remain == 2 ? '\r' : '\n';
            if (*p != want) {
                snprintf(why, why_size, "protocol error (a bulk string without CRLF)");
                return false;
            }
            p++;
            n--;
            if (--nd->remain == 0) {
                nd->pstate = P_LINE;
                reply_t r = {REDIS_REPLY_STRING, NULL, (size_t)nd->bulklen, 0, nd->dest != NULL};
                if (!deliver(t, nd, &r, why, why_size)) return false;
            }
        }
    }
    return true;
}

/* Read what the node's socket holds: a get's large payload straight into
 * its buffer, the rest through a buffer of READ_BYTES, parsed as it comes
 * (admin calls: fed to hiredis's reader); false (and why) when the
 * connection is lost or a reply is malformed. */
static bool receive(rtier_t *t, node_t *nd, char *why, size_t why_size) {
    bool admin_call = t->op == OP_ADMIN;
    for (int k = 0; k < 64; k++) { /* a bound: other nodes get their turn */
        bool direct = !admin_call && nd->pstate == P_BULK && nd->dest != NULL &&
                      nd->remain >= DIRECT_BYTES;
        ssize_t got;
        if (direct)
            got = recv(nd->ctx->fd, nd->dest + (nd->bulklen - nd->remain), (size_t)nd->remain,
                       MSG_DONTWAIT);
        else
            got = recv(nd->ctx->fd, t->rbuf, READ_BYTES, MSG_DONTWAIT);
        if (got > 0) {
            if (direct) {
                nd->remain -= (uint64_t)got;
                if (nd->remain == 0) {
                    nd->pstate = P_CRLF;
                    nd->remain = 2;
                }
            } else if (admin_call) {
                if (redisReaderFeed(nd->ctx->reader, t->rbuf, (size_t)got) != REDIS_OK) {
                    snprintf(why, why_size, "out of memory (hiredis)");
                    return false;
                }
                if (!drain(t, nd, why, why_size)) return false;
            } else if (!parse(t, nd, t->rbuf, (size_t)got, why, why_size)) {
                return false;
            }
            continue;
        }
        if (got == 0) {
            snprintf(why, why_size, "the server closed the connection");
            return false;
        }
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR) return true;
        char msg[96];
        if (strerror_r(e, msg, sizeof msg) != 0) snprintf(msg, sizeof msg, "errno %d", e);
        snprintf(why, why_size, "read: %s", msg);
        return false;
    }
    return true;
}

/* Write every active node's commands and read their replies, until all are
 * in or the deadline passes. */
static void pump(rtier_t *t, int64_t deadline) {
    struct pollfd fds[MAX_NODES];
    int32_t idx[MAX_NODES];
    for (;;) {
        int nf = 0;
        for (int32_t j = 0; j < t->nnodes; j++) {
            node_t *nd = &t->nodes[j];
            if (!nd->active) continue;
            if (nd->got == nd->count && nd->written) {
                nd->active = false;
                continue;
            }
            fds[nf].fd = nd->ctx->fd;
            fds[nf].events = (short)((nd->written ? 0 : POLLOUT) | POLLIN);
            fds[nf].revents = 0;
            idx[nf++] = j;
        }
        if (nf == 0) return;
        int wait = ms_left(deadline);
        int rc = wait > 0 ? poll(fds, (nfds_t)nf, wait) : 0;
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) { /* the budget is spent (or poll failed): give up on these */
            t->info.timeouts++;
            for (int k = 0; k < nf; k++) {
                node_t *nd = &t->nodes[idx[k]];
                abandon(t, nd);
                node_failed(t, nd, rc == 0 ? "no reply within the call's budget (timeout_ms)"
                                           : "poll failed");
            }
            return;
        }
        for (int k = 0; k < nf; k++) {
            node_t *nd = &t->nodes[idx[k]];
            short ev = fds[k].revents;
            if (ev == 0) continue;
            char why[128]; /* copied: node_failed() frees the context */
            if ((ev & POLLOUT) && !nd->written) {
                int done = 0;
                if (redisBufferWrite(nd->ctx, &done) != REDIS_OK) {
                    snprintf(why, sizeof why, "%s", nd->ctx->errstr);
                    abandon(t, nd);
                    node_failed(t, nd, why[0] ? why : "write failed");
                    continue;
                }
                nd->written = done != 0;
            }
            if ((ev & (POLLIN | POLLHUP | POLLERR)) && !receive(t, nd, why, sizeof why)) {
                abandon(t, nd);
                node_failed(t, nd, why);
            }
        }
    }
}

/* One command on one node, its reply in t->admin (NULL on failure, with
 * the reason in t->err). */
static redisReply *admin(rtier_t *t, node_t *nd, int argc, const char **argv,
                         const size_t *lens, int64_t deadline) {
    enum op saved = t->op;
    t->op = OP_ADMIN;
    t->admin = NULL;
    t->cmds[0].key = 0;
    t->cmds[0].kind = CMD_KEY;
    for (int32_t j = 0; j < t->nnodes; j++) t->nodes[j].active = false;
    if (redisAppendCommandArgv(nd->ctx, argc, argv, lens) != REDIS_OK) {
        node_failed(t, nd, "out of memory (hiredis)");
        t->op = saved;
        return NULL;
    }
    t->info.commands++;
    t->info.round_trips++;
    nd->first = 0;
    nd->count = 1;
    nd->got = 0;
    nd->written = false;
    nd->active = true;
    pump(t, deadline);
    t->op = saved;
    return t->admin;
}

static redisReply *admin_str(rtier_t *t, node_t *nd, int64_t deadline, int argc, ...) {
    const char *argv[8];
    size_t lens[8];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc && i < 8; i++) {
        argv[i] = va_arg(ap, const char *);
        lens[i] = strlen(argv[i]);
    }
    va_end(ap);
    return admin(t, nd, argc, argv, lens, deadline);
}

static int node_connect(rtier_t *t, node_t *nd, int64_t deadline) {
    int left = ms_left(deadline);
    int ms = left < t->connect_timeout_ms ? left : t->connect_timeout_ms;
    if (ms <= 0) return fail(t, KVP_EIO, "redis %s:%d: no time left to connect", nd->host,
                             nd->port);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(nd->host, nd->port, tv);
    if (c == NULL) {
        node_failed(t, nd, "out of memory (hiredis)");
        return KVP_EIO;
    }
    if (c->err) {
        char why[160];
        snprintf(why, sizeof why, "cannot connect: %s", c->errstr);
        redisFree(c);
        node_failed(t, nd, why);
        return KVP_EIO;
    }
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        redisFree(c);
        node_failed(t, nd, "cannot make the socket non-blocking");
        return KVP_EIO;
    }
    c->flags &= ~REDIS_BLOCK;
    nd->ctx = c;
    nd->pstate = P_LINE;
    nd->linelen = 0;
    t->info.connects++;
    int64_t end = now_ns() + ms_ns(t->connect_timeout_ms);
    if (end > deadline) end = deadline;
    if (nd->pass[0] || nd->user[0]) { /* a user without password: a `nopass` ACL user */
        redisReply *r = nd->user[0] ? admin_str(t, nd, end, 3, "AUTH", nd->user, nd->pass)
                                    : admin_str(t, nd, end, 2, "AUTH", nd->pass);
        if (r == NULL) return KVP_EIO;
        bool ok = r->type == REDIS_REPLY_STATUS;
        if (!ok) {
            fail(t, KVP_EACCES, "redis %s:%d: AUTH%s%s refused: %.*s", nd->host, nd->port,
                 nd->user[0] ? " as " : "", nd->user, (int)(r->len > 160 ? 160 : r->len),
                 r->str ? r->str : "");
            freeReplyObject(r);
            drop(nd);
            nd->down = true;
            nd->retry_at = now_ns() + ms_ns(t->retry_max_ms);
            return KVP_EACCES;
        }
        freeReplyObject(r);
    }
    if (nd->db != 0 && !t->cluster) {
        char db[16];
        snprintf(db, sizeof db, "%d", nd->db);
        redisReply *r = admin_str(t, nd, end, 2, "SELECT", db);
        if (r == NULL) return KVP_EIO;
        int rc = KVP_OK;
        if (r->type != REDIS_REPLY_STATUS) {
            rc = fail(t, is_denial(r->str, r->len) ? KVP_EACCES : KVP_EIO,
                      "redis %s:%d: SELECT %d refused: %.*s", nd->host, nd->port, nd->db,
                      (int)(r->len > 160 ? 160 : r->len), r->str ? r->str : "");
            drop(nd);
            nd->down = true;
            nd->retry_at = now_ns() + ms_ns(t->retry_max_ms);
        }
        freeReplyObject(r);
        if (rc != KVP_OK) return rc;
    }
    nd->backoff_ms = t->retry_min_ms;
    nd->retry_at = 0;
    nd->down = false;
    return KVP_OK;
}

/* Connected, or connected now; false when down (backing off) or failing. */
static bool ensure(rtier_t *t, node_t *nd, int64_t deadline, int *status) {
    if (nd->ctx != NULL) return true;
    if (now_ns() < nd->retry_at) {
        int rc = fail(t, KVP_EIO, "redis %s:%d: down after a failure; tried again once its "
                      "backoff has passed", nd->host, nd->port);
        if (status) *status = rc;
        return false;
    }
    int rc = node_connect(t, nd, deadline);
    if (status) *status = rc;
    return rc == KVP_OK;
}

/* Read the Cluster's slot map from the first node that answers. */
static int refresh_slots(rtier_t *t, int64_t deadline) {
    int status = fail(t, KVP_EIO, "no Cluster node answers");
    for (int32_t j = 0; j < t->nnodes; j++) {
        node_t *nd = &t->nodes[j];
        if (!ensure(t, nd, deadline, &status)) continue;
        redisReply *r = admin_str(t, nd, deadline, 2, "CLUSTER", "SLOTS");
        if (r == NULL) continue;
        if (r->type != REDIS_REPLY_ARRAY) {
            status = fail(t, is_denial(r->str, r->len) ? KVP_EACCES : KVP_EIO,
                          "redis %s:%d: CLUSTER SLOTS: %.*s", nd->host, nd->port,
                          (int)(r->len > 160 ? 160 : r->len), r->str ? r->str : "");
            freeReplyObject(r);
            if (status == KVP_EACCES) return status;
            continue;
        }
        int16_t *map = t->slots;
        for (int32_t s = 0; s < NSLOTS; s++) map[s] = NO_NODE;
        for (size_t e = 0; e < r->elements; e++) {
            redisReply *row = r->element[e];
            if (row->type != REDIS_REPLY_ARRAY || row->elements < 3) continue;
            redisReply *lo = row->element[0], *hi = row->element[1], *m = row->element[2];
            if (lo->type != REDIS_REPLY_INTEGER || hi->type != REDIS_REPLY_INTEGER ||
                m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
                m->element[0]->type != REDIS_REPLY_STRING ||
                m->element[1]->type != REDIS_REPLY_INTEGER)
                continue;
            const char *host = m->element[0]->str;
            size_t hl = m->element[0]->len;
            if (hl == 0 || (hl == 1 && host[0] == '?')) { /* "the node you asked" */
                host = nd->host;
                hl = strlen(nd->host);
            }
            long long port = m->element[1]->integer;
            if (port < 1 || port > 65535) continue;
            int32_t to = node_at(t, host, hl, (int)port);
            if (to == NO_NODE) continue;
            for (long long s = lo->integer; s <= hi->integer && s < NSLOTS; s++)
                if (s >= 0) map[s] = (int16_t)to;
        }
        freeReplyObject(r);
        t->info.slot_refreshes++;
        t->need_refresh = false;
        t->refresh_at = 0;
        return KVP_OK;
    }
    t->refresh_at = now_ns() + ms_ns(t->retry_min_ms);
    return status;
}

/* ---- batched calls ------------------------------------------------------------ */

static bool grow(rtier_t *t, int32_t n) {
    if (n <= t->cap) return true;
    int32_t cap = t->cap ? t->cap : 32;
    while (cap < n) cap = cap > INT32_MAX / 2 ? n : cap * 2;
    const kvp_allocator_t *a = &t->alloc;
    char *keys = (char *)kvp__calloc(a, (size_t)cap, KEY_BYTES, 0);
    int32_t *route = (int32_t *)kvp__calloc(a, (size_t)cap, sizeof(int32_t), 0);
    uint8_t *asking = (uint8_t *)kvp__calloc(a, (size_t)cap, 1, 0);
    uint8_t *failed = (uint8_t *)kvp__calloc(a, (size_t)cap, 1, 0);
    cmd_t *cmds = (cmd_t *)kvp__calloc(a, (size_t)cap * 2, sizeof(cmd_t), 0);
    if (!keys || !route || !asking || !failed || !cmds) {
        kvp__free(a, keys);
        kvp__free(a, route);
        kvp__free(a, asking);
        kvp__free(a, failed);
        kvp__free(a, cmds);
        return false;
    }
    kvp__free(a, t->keys);
    kvp__free(a, t->route);
    kvp__free(a, t->asking);
    kvp__free(a, t->failed);
    kvp__free(a, t->cmds);
    t->keys = keys;
    t->route = route;
    t->asking = asking;
    t->failed = failed;
    t->cmds = cmds;
    t->cap = cap;
    return true;
}

static void format_key(const rtier_t *t, const kvp_hash_t *h, char *out) {
    static const char hex[] = "0123456789abcdef";
    memcpy(out, t->prefix, t->prefix_len);
    char *o = out + t->prefix_len;
    for (int i = 0; i < 32; i++) {
        o[2 * i] = hex[h->bytes[i] >> 4];
        o[2 * i + 1] = hex[h->bytes[i] & 15];
    }
    o[64] = 0;
}

static const char *key_of(const rtier_t *t, int32_t i) { return t->keys + (size_t)i * KEY_BYTES; }

/* Append the command for key i to its node's connection. */
static bool append(rtier_t *t, node_t *nd, int32_t i) {
    static const char *const names[] = {"GET", "SET", "EXISTS", "UNLINK"};
    const char *argv[5] = {names[t->op], key_of(t, i), NULL, NULL, NULL};
    size_t lens[5] = {strlen(names[t->op]), t->prefix_len + 64, 0, 0, 0};
    int argc = 2;
    char ttl[16];
    if (t->op == OP_PUT) {
        argv[2] = (const char *)t->blobs[i];
        lens[2] = (size_t)t->blob_sizes[i];
        argc = 3;
        if (t->ttl_s > 0) {
            snprintf(ttl, sizeof ttl, "%d", (int)t->ttl_s);
            argv[3] = "EX";
            lens[3] = 2;
            argv[4] = ttl;
            lens[4] = strlen(ttl);
            argc = 5;
        }
    }
    if (t->asking[i]) {
        const char *a[1] = {"ASKING"};
        size_t al[1] = {6};
        if (redisAppendCommandArgv(nd->ctx, 1, a, al) != REDIS_OK) return false;
        t->cmds[nd->first + nd->count++] = (cmd_t){i, CMD_ASKING};
        t->info.commands++;
    }
    if (redisAppendCommandArgv(nd->ctx, argc, argv, lens) != REDIS_OK) return false;
    t->cmds[nd->first + nd->count++] = (cmd_t){i, CMD_KEY};
    t->info.commands++;
    return true;
}

/* Run the current call (t->op over t->n keys whose strings and routes are
 * set) until every key is settled, rounds run out, or the deadline passes. */
static void run(rtier_t *t, int64_t deadline) {
    bool need[MAX_NODES];
    for (int round = 0; round < MAX_ROUNDS; round++) {
        int32_t pending = 0;
        memset(need, 0, sizeof need);
        for (int32_t i = 0; i < t->n; i++) {
            int32_t j = t->route[i];
            if (j == NO_NODE) continue;
            need[j] = true;
            pending++;
        }
        if (pending == 0) return;
        if (ms_left(deadline) == 0) break;
        /* connect first (connecting runs commands of its own), then lay out
         * each node's commands in the call's list */
        for (int32_t j = 0; j < t->nnodes; j++) {
            t->nodes[j].active = false;
            if (need[j] && !ensure(t, &t->nodes[j], deadline, NULL)) {
                need[j] = false;
                for (int32_t i = 0; i < t->n; i++)
                    if (t->route[i] == j) {
                        t->info.skipped++;
                        settle(t, i, false);
                    }
            }
        }
        int32_t first = 0;
        for (int32_t j = 0; j < t->nnodes; j++) {
            node_t *nd = &t->nodes[j];
            nd->first = first;
            nd->count = 0;
            nd->got = 0;
            nd->written = false;
            nd->active = need[j];
            if (!need[j]) continue;
            for (int32_t i = 0; i < t->n; i++)
                if (t->route[i] == j) first += 1 + t->asking[i];
        }
        for (int32_t i = 0; i < t->n; i++) {
            int32_t j = t->route[i];
            if (j == NO_NODE || !t->nodes[j].active) continue;
            if (!append(t, &t->nodes[j], i)) {
                abandon(t, &t->nodes[j]);
                node_failed(t, &t->nodes[j], "out of memory (hiredis)");
                for (int32_t k = 0; k < t->n; k++)
                    if (t->route[k] == j) settle(t, k, false);
            }
        }
        /* redirected keys get a new route (and maybe ASKING) in on_reply */
        for (int32_t i = 0; i < t->n; i++) t->asking[i] = 0;
        for (int32_t j = 0; j < t->nnodes; j++)
            if (t->nodes[j].active) t->info.round_trips++;
        pump(t, deadline);
    }
    bool late = false;
    for (int32_t i = 0; i < t->n; i++)
        if (t->route[i] != NO_NODE) {
            late = true;
            settle(t, i, false);
        }
    if (late && ms_left(deadline) == 0) {
        t->info.timeouts++;
        fail(t, KVP_EIO, "the call's budget (timeout_ms = %d) was spent", (int)t->timeout_ms);
    } else if (late) {
        fail(t, KVP_EIO, "keys still redirected after %d exchanges", MAX_ROUNDS);
    }
}

/* Lock the tier by the deadline; false (and a sentence) if it could not. */
static bool lock_by(rtier_t *t, int64_t deadline) {
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    int64_t left = deadline - now_ns();
    if (left < 0) left = 0;
    int64_t ns = rt.tv_nsec + left % 1000000000;
    rt.tv_sec += (time_t)(left / 1000000000 + ns / 1000000000);
    rt.tv_nsec = (long)(ns % 1000000000);
    return pthread_mutex_timedlock(&t->lock, &rt) == 0;
}

/* The detail text of this thread's last failed call: the wrapper asks for
 * it right after the call, and t->err may belong to another thread's call
 * by then (or be written by one that holds the lock). */
static _Thread_local char call_err[KVP_ERR_SIZE];

/* The common part of the four calls: lock, route, run. On KVP_OK the lock
 * is held and every key is settled (t->failed says which failed). */
typedef struct {
    void *const *bufs;
    const uint64_t *caps;
    uint64_t *sizes;
    uint8_t *present;
    const void *const *blobs;
    const uint64_t *blob_sizes;
} args_t;

static int call(rtier_t *t, enum op op, int32_t n, const kvp_hash_t *keys, const args_t *a) {
    int64_t deadline = now_ns() + ms_ns(t->timeout_ms);
    if (!lock_by(t, deadline)) {
        snprintf(call_err, sizeof call_err, "the tier was busy with another call for the "
                 "whole budget (timeout_ms = %d)", (int)t->timeout_ms);
        return KVP_EIO;
    }
    if (!grow(t, n)) {
        pthread_mutex_unlock(&t->lock);
        snprintf(call_err, sizeof call_err, "out of memory (Redis tier, %d keys)", (int)n);
        return KVP_ENOMEM;
    }
    sigpipe_guard g;
    sigpipe_block(&g);
    t->op = op;
    t->n = n;
    t->bufs = a->bufs;
    t->caps = a->caps;
    t->sizes = a->sizes;
    t->present = a->present;
    t->blobs = a->blobs;
    t->blob_sizes = a->blob_sizes;
    t->denied = false;
    t->err[0] = 0;
    if (t->cluster && t->need_refresh && now_ns() >= t->refresh_at) refresh_slots(t, deadline);
    for (int32_t i = 0; i < n; i++) {
        char *k = t->keys + (size_t)i * KEY_BYTES;
        format_key(t, &keys[i], k);
        t->asking[i] = 0;
        t->failed[i] = 0;
        t->route[i] = route_key(t, &keys[i], k);
        if (t->route[i] == NO_NODE) { /* a slot no node serves (yet) */
            t->info.skipped++;
            t->failed[i] = 1;
            fail(t, KVP_EIO, "no Cluster node serves slot %d",
                 (int)key_slot(k, t->prefix_len + 64));
            t->need_refresh = true;
        }
    }
    run(t, deadline);
    sigpipe_restore(&g);
    return KVP_OK;
}

/* After a call: KVP_OK, or the failure of its keys (all of them for a get or
 * exists, whose answered keys would be lost otherwise; any for a put or
 * removal). Unlocks. */
static int finish(rtier_t *t, bool all, const char *what) {
    int32_t bad = 0;
    for (int32_t i = 0; i < t->n; i++) bad += t->failed[i];
    int rc = KVP_OK;
    if (bad > 0 && (!all || bad == t->n)) {
        rc = t->denied ? KVP_EACCES : KVP_EIO;
        snprintf(call_err, sizeof call_err, "%d of %d %s failed: %.200s", (int)bad, (int)t->n, what,
                 t->err[0] ? t->err : "a server did not answer");
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int r_get(void *self, int32_t n, const kvp_hash_t *keys, void *const *bufs,
                 const uint64_t *caps, uint64_t *sizes) {
    const args_t a = {bufs, caps, sizes, NULL, NULL, NULL};
    int rc = call((rtier_t *)self, OP_GET, n, keys, &a);
    return rc != KVP_OK ? rc : finish((rtier_t *)self, true, "gets");
}

static int r_put(void *self, int32_t n, const kvp_hash_t *keys, const void *const *blobs,
                 const uint64_t *sizes) {
    const args_t a = {NULL, NULL, NULL, NULL, blobs, sizes};
    int rc = call((rtier_t *)self, OP_PUT, n, keys, &a);
    return rc != KVP_OK ? rc : finish((rtier_t *)self, false, "puts");
}

static int r_exists(void *self, int32_t n, const kvp_hash_t *keys, uint8_t *present) {
    const args_t a = {NULL, NULL, NULL, present, NULL, NULL};
    int rc = call((rtier_t *)self, OP_EXISTS, n, keys, &a);
    return rc != KVP_OK ? rc : finish((rtier_t *)self, true, "lookups");
}

static int r_remove(void *self, int32_t n, const kvp_hash_t *keys) {
    const args_t a = {NULL, NULL, NULL, NULL, NULL, NULL};
    int rc = call((rtier_t *)self, OP_REMOVE, n, keys, &a);
    return rc != KVP_OK ? rc : finish((rtier_t *)self, false, "removals");
}

static const char *r_last_error(void *self) {
    (void)self;
    return call_err[0] ? call_err : NULL;
}

static void r_destroy(void *self) {
    rtier_t *t = (rtier_t *)self;
    for (int32_t j = 0; j < t->nnodes; j++) drop(&t->nodes[j]);
    const kvp_allocator_t a = t->alloc;
    kvp__free(&a, t->keys);
    kvp__free(&a, t->route);
    kvp__free(&a, t->asking);
    kvp__free(&a, t->failed);
    kvp__free(&a, t->cmds);
    kvp__free(&a, t->rbuf);
    pthread_mutex_destroy(&t->lock);
    kvp__free(&a, t);
}

/* ---- creation ------------------------------------------------------------------ */

static int check_params(const kvp_redis_tier_params_t *p, char *err, size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__check_reserved(p->reserved_, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__allocator_check(&p->allocator, err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->uri == NULL || p->uri[0] == 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "uri is not set (redis://host:port)");
    if (p->cluster < -1 || p->cluster > 1)
        return kvp__errf(err, err_size, KVP_EINVAL, "cluster must be -1 (ask), 0 or 1, not %d",
                         (int)p->cluster);
    if (p->prefix != NULL && strlen(p->prefix) > PREFIX_MAX)
        return kvp__errf(err, err_size, KVP_EINVAL, "prefix is longer than %d bytes",
                         PREFIX_MAX);
    struct {
        const char *name;
        int32_t v, lo;
    } ms[] = {{"connect_timeout_ms", p->connect_timeout_ms, 1},
              {"timeout_ms", p->timeout_ms, 1},
              {"ttl_s", p->ttl_s, 0},
              {"retry_min_ms", p->retry_min_ms, 1},
              {"retry_max_ms", p->retry_max_ms, 1}};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        if (ms[i].v < ms[i].lo || (ms[i].v > MAX_MS && i != 2))
            return kvp__errf(err, err_size, KVP_EINVAL, "%s must be %d..%d, not %d",
                             ms[i].name, (int)ms[i].lo, MAX_MS, (int)ms[i].v);
    if (p->retry_max_ms < p->retry_min_ms)
        return kvp__errf(err, err_size, KVP_EINVAL, "retry_max_ms (%d) is below retry_min_ms "
                         "(%d)", (int)p->retry_max_ms, (int)p->retry_min_ms);
    if ((p->user != NULL && strlen(p->user) >= CRED_BYTES) ||
        (p->password != NULL && strlen(p->password) >= CRED_BYTES))
        return kvp__errf(err, err_size, KVP_EINVAL, "user and password are at most %d bytes",
                         CRED_BYTES - 1);
    return KVP_OK;
}

static int parse_uris(rtier_t *t, const kvp_redis_tier_params_t *p, char *err,
                      size_t err_size) {
    const char *s = p->uri;
    while (*s) {
        while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n') s++;
        if (*s == 0) break;
        const char *e = s;
        while (*e && *e != ',' && *e != ' ' && *e != '\t' && *e != '\n') e++;
        if (t->nnodes == MAX_NODES)
            return kvp__errf(err, err_size, KVP_EINVAL, "uri: at most %d servers", MAX_NODES);
        node_t *nd = &t->nodes[t->nnodes];
        int rc = parse_uri(s, (size_t)(e - s), p, nd, err, err_size);
        if (rc != KVP_OK) return rc;
        for (int32_t j = 0; j < t->nnodes; j++)
            if (t->nodes[j].seed == nd->seed && !strcmp(t->nodes[j].host, nd->host) &&
                t->nodes[j].port == nd->port && t->nodes[j].db == nd->db)
                return kvp__errf(err, err_size, KVP_EINVAL, "uri: %s:%d/%d is listed twice",
                                 nd->host, nd->port, nd->db);
        nd->backoff_ms = p->retry_min_ms;
        t->nnodes++;
        s = e;
    }
    if (t->nnodes == 0) return kvp__errf(err, err_size, KVP_EINVAL, "uri lists no server");
    return KVP_OK;
}

/* The tier may run each command it uses: probe them on every node with a
 * key of its namespace. Only a denial fails (a redirect means the command
 * passed the server's ACL check, which comes first). */
static int probe(rtier_t *t, node_t *nd, int64_t deadline) {
    char key[PREFIX_MAX + 16];
    snprintf(key, sizeof key, "%sprobe", t->prefix);
    char ttl[16];
    snprintf(ttl, sizeof ttl, "%d", t->ttl_s > 0 ? (int)t->ttl_s : 60);
    const char *cmds[4][5] = {{"SET", key, "", "EX", ttl},
                              {"GET", key, NULL, NULL, NULL},
                              {"EXISTS", key, NULL, NULL, NULL},
                              {"UNLINK", key, NULL, NULL, NULL}};
    const int argcs[4] = {5, 2, 2, 2};
    for (int c = 0; c < 4; c++) {
        size_t lens[5];
        for (int k = 0; k < argcs[c]; k++) lens[k] = strlen(cmds[c][k]);
        redisReply *r = admin(t, nd, argcs[c], cmds[c], lens, deadline);
        if (r == NULL) return KVP_EIO;
        int rc = KVP_OK;
        if (r->type == REDIS_REPLY_ERROR && is_denial(r->str, r->len))
            rc = fail(t, KVP_EACCES, "redis %s:%d: %s on the tier's keys (%s*) refused: %.*s",
                      nd->host, nd->port, cmds[c][0], t->prefix,
                      (int)(r->len > 140 ? 140 : r->len), r->str);
        freeReplyObject(r);
        if (rc != KVP_OK) return rc;
    }
    return KVP_OK;
}

/* Connect every node (`fresh`: close open connections first), read the
 * slot map of a Cluster, and probe the commands (`probing`). */
static int connect_all(rtier_t *t, bool fresh, bool probing) {
    int64_t deadline = now_ns() + ms_ns(t->connect_timeout_ms) * (t->nnodes + 1) +
                       ms_ns(t->timeout_ms);
    int first = KVP_OK;
    for (int32_t j = 0; j < t->nnodes; j++) {
        node_t *nd = &t->nodes[j];
        if (fresh) drop(nd);
        nd->retry_at = 0;
        nd->backoff_ms = t->retry_min_ms;
    }
    if (t->cluster) {
        int rc = refresh_slots(t, deadline);
        if (rc != KVP_OK) return rc;
    }
    char why[KVP_ERR_SIZE] = "";
    for (int32_t j = 0; j < t->nnodes; j++) {
        node_t *nd = &t->nodes[j];
        int rc = KVP_OK;
        if (t->cluster) { /* only nodes that serve slots need to answer */
            bool serves = false;
            for (int32_t s = 0; s < NSLOTS && !serves; s++) serves = t->slots[s] == j;
            if (!serves) continue;
        }
        if (!ensure(t, nd, deadline, &rc)) {
            if (first == KVP_OK || (rc == KVP_EACCES && first != KVP_EACCES)) {
                first = rc;
                snprintf(why, sizeof why, "%s", t->err);
            }
            continue;
        }
        if (probing) rc = probe(t, nd, deadline);
        if (rc != KVP_OK && (first == KVP_OK || (rc == KVP_EACCES && first != KVP_EACCES))) {
            first = rc;
            snprintf(why, sizeof why, "%s", t->err);
        }
    }
    if (first != KVP_OK) snprintf(t->err, sizeof t->err, "%s", why);
    return first;
}

/* Standalone or Cluster? Ask the first server that answers. */
static int detect(rtier_t *t) {
    int64_t deadline = now_ns() + ms_ns(t->connect_timeout_ms) * t->nnodes + ms_ns(t->timeout_ms);
    int status = KVP_EIO;
    for (int32_t j = 0; j < t->nnodes; j++) {
        node_t *nd = &t->nodes[j];
        if (!ensure(t, nd, deadline, &status)) {
            if (status == KVP_EACCES) return status;
            continue;
        }
        redisReply *r = admin_str(t, nd, deadline, 2, "CLUSTER", "SLOTS");
        if (r == NULL) continue;
        bool array = r->type == REDIS_REPLY_ARRAY;
        bool denied = r->type == REDIS_REPLY_ERROR && is_denial(r->str, r->len);
        if (denied && r->len >= 6 && memcmp(r->str, "NOAUTH", 6) == 0)
            status = fail(t, KVP_EACCES, "redis %s:%d: the server wants a password: %.*s",
                          nd->host, nd->port, (int)(r->len > 120 ? 120 : r->len), r->str);
        else if (denied)
            status = fail(t, KVP_EACCES, "redis %s:%d: CLUSTER SLOTS refused: %.*s (set cluster "
                          "to 0 or 1 to skip the question)", nd->host, nd->port,
                          (int)(r->len > 120 ? 120 : r->len), r->str);
        freeReplyObject(r);
        if (denied) return status;
        t->cluster = array;
        return KVP_OK;
    }
    return status;
}

int kvp_redis_tier_create(const kvp_redis_tier_params_t *p, kvp_blob_tier_t **out, char *err,
                          size_t err_size) {
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    int rc = check_params(p, err, err_size);
    if (rc != KVP_OK) return rc;
    rtier_t *t = (rtier_t *)kvp__calloc(&p->allocator, 1, sizeof *t, 0);
    if (t == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (Redis tier)");
    t->alloc = p->allocator;
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        kvp__free(&p->allocator, t);
        return kvp__errf(err, err_size, KVP_ENOMEM, "cannot create the Redis tier's lock");
    }
    snprintf(t->prefix, sizeof t->prefix, "%s", p->prefix ? p->prefix : "kvp:");
    t->prefix_len = strlen(t->prefix);
    t->connect_timeout_ms = p->connect_timeout_ms;
    t->timeout_ms = p->timeout_ms;
    t->ttl_s = p->ttl_s;
    t->retry_min_ms = p->retry_min_ms;
    t->retry_max_ms = p->retry_max_ms;
    t->info.struct_size = sizeof t->info;
    for (int32_t s = 0; s < NSLOTS; s++) t->slots[s] = NO_NODE;
    rc = parse_uris(t, p, err, err_size);
    if (rc == KVP_OK) t->rbuf = (char *)kvp__malloc(&t->alloc, READ_BYTES, 64);
    if (rc == KVP_OK && (t->rbuf == NULL || !grow(t, 32)))
        rc = kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (Redis tier)");
    if (rc == KVP_OK) {
        sigpipe_guard g;
        sigpipe_block(&g);
        t->cluster = p->cluster == 1;
        if (p->cluster == -1) rc = detect(t);
        if (rc == KVP_OK && t->cluster) {
            for (int32_t j = 0; j < t->nnodes; j++)
                if (t->nodes[j].db != 0) {
                    rc = fail(t, KVP_EINVAL, "uri: a Cluster has only database 0 (%s:%d/%d)",
                              t->nodes[j].host, t->nodes[j].port, t->nodes[j].db);
                    break;
                }
        }
        if (rc == KVP_OK) rc = connect_all(t, false, true);
        sigpipe_restore(&g);
        if (rc != KVP_OK) kvp__errf(err, err_size, rc, "%s", t->err);
    }
    if (rc != KVP_OK) {
        r_destroy(t);
        return rc;
    }
    t->err[0] = 0;
    kvp_blob_tier_ops_t ops;
    memset(&ops, 0, sizeof ops);
    ops.struct_size = sizeof ops;
    ops.get = r_get;
    ops.put = r_put;
    ops.exists = r_exists;
    ops.remove = r_remove;
    ops.last_error = r_last_error;
    ops.destroy = r_destroy;
    rc = kvp__blob_tier_create(&ops, t, t->cluster ? "redis-cluster" : "redis", &p->allocator,
                               out, err, err_size);
    if (rc != KVP_OK) r_destroy(t);
    return rc;
}

static int tier_of(kvp_blob_tier_t *tier, rtier_t **out) {
    *out = (rtier_t *)kvp__blob_tier_self(tier, r_put);
    if (*out == NULL) return kvp__blob_tier_fail(tier, KVP_EINVAL, "not a Redis tier");
    return KVP_OK;
}

int kvp_redis_tier_info(kvp_blob_tier_t *tier, kvp_redis_tier_info_t *info) {
    if (tier == NULL) return KVP_EINVAL;
    rtier_t *t;
    int rc = tier_of(tier, &t);
    if (rc != KVP_OK) return rc;
    char why[KVP_ERR_SIZE];
    if (kvp__check_struct(info, sizeof *info, "info", why, sizeof why) != KVP_OK)
        return kvp__blob_tier_fail(tier, KVP_EINVAL, "%s", why);
    pthread_mutex_lock(&t->lock);
    kvp_redis_tier_info_t r = t->info;
    r.struct_size = sizeof r;
    r.cluster = t->cluster;
    r.nodes = t->nnodes;
    r.nodes_down = 0;
    for (int32_t j = 0; j < t->nnodes; j++) r.nodes_down += t->nodes[j].down;
    pthread_mutex_unlock(&t->lock);
    kvp__copy_out(info, &r, sizeof r);
    return KVP_OK;
}

int kvp_redis_tier_reconnect(kvp_blob_tier_t *tier) {
    if (tier == NULL) return KVP_EINVAL;
    rtier_t *t;
    int rc = tier_of(tier, &t);
    if (rc != KVP_OK) return rc;
    pthread_mutex_lock(&t->lock);
    sigpipe_guard g;
    sigpipe_block(&g);
    t->op = OP_ADMIN;
    rc = connect_all(t, true, false);
    sigpipe_restore(&g);
    if (rc != KVP_OK) kvp__blob_tier_fail(tier, rc, "reconnect: %s", t->err);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

#endif /* KVP_HAVE_REDIS */
