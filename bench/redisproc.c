/*
 * kvpage-bench tiers --remote: the Redis programs it runs as child
 * processes, every wait bounded: a redis-server of its own on a free
 * loopback port (no persistence, stopped at the end), redis-benchmark for
 * the comparison, redis-cli to remove what redis-benchmark wrote. Valkey's
 * programs (valkey-server, ...) are used when Redis's are missing.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static void set_err(char *err, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t size, const char *fmt, ...) {
    if (err == NULL || size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int bench_find_program(const char *const *names, int n, char *path, size_t size) {
    const char *env = getenv("PATH");
    if (env == NULL || *env == '\0') env = "/usr/local/bin:/usr/bin:/bin";
    for (int k = 0; k < n; k++) {
        const char *p = env;
        while (*p != '\0') {
            const char *end = strchr(p, ':');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (len > 0) {
                int w = snprintf(path, size, "%.*s/%s", (int)len, p, names[k]);
                struct stat st;
                if (w > 0 && (size_t)w < size && stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
                    access(path, X_OK) == 0)
                    return k;
            }
            p += len;
            if (*p == ':') p++;
        }
    }
    if (size > 0) path[0] = '\0';
    return -1;
}

/* fork + exec with stdout and stderr to `out_path` (NULL: /dev/null) and
 * stdin from /dev/null; the child is killed when the bench dies (Linux). */
static pid_t spawn(const char *exe, char *const argv[], const char *out_path) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) return pid; /* the parent, or -1 */
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127); /* the bench died before prctl */
#else
    (void)parent;
#endif
    int in = open("/dev/null", O_RDONLY);
    int out = out_path ? open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600) : open("/dev/null", O_WRONLY);
    if (in < 0 || out < 0) _exit(127);
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    if (in > 2) close(in);
    if (out > 2) close(out);
    execv(exe, argv);
    _exit(127);
}

/* Waits up to timeout_s for the child; its exit status (128 + signal when
 * killed), or -1 when it is still running. */
static int wait_for(pid_t pid, double timeout_s) {
    double end = bench_now() + timeout_s;
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0 && errno != EINTR) return 255; /* not our child any more */
        if (bench_now() >= end) return -1;
        sleep_ms(5);
    }
}

