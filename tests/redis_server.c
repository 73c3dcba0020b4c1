/*
 * Real Redis servers for the tests (see redis_server.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "redis_server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#ifdef KVP_HAVE_REDIS
#include <hiredis/hiredis.h>
#endif

static char rs_err[1024];

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rs_err, sizeof rs_err, fmt, ap);
    va_end(ap);
}

const char *rs_error(void) { return rs_err; }

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d != NULL) memcpy(d, s, n);
    return d;
}

#ifdef KVP_HAVE_REDIS
/* An executable of that name in $PATH. */
static int in_path(const char *name) {
    const char *path = getenv("PATH");
    if (path == NULL || *path == 0) path = "/usr/local/bin:/usr/bin:/bin";
    char buf[1024];
    for (const char *p = path; *p;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0 && n + strlen(name) + 2 < sizeof buf) {
            memcpy(buf, p, n);
            buf[n] = '/';
            strcpy(buf + n + 1, name);
            if (access(buf, X_OK) == 0) return 1;
        }
        if (e == NULL) break;
        p = e + 1;
    }
    return 0;
}
#endif

const char *rs_unavailable(void) {
#ifndef KVP_HAVE_REDIS
    return "this build has no hiredis (HAVE_REDIS=0; Debian: libhiredis-dev)";
#else
    if (!in_path("redis-server"))
        return "redis-server is not installed (scripts/ensure-deps.sh test installs it)";
    return NULL;
#endif
}

/* ---- ports --------------------------------------------------------------------------- */

/* Bind 127.0.0.1:port (0: any); the port bound, or -1. */
static int try_bind(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int got = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        socklen_t len = sizeof a;
        if (getsockname(fd, (struct sockaddr *)&a, &len) == 0) got = ntohs(a.sin_port);
    }
    close(fd);
    return got;
}

int rs_free_port(void) {
    for (int i = 0; i < 50; i++) {
        int p = try_bind(0);
        if (p <= 0) continue;
        if (p + 10000 > 65535) continue;
        if (try_bind(p + 10000) != p + 10000) continue;
        return p;
    }
    fail("no free loopback port (with port + 10000) in 50 tries");
    return -1;
}

/* ---- directories --------------------------------------------------------------------- */

void rs_remove_dir(const char *dir) {
    if (dir[0] == 0) return;
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

static void remove_dir(char *dir) {
    rs_remove_dir(dir);
    dir[0] = 0;
}

#ifdef KVP_HAVE_REDIS
/* The last lines of the server's log, appended to rs_err. */
static void append_log_tail(const rs_server *s) {
    char path[128];
    snprintf(path, sizeof path, "%s/log", s->dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    char buf[600];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    size_t have = strlen(rs_err);
    snprintf(rs_err + have, sizeof rs_err - have, "; log: %s", buf);
}
#endif

/* ---- processes ----------------------------------------------------------------------- */

void rs_set_auth(rs_server *s, const char *user, const char *password) {
    snprintf(s->user, sizeof s->user, "%s", user ? user : "");
    snprintf(s->password, sizeof s->password, "%s", password ? password : "");
}

void rs_uri(const rs_server *s, const char *suffix, char *buf, size_t size) {
    snprintf(buf, size, "redis://127.0.0.1:%d%s", s->port, suffix ? suffix : "");
}

/* Reap the child if it has exited: 1 if it has (pid cleared). */
static int reaped(rs_server *s) {
    if (s->pid <= 0) return 1;
    int status;
    pid_t r = waitpid((pid_t)s->pid, &status, WNOHANG);
    if (r == (pid_t)s->pid || (r < 0 && errno == ECHILD)) {
        s->pid = 0;
        return 1;
    }
    return 0;
}

static void kill_wait(rs_server *s) {
    if (s->pid <= 0) return;
    kill((pid_t)s->pid, SIGKILL);
    int status;
    while (waitpid((pid_t)s->pid, &status, 0) < 0 && errno == EINTR) {
    }
    s->pid = 0;
}

#ifdef KVP_HAVE_REDIS
static int ping_once(int port) {
    struct timeval tv = {0, 100000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL) return 0;
    int up = 0;
    if (!c->err) {
        redisSetTimeout(c, tv);
        redisReply *r = redisCommand(c, "PING");
        /* PONG, or NOAUTH with a password: it answers */
        up = r != NULL && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR);
        if (r != NULL) freeReplyObject(r);
    }
    redisFree(c);
    return up;
}
#endif

/* Fork and exec the server on s->port in s->dir; wait until it answers.
 * 0, 1 (it exited: e.g. the port was taken), -1 (no answer in time). */
static int launch(rs_server *s) {
#ifndef KVP_HAVE_REDIS
    (void)s;
    fail("%s", rs_unavailable());
    return -1;
#else
    char port[16], logf[128], confp[128];
    snprintf(port, sizeof port, "%d", s->port);
    snprintf(logf, sizeof logf, "%s/log", s->dir);
    snprintf(confp, sizeof confp, "%s/redis.conf", s->dir);
    if (s->conf != NULL) {
        FILE *f = fopen(confp, "w");
        if (f == NULL || fputs(s->conf, f) < 0) {
            if (f) fclose(f);
            fail("cannot write %s", confp);
            return -1;
        }
        fclose(f);
    }
    const char *argv[16 + RS_MAX_ARGS];
    int a = 0;
    argv[a++] = "redis-server";
    if (s->conf != NULL) argv[a++] = confp;
    const char *fixed[] = {"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
                           "no", "--dir", s->dir, "--daemonize", "no", "--logfile", logf};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) argv[a++] = fixed[i];
    for (int i = 0; i < s->nargs; i++) argv[a++] = s->args[i];
    argv[a] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fail("fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
#else
        (void)parent;
#endif
        setpgid(0, 0); /* a ^C to the test reaches the test, which stops it */
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        for (int fd = 3; fd < 1024; fd++) close(fd);
        execvp("redis-server", (char *const *)(void *)argv);
        _exit(127);
    }
    s->pid = (int)pid;
    long long until = now_ms() + 5000;
    for (int i = 0; i < 100; i++) {
        if (reaped(s)) {
            fail("redis-server on port %d exited at start", s->port);
            append_log_tail(s);
            return 1;
        }
        if (ping_once(s->port)) return 0;
        if (now_ms() > until) break;
        sleep_ms(i < 10 ? 5 : 40);
    }
    fail("redis-server on port %d does not answer PING", s->port);
    append_log_tail(s);
    kill_wait(s);
    return -1;
#endif
}

