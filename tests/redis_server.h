/*
 * Real Redis servers for the tests, on loopback only: started as children
 * (redis-server, no persistence, a temporary directory each), stopped,
 * killed and restarted on the same port, a 3-node Cluster whose slots can
 * be moved (or left half-moved) while a test runs, and a thin client to
 * look at what the servers hold.
 *
 * Every wait is bounded in tries and in time. Each server is started with
 * PR_SET_PDEATHSIG on Linux, so none outlives a test program that dies.
 *
 * Built with or without hiredis (KVP_HAVE_REDIS): without it every call
 * fails and rs_unavailable() says why.
 */
#ifndef KVPAGE_TESTS_REDIS_SERVER_H
#define KVPAGE_TESTS_REDIS_SERVER_H

#include <stddef.h>

#define RS_MAX_ARGS 24    /* extra command-line arguments of one server */
#define RS_MAX_NODES 6    /* nodes of one Cluster */
#define RS_SLOTS 16384
#define RS_NOINT (-0x7fffffffffffffffLL - 1) /* rs_int(): not an integer reply */

/* One server. Zero it (or RS_SERVER_INIT) before use; rs_stop() on a
 * zeroed or stopped server does nothing. */
typedef struct rs_server {
    int pid;                  /* the child; 0 when not running */
    int port;                 /* 0 until started */
    char dir[64];             /* its directory (mkdtemp); "" when none */
    char user[64];            /* what the harness's own connections AUTH with */
    char password[128];       /* (rs_set_auth()); "" = none */
    int nargs;
    char *args[RS_MAX_ARGS];  /* the caller's extra arguments, kept for rs_restart() */
    char *conf;               /* config file text, kept for rs_restart(); NULL = none */
} rs_server;

/* A reply, copied out of the client library. */
enum { RS_STRING = 1, RS_ARRAY, RS_INTEGER, RS_NIL, RS_STATUS, RS_ERROR };
typedef struct rs_reply {
    int type;                  /* RS_* */
    long long integer;         /* RS_INTEGER */
    char *str;                 /* RS_STRING, RS_STATUS, RS_ERROR: NUL-terminated too */
    size_t len;
    size_t elements;           /* RS_ARRAY */
    struct rs_reply **element;
} rs_reply;

/* Why real servers cannot be run here ("redis-server is not installed
 * (...)", "built without hiredis"), or NULL when they can. */
const char *rs_unavailable(void);

/* Detail of the harness's most recent failure (its log's last lines for a
 * server that did not start). */
const char *rs_error(void);

/* A loopback TCP port nothing listens on, whose port + 10000 (a Cluster's
 * bus) is free too; -1 if none was found. */
int rs_free_port(void);

/* Credentials the harness's own connections use (after a --requirepass or
 * ACL change); NULL/NULL for none. */
void rs_set_auth(rs_server *s, const char *user, const char *password);

/* Start redis-server on a free port with `nargs` extra arguments (e.g.
 * "--requirepass", "pw") and, when `conf` is not NULL, a config file of
 * that text (e.g. "user alice on >pw ~kvp:* +get\n"). Returns 0 once it
 * answers PING (at most 5 s), -1 otherwise (rs_error() says why; nothing
 * is left running). */
int rs_start(rs_server *s, const char *conf, const char *const *args, int nargs);

/* SIGTERM, then SIGKILL if it has not exited within 5 s; reaps it and
 * removes its directory. Returns 0, -1 if it was not running cleanly. */
int rs_stop(rs_server *s);

/* SIGKILL (a crash): the port and directory are kept for rs_restart(). */
int rs_kill(rs_server *s);

/* SIGSTOP (1: a server that hangs: connections are accepted by the kernel,
 * nothing answers) or SIGCONT (0). */
int rs_freeze(rs_server *s, int frozen);

/* Start it again on the same port, with the same arguments (after
 * rs_kill(); its data is gone). 0 or -1. */
int rs_restart(rs_server *s);