/* SIGTERM, up to 5 s, then SIGKILL. */
static void stop_child(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    if (wait_for(pid, 5.0) >= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A file's last `size - 1` bytes at most, one line per line (for messages). */
static void read_tail(const char *path, char *buf, size_t size) {
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (f == NULL) return;
    if (fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        long from = len > (long)size - 1 ? len - ((long)size - 1) : 0;
        fseek(f, from, SEEK_SET);
    }
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* PING on 127.0.0.1:port: 1 on +PONG, 0 otherwise (not listening yet, loading). */
static int ping(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct timeval tv = {0, 250000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    int ok = 0;
    char reply[64];
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, "PING\r\n", 6) == 6) {
        ssize_t n = read(fd, reply, sizeof reply - 1);
        ok = n >= 5 && memcmp(reply, "+PONG", 5) == 0;
    }
    close(fd);
    return ok;
}

int bench_redis_start(const char *exe, bench_redis_server *s, char *err, size_t err_size) {
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/kvpage-bench-redis-XXXXXX");
    if (mkdtemp(s->dir) == NULL) {
        set_err(err, err_size, "mkdtemp: %s", strerror(errno));
        s->dir[0] = '\0';
        return -1;
    }
    snprintf(s->log, sizeof s->log, "%s/redis.log", s->dir);
    char exe_copy[1024];
    snprintf(exe_copy, sizeof exe_copy, "%s", exe);
    for (int attempt = 0; attempt < 3; attempt++) {
        int port = free_port();
        if (port <= 0) {
            set_err(err, err_size, "no free loopback port: %s", strerror(errno));
            break;
        }
        char port_s[16];
        snprintf(port_s, sizeof port_s, "%d", port);
        char *argv[] = {exe_copy, "--port", port_s, "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", s->dir, "--daemonize", "no",
                        "--logfile", "", NULL};
        pid_t pid = spawn(exe, argv, s->log);
        if (pid < 0) {
            set_err(err, err_size, "fork: %s", strerror(errno));
            break;
        }
        /* ready when it answers PING; 10 s at most */
        double end = bench_now() + 10.0;
        int status = -1, ready = 0;
        while (!ready && (status = wait_for(pid, 0)) < 0 && bench_now() < end) {
            ready = ping(port);
            if (!ready) sleep_ms(10);
        }
        if (ready) {
            s->pid = (int)pid;
            s->port = port;
            snprintf(s->uri, sizeof s->uri, "redis://127.0.0.1:%d", port);
            return 0;
        }
        char tail[512];
        read_tail(s->log, tail, sizeof tail);
        if (status < 0) { /* still running but silent */
            stop_child(pid);
            set_err(err, err_size, "%s did not answer PING on port %d within 10 s; its log: %s", exe,
                    port, tail);
            break;
        }
        set_err(err, err_size, "%s exited (status %d) on port %d; its log: %s", exe, status, port,
                tail);
        if (strstr(tail, "in use") == NULL) break; /* another port only helps for that */
    }
    bench_redis_stop(s);
    return -1;
}

void bench_redis_stop(bench_redis_server *s) {
    if (s->pid > 0) stop_child((pid_t)s->pid);
    s->pid = 0;
    if (s->dir[0] != '\0') {
        unlink(s->log);
        char rdb[160];
        snprintf(rdb, sizeof rdb, "%s/dump.rdb", s->dir); /* none with --save "" */
        unlink(rdb);
        rmdir(s->dir);
        s->dir[0] = '\0';
    }
}

/* The rps of a "NAME","rps",... line of redis-benchmark --csv, or -1. */
static double csv_rps(const char *text, const char *name) {
    char want[32];
    snprintf(want, sizeof want, "\"%s\",\"", name);
    for (const char *p = text; (p = strstr(p, want)) != NULL; p++)
        if (p == text || p[-1] == '\n') return strtod(p + strlen(want), NULL);
    return -1;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decode [s, e) into out; -1 when malformed or too long. */
static int decode(const char *s, const char *e, char *out, size_t size) {
    size_t o = 0;
    for (; s < e; s++) {
        int c = (unsigned char)*s;
        if (c == '%') {
            if (e - s < 3 || hexval(s[1]) < 0 || hexval(s[2]) < 0) return -1;
            c = hexval(s[1]) * 16 + hexval(s[2]);
            s += 2;
        }
        if (o + 1 >= size || c == 0) return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

int bench_redis_parse_uri(const char *uris, bench_redis_addr *a) {
    memset(a, 0, sizeof *a);
    a->port = 6379;
    while (*uris == ',' || *uris == ' ') uris++;
    const char *end = uris + strcspn(uris, ", ");
    static const char scheme[] = "redis://";
    if ((size_t)(end - uris) < sizeof scheme - 1 || strncmp(uris, scheme, sizeof scheme - 1) != 0)
        return -1;
    const char *p = uris + sizeof scheme - 1;
    const char *slash = p;
    while (slash < end && *slash != '/') slash++;
    const char *at = NULL;
    for (const char *q = p; q < slash; q++)
        if (*q == '@') at = q;
    if (at != NULL) {
        const char *colon = p;
        while (colon < at && *colon != ':') colon++;
        if (decode(p, colon, a->user, sizeof a->user) != 0) return -1;
        if (colon < at && decode(colon + 1, at, a->pass, sizeof a->pass) != 0) return -1;
        p = at + 1;
    }
    const char *host_end;
    if (*p == '[') {
        host_end = memchr(p, ']', (size_t)(slash - p));
        if (host_end == NULL) return -1;
        p++;
    } else {
        host_end = p;
        while (host_end < slash && *host_end != ':') host_end++;
    }
    if (host_end == p || (size_t)(host_end - p) >= sizeof a->host) return -1;
    memcpy(a->host, p, (size_t)(host_end - p));
    const char *q = host_end < slash && *host_end == ']' ? host_end + 1 : host_end;
    if (q < slash && *q == ':') {
        char *stop;
        long port = strtol(q + 1, &stop, 10);
        if (stop != slash || port < 1 || port > 65535) return -1;
        a->port = (int)port;
    } else if (q != slash) {
        return -1;
    }
    if (slash < end && end - slash > 1) {
        char *stop;
        long db = strtol(slash + 1, &stop, 10);
        if (stop != end || db < 0 || db > 1000000) return -1;
        a->db = (int)db;
    }
    return 0;
}

/* -h host -p port [--user u] [-a pass] into argv at *n (pointing into *a). */
static void addr_args(bench_redis_addr *a, char port[16], char **argv, int *n) {
    snprintf(port, 16, "%d", a->port);
    argv[(*n)++] = "-h";
    argv[(*n)++] = a->host;
    argv[(*n)++] = "-p";
    argv[(*n)++] = port;
    if (a->pass[0] != '\0') {
        if (a->user[0] != '\0') {
            argv[(*n)++] = "--user";
            argv[(*n)++] = a->user;
        }
        argv[(*n)++] = "-a";
        argv[(*n)++] = a->pass;
    }
}

int bench_redis_benchmark(const char *exe, const bench_redis_addr *addr, int cluster,
                          uint64_t value_bytes, int requests, int pipeline, double timeout_s,
                          double *set_rps, double *get_rps, char *err, size_t err_size) {
    *set_rps = *get_rps = -1;
    char out[] = "/tmp/kvpage-bench-rb-XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0) {
        set_err(err, err_size, "mkstemp: %s", strerror(errno));
        return -1;
    }
    close(fd);
    char d[24], n[16], p[16], port[16], db[16];
    snprintf(d, sizeof d, "%llu", (unsigned long long)value_bytes);
    snprintf(n, sizeof n, "%d", requests);
    snprintf(p, sizeof p, "%d", pipeline);
    snprintf(db, sizeof db, "%d", addr->db);
    char *argv[32];
    int a = 0;
    char exe_copy[1024];
    snprintf(exe_copy, sizeof exe_copy, "%s", exe);
    argv[a++] = exe_copy;
    bench_redis_addr at = *addr;
    addr_args(&at, port, argv, &a);
    if (addr->db != 0) {
        argv[a++] = "--dbnum";
        argv[a++] = db;
    }
    if (cluster) argv[a++] = "--cluster";
    char *rest[] = {"-t", "set,get", "-d", d, "-n", n, "-P", p, "-c", "1", "--csv", NULL};
    for (int i = 0; rest[i] != NULL; i++) argv[a++] = rest[i];
    argv[a] = NULL;
    pid_t pid = spawn(exe, argv, out);
    int rc = -1;
    if (pid < 0) {
        set_err(err, err_size, "fork: %s", strerror(errno));
    } else {
        int status = wait_for(pid, timeout_s);
        char text[4096];
        if (status < 0) {
            stop_child(pid);
            set_err(err, err_size, "%s did not finish within %.0f s", exe, timeout_s);
        } else {
            read_tail(out, text, sizeof text);
            *set_rps = csv_rps(text, "SET");
            *get_rps = csv_rps(text, "GET");
            if (status == 0 && *set_rps > 0 && *get_rps > 0) {
                rc = 0;
            } else {
                /* its last line says why (e.g. NOAUTH, connection refused) */
                const char *last = strrchr(text, '\n');
                set_err(err, err_size, "%s exited with status %d: %s", exe, status,
                        last ? last + 1 : text);
            }
        }
    }
    unlink(out);
    return rc;
}

int bench_redis_del(const char *cli, const bench_redis_addr *addr, int cluster, const char *key) {
    char exe_copy[1024], key_copy[256], port[16], db[16];
    snprintf(exe_copy, sizeof exe_copy, "%s", cli);
    snprintf(key_copy, sizeof key_copy, "%s", key);
    snprintf(db, sizeof db, "%d", addr->db);
    char *argv[32];
    int a = 0;
    argv[a++] = exe_copy;
    bench_redis_addr at = *addr;
    addr_args(&at, port, argv, &a);
    argv[a++] = "--no-auth-warning";
    argv[a++] = "-n";
    argv[a++] = db;
    if (cluster) argv[a++] = "-c";
    argv[a++] = "DEL";
    argv[a++] = key_copy;
    argv[a] = NULL;
    pid_t pid = spawn(exe_copy, argv, NULL);
    if (pid < 0) return -1;
    int status = wait_for(pid, 10.0);
    if (status < 0) stop_child(pid);
    return status;
}