static void forget_args(rs_server *s) {
    for (int i = 0; i < s->nargs; i++) free(s->args[i]);
    s->nargs = 0;
    free(s->conf);
    s->conf = NULL;
}

int rs_start(rs_server *s, const char *conf, const char *const *args, int nargs) {
    if (s->pid > 0 || nargs < 0 || nargs > RS_MAX_ARGS) {
        fail("rs_start: running already, or too many arguments");
        return -1;
    }
    const char *why = rs_unavailable();
    if (why != NULL) {
        fail("%s", why);
        return -1;
    }
    char user[64], password[128];
    memcpy(user, s->user, sizeof user);
    memcpy(password, s->password, sizeof password);
    memset(s, 0, sizeof *s);
    memcpy(s->user, user, sizeof user);
    memcpy(s->password, password, sizeof password);
    for (int i = 0; i < nargs; i++) {
        s->args[i] = dup_str(args[i]);
        s->nargs = i + 1;
        if (s->args[i] == NULL) goto nomem;
    }
    if (conf != NULL && (s->conf = dup_str(conf)) == NULL) goto nomem;
    snprintf(s->dir, sizeof s->dir, "/tmp/kvp_redis_XXXXXX");
    if (mkdtemp(s->dir) == NULL) {
        fail("mkdtemp: %s", strerror(errno));
        s->dir[0] = 0;
        forget_args(s);
        return -1;
    }
    for (int attempt = 0; attempt < 3; attempt++) { /* a port taken meanwhile: another */
        s->port = rs_free_port();
        if (s->port < 0) break;
        int rc = launch(s);
        if (rc == 0) return 0;
        if (rc < 0) break;
    }
    remove_dir(s->dir);
    forget_args(s);
    s->port = 0;
    return -1;
nomem:
    forget_args(s);
    fail("out of memory");
    return -1;
}

int rs_stop(rs_server *s) {
    int rc = 0;
    if (s->pid > 0) {
        kill((pid_t)s->pid, SIGCONT); /* were it frozen */
        kill((pid_t)s->pid, SIGTERM);
        long long until = now_ms() + 5000;
        for (int i = 0; i < 500 && !reaped(s); i++) {
            if (now_ms() > until) break;
            sleep_ms(10);
        }
        if (s->pid > 0) {
            rc = -1;
            kill_wait(s);
        }
    }
    remove_dir(s->dir);
    forget_args(s);
    s->port = 0;
    return rc;
}