/* "redis://127.0.0.1:<port>" (+ suffix, e.g. "/1"), into buf. */
void rs_uri(const rs_server *s, const char *suffix, char *buf, size_t size);

/* A command on a fresh connection (AUTH with rs_set_auth()'s, SELECT db
 * when db != 0), in hiredis's format (%s a C string, %b a pointer and a
 * size_t, %d an int). NULL when the connection failed (rs_error()). */
rs_reply *rs_command(const rs_server *s, const char *fmt, ...);
rs_reply *rs_command_db(const rs_server *s, int db, const char *fmt, ...);
rs_reply *rs_command_argv(const rs_server *s, int db, int argc, const char *const *argv,
                          const size_t *lens);
void rs_reply_free(rs_reply *r);

/* The integer reply of a command, or RS_NOINT (error, other type). */
long long rs_int(const rs_server *s, int db, const char *fmt, ...);

/* 1 if the command's reply is not an error (its text goes to rs_error()). */
int rs_ok(const rs_server *s, int db, const char *fmt, ...);

/* Every key of database `db` matching `pattern` (SCAN ... MATCH, bounded):
 * a malloc'd array of malloc'd strings in *keys; the count, or -1. */
int rs_keys(const rs_server *s, int db, const char *pattern, char ***keys);
void rs_keys_free(char **keys, int n);

/* Remove a directory and the files in it (one level). */
void rs_remove_dir(const char *dir);

/* ---- a Cluster ----------------------------------------------------------------------- */

typedef struct rs_cluster {
    int n;                           /* nodes in the Cluster (spares follow them) */
    rs_server node[RS_MAX_NODES];
    char id[RS_MAX_NODES][48];       /* CLUSTER MYID */
    signed char owner[RS_SLOTS];     /* node index owning each slot (as assigned here) */
} rs_cluster;

/* The hash slot of a key (CRC16/XMODEM mod 16384, {hash tags} honoured). */
int rs_key_slot(const char *key, size_t len);

/* `n` cluster-enabled nodes, the 16384 slots split in contiguous ranges
 * (0-5460, 5461-10922, 10923-16383 for 3), met and agreed: every node
 * reports cluster_state:ok, all slots and all nodes (at most 10 s). Plus
 * `spares` nodes started but not met, for rs_cluster_add_node(): a node
 * refuses to serve for 2 s after it starts, which then passes meanwhile.
 * n + spares <= RS_MAX_NODES. 0 or -1 (whatever started is stopped). */
int rs_cluster_start(rs_cluster *c, int n, int spares);

/* One more node (a spare, or a new one), met, known to all, agreeing
 * (no slots yet). Its index, or -1. */
int rs_cluster_add_node(rs_cluster *c);

/* Move `slot` and every key in it to node `to`, the way redis-cli does:
 * IMPORTING on the target, MIGRATING on the source, GETKEYSINSLOT +
 * MIGRATE ... KEYS, then SETSLOT ... NODE on every node. Returns the keys
 * moved, or -1. */
int rs_cluster_move_slot(rs_cluster *c, int slot, int to);

/* Start the same move and leave it half done: MIGRATING/IMPORTING stay set
 * and only the first `keys` keys of the slot are moved (so the source
 * answers ASK for them). Returns the keys moved, or -1. */
int rs_cluster_half_move_slot(rs_cluster *c, int slot, int to, int keys);

/* Complete a half move: the rest of the slot's keys, then SETSLOT ...
 * NODE on every node. The keys moved, or -1. */
int rs_cluster_finish_move(rs_cluster *c, int slot, int to);

/* Wait (bounded) until every node reports cluster_state:ok with every
 * slot and node known. 0 or -1. */
int rs_cluster_wait(rs_cluster *c);

/* Every key of the Cluster matching `pattern`, counted over its nodes;
 * per-node counts into per_node[c->n] when not NULL. -1 on failure. */
int rs_cluster_count(const rs_cluster *c, const char *pattern, int *per_node);

/* Stop every node. */
void rs_cluster_stop(rs_cluster *c);

#endif /* KVPAGE_TESTS_REDIS_SERVER_H */