int rs_kill(rs_server *s) {
    if (s->pid <= 0) {
        fail("rs_kill: not running");
        return -1;
    }
    kill_wait(s);
    return 0;
}

int rs_freeze(rs_server *s, int frozen) {
    if (s->pid <= 0) {
        fail("rs_freeze: not running");
        return -1;
    }
    return kill((pid_t)s->pid, frozen ? SIGSTOP : SIGCONT) == 0 ? 0 : -1;
}

int rs_restart(rs_server *s) {
    if (s->pid > 0 || s->port <= 0 || s->dir[0] == 0) {
        fail("rs_restart: running, or never started");
        return -1;
    }
    /* the port is ours; a socket of the dead server may linger a moment */
    for (int attempt = 0; attempt < 5; attempt++) {
        int rc = launch(s);
        if (rc == 0) return 0;
        if (rc < 0) return -1;
        sleep_ms(100);
    }
    return -1;
}

/* ---- commands ------------------------------------------------------------------------ */

void rs_reply_free(rs_reply *r) {
    if (r == NULL) return;
    for (size_t i = 0; i < r->elements; i++) rs_reply_free(r->element[i]);
    free(r->element);
    free(r->str);
    free(r);
}

#ifdef KVP_HAVE_REDIS
static rs_reply *copy_reply(const redisReply *in) {
    rs_reply *r = calloc(1, sizeof *r);
    if (r == NULL) return NULL;
    switch (in->type) {
    case REDIS_REPLY_STRING: r->type = RS_STRING; break;
    case REDIS_REPLY_ARRAY: r->type = RS_ARRAY; break;
    case REDIS_REPLY_INTEGER: r->type = RS_INTEGER; break;
    case REDIS_REPLY_STATUS: r->type = RS_STATUS; break;
    case REDIS_REPLY_ERROR: r->type = RS_ERROR; break;
    default: r->type = RS_NIL; break;
    }
    r->integer = in->integer;
    if (in->str != NULL) {
        r->str = malloc(in->len + 1);
        if (r->str == NULL) goto nomem;
        memcpy(r->str, in->str, in->len);
        r->str[in->len] = 0;
        r->len = in->len;
    }
    if (in->type == REDIS_REPLY_ARRAY && in->elements > 0) {
        r->element = calloc(in->elements, sizeof *r->element);
        if (r->element == NULL) goto nomem;
        r->elements = in->elements;
        for (size_t i = 0; i < in->elements; i++)
            if ((r->element[i] = copy_reply(in->element[i])) == NULL) goto nomem;
    }
    return r;
nomem:
    rs_reply_free(r);
    return NULL;
}

/* A connection, authenticated, on database `db`. */
static redisContext *connect_to(const rs_server *s, int db) {
    if (s->port <= 0) {
        fail("no server");
        return NULL;
    }
    struct timeval ctv = {1, 0}, tv = {10, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, ctv);
    if (c == NULL || c->err) {
        fail("connect to port %d: %s", s->port, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *r = NULL;
    if (s->password[0] && s->user[0])
        r = redisCommand(c, "AUTH %s %s", s->user, s->password);
    else if (s->password[0])
        r = redisCommand(c, "AUTH %s", s->password);
    if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        fail("AUTH on port %d: %s", s->port, r->str);
        freeReplyObject(r);
        redisFree(c);
        return NULL;
    }
    if (r != NULL) freeReplyObject(r);
    if (db != 0) {
        r = redisCommand(c, "SELECT %d", db);
        int bad = r == NULL || r->type == REDIS_REPLY_ERROR;
        if (bad) fail("SELECT %d on port %d: %s", db, s->port, r ? r->str : c->errstr);
        if (r != NULL) freeReplyObject(r);
        if (bad) {
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

static rs_reply *finish(redisContext *c, const rs_server *s, void *raw) {
    redisReply *r = (redisReply *)raw;
    rs_reply *out = NULL;
    if (r == NULL) {
        fail("command on port %d: %s", s->port, c->errstr);
    } else {
        out = copy_reply(r);
        if (out == NULL) fail("out of memory");
        else if (out->type == RS_ERROR) fail("port %d: %s", s->port, out->str);
        freeReplyObject(r);
    }
    redisFree(c);
    return out;
}
#endif

static rs_reply *command_v(const rs_server *s, int db, const char *fmt, va_list ap) {
#ifdef KVP_HAVE_REDIS
    redisContext *c = connect_to(s, db);
    if (c == NULL) return NULL;
    return finish(c, s, redisvCommand(c, fmt, ap));
#else
    (void)s;
    (void)db;
    (void)fmt;
    (void)ap;
    fail("%s", rs_unavailable());
    return NULL;
#endif
}

rs_reply *rs_command(const rs_server *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rs_reply *r = command_v(s, 0, fmt, ap);
    va_end(ap);
    return r;
}

rs_reply *rs_command_db(const rs_server *s, int db, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rs_reply *r = command_v(s, db, fmt, ap);
    va_end(ap);
    return r;
}

rs_reply *rs_command_argv(const rs_server *s, int db, int argc, const char *const *argv,
                          const size_t *lens) {
#ifdef KVP_HAVE_REDIS
    redisContext *c = connect_to(s, db);
    if (c == NULL) return NULL;
    const char **av; /* hiredis 0.14 takes `const char **` */
    memcpy(&av, &argv, sizeof av);
    return finish(c, s, redisCommandArgv(c, argc, av, lens));
#else
    (void)s;
    (void)db;
    (void)argc;
    (void)argv;
    (void)lens;
    fail("%s", rs_unavailable());
    return NULL;
#endif
}

long long rs_int(const rs_server *s, int db, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rs_reply *r = command_v(s, db, fmt, ap);
    va_end(ap);
    long long v = r != NULL && r->type == RS_INTEGER ? r->integer : RS_NOINT;
    rs_reply_free(r);
    return v;
}

int rs_ok(const rs_server *s, int db, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rs_reply *r = command_v(s, db, fmt, ap);
    va_end(ap);
    int ok = r != NULL && r->type != RS_ERROR;
    rs_reply_free(r);
    return ok;
}

void rs_keys_free(char **keys, int n) {
    if (keys == NULL) return;
    for (int i = 0; i < n; i++) free(keys[i]);
    free(keys);
}

int rs_keys(const rs_server *s, int db, const char *pattern, char ***keys) {
    *keys = NULL;
    int n = 0, cap = 0;
    char cursor[32] = "0";
    for (int round = 0; round < 100000; round++) {
        rs_reply *r = rs_command_db(s, db, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (r == NULL || r->type != RS_ARRAY || r->elements != 2 ||
            r->element[0]->type != RS_STRING || r->element[1]->type != RS_ARRAY) {
            rs_reply_free(r);
            rs_keys_free(*keys, n);
            *keys = NULL;
            return -1;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        const rs_reply *list = r->element[1];
        for (size_t i = 0; i < list->elements; i++) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                char **k = realloc(*keys, sizeof *k * (size_t)cap);
                if (k == NULL) {
                    rs_reply_free(r);
                    rs_keys_free(*keys, n);
                    *keys = NULL;
                    fail("out of memory");
                    return -1;
                }
                *keys = k;
            }
            (*keys)[n] = dup_str(list->element[i]->str ? list->element[i]->str : "");
            if ((*keys)[n] == NULL) {
                rs_reply_free(r);
                rs_keys_free(*keys, n);
                *keys = NULL;
                return -1;
            }
            n++;
        }
        rs_reply_free(r);
        if (strcmp(cursor, "0") == 0) return n;
    }
    fail("SCAN did not finish");
    rs_keys_free(*keys, n);
    *keys = NULL;
    return -1;
}

/* ---- a Cluster ----------------------------------------------------------------------- */

static unsigned crc16(const unsigned char *p, size_t n) {
    unsigned crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (unsigned)p[i] << 8;
        for (int b = 0; b < 8; b++) crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
        crc &= 0xffff;
    }
    return crc;
}

int rs_key_slot(const char *key, size_t len) {
    size_t open = 0;
    while (open < len && key[open] != '{') open++;
    if (open < len) {
        size_t close = open + 1;
        while (close < len && key[close] != '}') close++;
        if (close < len && close > open + 1) {
            key += open + 1;
            len = close - open - 1;
        }
    }
    return (int)(crc16((const unsigned char *)key, len) & (RS_SLOTS - 1));
}

static const char *const CLUSTER_ARGS[] = {"--cluster-enabled", "yes", "--cluster-config-file",
                                           "nodes.conf", "--cluster-node-timeout", "1000"};
#define N_CLUSTER_ARGS ((int)(sizeof CLUSTER_ARGS / sizeof CLUSTER_ARGS[0]))

void rs_cluster_stop(rs_cluster *c) {
    for (int i = 0; i < RS_MAX_NODES; i++) rs_stop(&c->node[i]);
    c->n = 0;
}

/* One node's CLUSTER INFO says ok, all slots, `nodes` nodes. */
static int node_agrees(const rs_server *s, int nodes) {
    rs_reply *r = rs_command(s, "CLUSTER INFO");
    int ok = 0;
    if (r != NULL && (r->type == RS_STRING || r->type == RS_STATUS)) {
        char want[64];
        snprintf(want, sizeof want, "cluster_known_nodes:%d\r", nodes);
        ok = strstr(r->str, "cluster_state:ok") != NULL &&
             strstr(r->str, "cluster_slots_assigned:16384") != NULL && strstr(r->str, want) != NULL;
        if (!ok) fail("port %d: %.300s", s->port, r->str);
    }
    rs_reply_free(r);
    return ok;
}

int rs_cluster_wait(rs_cluster *c) {
    long long until = now_ms() + 10000;
    for (int i = 0; i < 400; i++) {
        int all = 1;
        for (int k = 0; k < c->n && all; k++) all = node_agrees(&c->node[k], c->n);
        if (all) return 0;
        if (now_ms() > until) break;
        sleep_ms(25);
    }
    size_t have = strlen(rs_err);
    snprintf(rs_err + have, sizeof rs_err - have, " (the Cluster did not agree within 10 s)");
    return -1;
}

static int node_id(rs_cluster *c, int i) {
    rs_reply *r = rs_command(&c->node[i], "CLUSTER MYID");
    int ok = r != NULL && (r->type == RS_STRING || r->type == RS_STATUS) &&
             r->len < sizeof c->id[i] && r->len > 0;
    if (ok) memcpy(c->id[i], r->str, r->len + 1);
    rs_reply_free(r);
    return ok ? 0 : -1;
}

static int start_node(rs_cluster *c, int i) {
    if (rs_start(&c->node[i], NULL, CLUSTER_ARGS, N_CLUSTER_ARGS) != 0) return -1;
    return node_id(c, i);
}

int rs_cluster_start(rs_cluster *c, int n, int spares) {
    memset(c, 0, sizeof *c);
    if (n < 1 || spares < 0 || n + spares > RS_MAX_NODES) {
        fail("rs_cluster_start: 1 .. %d nodes in all", RS_MAX_NODES);
        return -1;
    }
    for (int i = 0; i < n + spares; i++)
        if (start_node(c, i) != 0) goto fail;
    c->n = n;
    for (int i = 0; i < n; i++) {
        int lo = (2 * i * RS_SLOTS + n) / (2 * n), hi = (2 * (i + 1) * RS_SLOTS + n) / (2 * n) - 1;
        if (!rs_ok(&c->node[i], 0, "CLUSTER ADDSLOTSRANGE %d %d", lo, hi)) goto fail;
        for (int s = lo; s <= hi; s++) c->owner[s] = (signed char)i;
        /* distinct epochs, as redis-cli gives them: no collision to settle */
        if (!rs_ok(&c->node[i], 0, "CLUSTER SET-CONFIG-EPOCH %d", i + 1)) goto fail;
    }
    for (int i = 1; i < n; i++)
        if (!rs_ok(&c->node[0], 0, "CLUSTER MEET 127.0.0.1 %d", c->node[i].port)) goto fail;
    if (rs_cluster_wait(c) != 0) goto fail;
    return 0;
fail:;
    char why[sizeof rs_err];
    memcpy(why, rs_err, sizeof why);
    rs_cluster_stop(c);
    memcpy(rs_err, why, sizeof why);
    return -1;
}

int rs_cluster_add_node(rs_cluster *c) {
    int i = c->n;
    if (i >= RS_MAX_NODES || i < 1) {
        fail("rs_cluster_add_node: no room");
        return -1;
    }
    if (c->node[i].pid <= 0 && start_node(c, i) != 0) return -1; /* else a spare */
    c->n = i + 1;
    if (!rs_ok(&c->node[0], 0, "CLUSTER MEET 127.0.0.1 %d", c->node[i].port)) return -1;
    return rs_cluster_wait(c) == 0 ? i : -1;
}

/* Move up to `max` keys of `slot` from node `from` to node `to`; the number moved or -1. */
static int migrate_keys(rs_cluster *c, int slot, int from, int to, int max) {
    int moved = 0;
    for (int round = 0; round < 1000 && moved < max; round++) {
        int want = max - moved < 100 ? max - moved : 100;
        rs_reply *r = rs_command(&c->node[from], "CLUSTER GETKEYSINSLOT %d %d", slot, want);
        if (r == NULL || r->type != RS_ARRAY) {
            rs_reply_free(r);
            return -1;
        }
        if (r->elements == 0) {
            rs_reply_free(r);
            return moved;
        }
        const char *argv[8 + 100];
        size_t lens[8 + 100];
        char port[16];
        snprintf(port, sizeof port, "%d", c->node[to].port);
        int a = 0;
        const char *head[] = {"MIGRATE", "127.0.0.1", port, "", "0", "5000", "KEYS"};
        for (int k = 0; k < 7; k++) argv[a++] = head[k];
        for (size_t k = 0; k < r->elements && k < 100; k++) argv[a++] = r->element[k]->str;
        for (int k = 0; k < a; k++) lens[k] = k >= 7 ? r->element[k - 7]->len : strlen(argv[k]);
        rs_reply *m = rs_command_argv(&c->node[from], 0, a, argv, lens);
        int ok = m != NULL && m->type == RS_STATUS;
        if (!ok && m != NULL) fail("MIGRATE: %s", m->str ? m->str : "?");
        rs_reply_free(m);
        moved += a - 7;
        rs_reply_free(r);
        if (!ok) return -1;
    }
    return moved;
}

static int begin_move(rs_cluster *c, int slot, int to) {
    if (slot < 0 || slot >= RS_SLOTS || to < 0 || to >= c->n) {
        fail("move: bad slot or node");
        return -1;
    }
    int from = c->owner[slot];
    if (from == to) {
        fail("move: slot %d is on node %d already", slot, to);
        return -1;
    }
    if (!rs_ok(&c->node[to], 0, "CLUSTER SETSLOT %d IMPORTING %s", slot, c->id[from])) return -1;
    if (!rs_ok(&c->node[from], 0, "CLUSTER SETSLOT %d MIGRATING %s", slot, c->id[to])) return -1;
    return from;
}

/* Move what is left of the slot and give it to `to` everywhere. */
static int finish_move(rs_cluster *c, int slot, int from, int to) {
    int moved = migrate_keys(c, slot, from, to, 1 << 30);
    if (moved < 0) return -1;
    /* the target first, then the source, then everyone else (as redis-cli) */
    if (!rs_ok(&c->node[to], 0, "CLUSTER SETSLOT %d NODE %s", slot, c->id[to])) return -1;
    if (!rs_ok(&c->node[from], 0, "CLUSTER SETSLOT %d NODE %s", slot, c->id[to])) return -1;
    for (int i = 0; i < c->n; i++)
        if (i != to && i != from &&
            !rs_ok(&c->node[i], 0, "CLUSTER SETSLOT %d NODE %s", slot, c->id[to]))
            return -1;
    c->owner[slot] = (signed char)to;
    return moved;
}

int rs_cluster_move_slot(rs_cluster *c, int slot, int to) {
    int from = begin_move(c, slot, to);
    return from < 0 ? -1 : finish_move(c, slot, from, to);
}

int rs_cluster_finish_move(rs_cluster *c, int slot, int to) {
    if (slot < 0 || slot >= RS_SLOTS || to < 0 || to >= c->n || c->owner[slot] == to) {
        fail("finish: bad slot or node");
        return -1;
    }
    return finish_move(c, slot, c->owner[slot], to);
}

int rs_cluster_half_move_slot(rs_cluster *c, int slot, int to, int keys) {
    int from = begin_move(c, slot, to);
    if (from < 0) return -1;
    return migrate_keys(c, slot, from, to, keys);
}

int rs_cluster_count(const rs_cluster *c, const char *pattern, int *per_node) {
    int total = 0;
    for (int i = 0; i < c->n; i++) {
        char **keys = NULL;
        int n = rs_keys(&c->node[i], 0, pattern, &keys);
        rs_keys_free(keys, n);
        if (n < 0) return -1;
        if (per_node != NULL) per_node[i] = n;
        total += n;
    }
    return total;
}
