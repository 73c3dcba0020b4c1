/*
 * The file tier: blobs as files of one directory, shared by any number of
 * processes.
 *
 * A blob is the file `<64 hex digits of its key>.kvpb`. It is written under
 * a temporary name of its own (`.tmp.<pid>.<serial>.<hex>`: unique to the
 * process and the call), fsync'd, and renamed into place. A rename replaces
 * a name atomically, so a reader, in this process or another, opens either
 * the old whole file or the new whole file; a writer killed mid-write
 * leaves only its temporary, which the next scan of the directory removes
 * once its process is gone.
 *
 * The byte cap is kept by whoever writes. Each tier indexes the directory
 * (key -> size, last use) from a scan at creation, and its own puts, gets
 * and removals keep the index current; other processes' do not. So when
 * the index says a put would go over the cap, the directory is scanned
 * again (readdir + stat) before anything is evicted, least recently used
 * first. Last use is the files' access time, which a get sets explicitly
 * (mounts with noatime or relatime would not), so the order holds across
 * processes. Eviction goes a sixteenth of the cap below it: a writer at the
 * cap then scans once per sixteenth of the cap written, not once per put.
 *
 * With several writers at once the cap is soft: each keeps its own view of
 * the directory under the cap, but sees the others' blobs only when it
 * scans. Once they are quiet, the next put of any of them brings the
 * directory back under the cap.
 */
#define _POSIX_C_SOURCE 200809L
#include "blobtier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SUFFIX ".kvpb"
#define NAME_LEN (64 + sizeof SUFFIX - 1)
#define TMP_PREFIX ".tmp."
#define TMP_NAME_BYTES 128
/* A temporary this old belongs to a writer that is gone or stuck. */
#define TMP_STALE_NS (60 * 1000000000LL)
/* Largest single read or write (Linux moves at most ~2 GiB per call). */
#define IO_CHUNK ((size_t)1 << 30)
#define INDEX_MIN 64

typedef struct {
    kvp_hash_t key;
    uint64_t bytes; /* 0: an empty slot (a blob has at least one byte) */
    int64_t used;   /* last use, ns since the epoch: the clock of the files' atime */
} entry_t;

typedef struct {
    kvp_allocator_t alloc;
    char *path;
    int dirfd;
    int fsync;
    uint64_t max_bytes;
    /* the index: open addressing, linear probing, at most half full */
    entry_t *slots; /* [mask + 1] */
    size_t mask;
    size_t count;
    uint64_t total; /* bytes of the blobs indexed */
    char err[KVP_ERR_SIZE];
} file_tier_t;

/* Serial numbers of temporary names: with the pid, unique to one call of
 * one process, however many tiers it has on the same directory. */
static atomic_uint_fast64_t tmp_serial;

static int fail(file_tier_t *t, int status, const char *fmt, ...) KVP__PRINTF(3, 4);
static int fail(file_tier_t *t, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(t->err, sizeof t->err, status, fmt, ap);
    va_end(ap);
    return status;
}

/* A system call on `name` (NULL: the directory itself) failed with `e`. */
static int sys_fail(file_tier_t *t, const char *what, const char *name, int e) {
    char msg[128];
    if (strerror_r(e, msg, sizeof msg) != 0) snprintf(msg, sizeof msg, "errno %d", e);
    return fail(t, KVP_EIO, "%s %s%s%s: %s", what, t->path, name ? "/" : "", name ? name : "",
                msg);
}

static int64_t ns_of(const struct timespec *ts) {
    return (int64_t)ts->tv_sec * 1000000000 + (int64_t)ts->tv_nsec;
}

static int64_t wall_ns(void) {
    struct timespec ts = {0, 0};
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    return ns_of(&ts);
}

/* ---- names ----------------------------------------------------------------- */

static void blob_name(const kvp_hash_t *key, char out[NAME_LEN + 1]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = digits[key->bytes[i] >> 4];
        out[2 * i + 1] = digits[key->bytes[i] & 15];
    }
    memcpy(out + 64, SUFFIX, sizeof SUFFIX);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1; /* upper case is not a name this tier writes */
}

static bool parse_blob_name(const char *name, kvp_hash_t *key) {
    if (strlen(name) != NAME_LEN || strcmp(name + 64, SUFFIX) != 0) return false;
    for (int i = 0; i < 32; i++) {
        int hi = hex_digit(name[2 * i]), lo = hex_digit(name[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        key->bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

/* ---- the index --------------------------------------------------------------- */

/* Keys are chain hashes, but callers may hand anything: mix all of it. */
static size_t home_of(const kvp_hash_t *key, size_t mask) {
    uint64_t h = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t w;
        memcpy(&w, key->bytes + 8 * i, sizeof w);
        h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    }
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return (size_t)h & mask;
}

static size_t find_in(const entry_t *slots, size_t mask, const kvp_hash_t *key) {
    for (size_t i = home_of(key, mask);; i = (i + 1) & mask) {
        if (slots[i].bytes == 0) return SIZE_MAX;
        if (memcmp(&slots[i].key, key, sizeof *key) == 0) return i;
    }
}

static const entry_t *index_find(const file_tier_t *t, const kvp_hash_t *key) {
    size_t i = find_in(t->slots, t->mask, key);
    return i == SIZE_MAX ? NULL : &t->slots[i];
}

static void place(entry_t *slots, size_t mask, const entry_t *e) {
    size_t i = home_of(&e->key, mask);
    while (slots[i].bytes != 0) i = (i + 1) & mask;
    slots[i] = *e;
}

/* Room for `extra` more keys. False when the memory cannot be had (the
 * index is unchanged). */
static bool index_reserve(file_tier_t *t, size_t extra) {
    size_t cap = t->mask + 1;
    if (extra > SIZE_MAX / 2 - t->count) return false;
    size_t need = 2 * (t->count + extra);
    if (need <= cap) return true;
    while (cap < need) {
        if (cap > SIZE_MAX / 2 / sizeof(entry_t)) return false;
        cap *= 2;
    }
    entry_t *slots = kvp__calloc(&t->alloc, cap, sizeof *slots, 0);
    if (slots == NULL) return false;
    for (size_t i = 0; i <= t->mask; i++)
        if (t->slots[i].bytes != 0) place(slots, cap - 1, &t->slots[i]);
    kvp__free(&t->alloc, t->slots);
    t->slots = slots;
    t->mask = cap - 1;
    return true;
}

/* Record `key` (room reserved by the caller if it is new). */
static void index_set(file_tier_t *t, const kvp_hash_t *key, uint64_t bytes, int64_t used) {
    size_t i = find_in(t->slots, t->mask, key);
    if (i != SIZE_MAX) {
        t->total -= t->slots[i].bytes;
        t->slots[i].bytes = bytes;
        t->slots[i].used = used;
    } else {
        entry_t e;
        memset(&e, 0, sizeof e);
        e.key = *key;
        e.bytes = bytes;
        e.used = used;
        place(t->slots, t->mask, &e);
        t->count++;
    }
    t->total += bytes;
}

/* Forget `key`. Later keys of its run move back into the hole (backward
 * shift), so lookups never need tombstones. */
static void index_remove(file_tier_t *t, const kvp_hash_t *key) {
    size_t hole = find_in(t->slots, t->mask, key);
    if (hole == SIZE_MAX) return;
    t->total -= t->slots[hole].bytes;
    t->count--;
    for (size_t j = (hole + 1) & t->mask; t->slots[j].bytes != 0; j = (j + 1) & t->mask) {
        size_t home = home_of(&t->slots[j].key, t->mask);
        /* it may move back if the hole lies between its home and j */
        if (((j - home) & t->mask) >= ((j - hole) & t->mask)) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    memset(&t->slots[hole], 0, sizeof t->slots[hole]);
}

/* ---- scanning the directory ----------------------------------------------------- */

/* The pid in a temporary's name, or 0 if it has none. */
static pid_t temporary_pid(const char *name) {
    const char *digits = name + strlen(TMP_PREFIX);
    char *end = NULL;
    errno = 0;
    long pid = strtol(digits, &end, 10);
    if (errno != 0 || end == digits || *end != '.' || pid <= 0 || pid > INT_MAX) return 0;
    return (pid_t)pid;
}

/* A temporary of a writer that died (its process is gone) or is stuck
 * (older than TMP_STALE_NS) is removed; a live writer's is left alone: it
 * will rename or remove it. */
static void sweep_temporary(file_tier_t *t, const char *name, const struct stat *st,
                            int64_t now) {
    pid_t pid = temporary_pid(name);
    bool dead = pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
    bool stale = now - ns_of(&st->st_mtim) > TMP_STALE_NS;
    if (dead || stale) (void)unlinkat(t->dirfd, name, 0);
}

/* Index one directory entry. `old` is the index before the scan: a blob
 * this process used later than its access time says (the file system's
 * clock is coarser than ours) keeps its later use. */
static int scan_entry(file_tier_t *t, const char *name, const entry_t *old, size_t old_mask,
                      int64_t now) {
    kvp_hash_t key;
    bool blob = parse_blob_name(name, &key);
    bool temporary = strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0;
    if (!blob && !temporary) return KVP_OK;
    struct stat st;
    if (fstatat(t->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? KVP_OK : sys_fail(t, "stat", name, errno);
    if (!S_ISREG(st.st_mode)) return KVP_OK;
    if (temporary) {
        sweep_temporary(t, name, &st, now);
        return KVP_OK;
    }
    if (st.st_size <= 0) return KVP_OK;
    if (!index_reserve(t, 1))
        return fail(t, KVP_ENOMEM, "cannot grow the index of %s past %zu blobs", t->path,
                    t->count);
    int64_t used = ns_of(&st.st_atim);
    size_t i = old != NULL ? find_in(old, old_mask, &key) : SIZE_MAX;
    if (i != SIZE_MAX && old[i].used > used) used = old[i].used;
    index_set(t, &key, (uint64_t)st.st_size, used);
    return KVP_OK;
}

static int scan_dir(file_tier_t *t, const entry_t *old, size_t old_mask) {
    int fd = openat(t->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return sys_fail(t, "open", NULL, errno);
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        int e = errno;
        close(fd);
        return sys_fail(t, "open", NULL, e);
    }
    int64_t now = wall_ns();
    int rc = KVP_OK;
    while (rc == KVP_OK) {
        errno = 0;
        const struct dirent *de = readdir(d);
        if (de == NULL) {
            if (errno != 0) rc = sys_fail(t, "read", NULL, errno);
            break;
        }
        rc = scan_entry(t, de->d_name, old, old_mask, now);
    }
    closedir(d);
    return rc;
}

/* Rebuild the index from the directory (and sweep dead writers'
 * temporaries). On failure the index is what it was. */
static int rescan(file_tier_t *t) {
    entry_t *old = t->slots;
    size_t old_mask = t->mask, old_count = t->count;
    uint64_t old_total = t->total;
    t->slots = kvp__calloc(&t->alloc, old_mask + 1, sizeof *t->slots, 0);
    if (t->slots == NULL) {
        t->slots = old;
        return fail(t, KVP_ENOMEM, "cannot allocate the index of %s (%zu slots)", t->path,
                    old_mask + 1);
    }
    t->count = 0;
    t->total = 0;
    int rc = scan_dir(t, old, old_mask);
    entry_t *drop = rc == KVP_OK ? old : t->slots;
    if (rc != KVP_OK) {
        t->slots = old;
        t->mask = old_mask;
        t->count = old_count;
        t->total = old_total;
    }
    kvp__free(&t->alloc, drop);
    return rc;
}

/* ---- eviction ------------------------------------------------------------------- */

static int older_first(const void *a, const void *b) {
    const entry_t *x = a, *y = b;
    if (x->used != y->used) return x->used < y->used ? -1 : 1;
    return memcmp(&x->key, &y->key, sizeof x->key);
}

/* Remove least recently used blobs other than `keep` until the others hold
 * at most `budget` bytes. A blob that cannot be removed (another user's, in
 * a shared directory) is passed over; it fails the call only if the budget
 * is then out of reach. */
static int evict(file_tier_t *t, const kvp_hash_t *keep, uint64_t budget) {
    const entry_t *k = index_find(t, keep);
    uint64_t kept = k != NULL ? k->bytes : 0;
    if (t->total - kept <= budget) return KVP_OK;
    entry_t *order = kvp__calloc(&t->alloc, t->count, sizeof *order, 0);
    if (order == NULL) return fail(t, KVP_ENOMEM, "cannot allocate the eviction order");
    size_t n = 0;
    for (size_t i = 0; i <= t->mask; i++)
        if (t->slots[i].bytes != 0 && memcmp(&t->slots[i].key, keep, sizeof *keep) != 0)
            order[n++] = t->slots[i];
    qsort(order, n, sizeof *order, older_first);
    int first_error = 0;
    char first_name[NAME_LEN + 1] = "";
    for (size_t i = 0; i < n && t->total - kept > budget; i++) {
        char name[NAME_LEN + 1];
        blob_name(&order[i].key, name);
        if (unlinkat(t->dirfd, name, 0) != 0 && errno != ENOENT) {
            if (first_error == 0) {
                first_error = errno;
                memcpy(first_name, name, sizeof name);
            }
            continue;
        }
        index_remove(t, &order[i].key);
    }
    kvp__free(&t->alloc, order);
    if (t->total - kept > budget) return sys_fail(t, "evict", first_name, first_error);
    return KVP_OK;
}

/* Bytes the index would hold with `bytes` stored under `key`. */
static uint64_t total_with(const file_tier_t *t, const kvp_hash_t *key, uint64_t bytes) {
    const entry_t *e = index_find(t, key);
    return t->total - (e != NULL ? e->bytes : 0) + bytes;
}

/* Make room under the cap for `bytes` under `key` (bytes <= the cap). */
static int make_room(file_tier_t *t, const kvp_hash_t *key, uint64_t bytes) {
    if (t->max_bytes == 0 || total_with(t, key, bytes) <= t->max_bytes) return KVP_OK;
    int rc = rescan(t); /* others may have evicted, or written */
    if (rc != KVP_OK || total_with(t, key, bytes) <= t->max_bytes) return rc;
    uint64_t slack = t->max_bytes / 16;
    uint64_t goal = bytes + slack <= t->max_bytes ? t->max_bytes - slack : t->max_bytes;
    return evict(t, key, goal - bytes);
}

/* ---- file I/O --------------------------------------------------------------------- */

static bool write_all(int fd, const uint8_t *p, uint64_t bytes) {
    while (bytes > 0) {
        size_t chunk = bytes < IO_CHUNK ? (size_t)bytes : IO_CHUNK;
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return false;
        }
        p += w;
        bytes -= (uint64_t)w;
    }
    return true;
}

/* Read up to `bytes`; `*got` says how many came before end of file. */
static bool read_all(int fd, uint8_t *p, uint64_t bytes, uint64_t *got) {
    *got = 0;
    while (*got < bytes) {
        uint64_t left = bytes - *got;
        size_t chunk = left < IO_CHUNK ? (size_t)left : IO_CHUNK;
        ssize_t r = read(fd, p + *got, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return false;
        if (r == 0) break;
        *got += (uint64_t)r;
    }
    return true;
}

/* Write one blob under a temporary name and rename it into place. Whatever
 * fails, the temporary goes. */
static int write_blob(file_tier_t *t, const kvp_hash_t *key, const void *blob,
                      uint64_t bytes) {
    char name[NAME_LEN + 1], tmp[TMP_NAME_BYTES];
    blob_name(key, name);
    unsigned long long serial = (unsigned long long)atomic_fetch_add(&tmp_serial, 1);
    snprintf(tmp, sizeof tmp, TMP_PREFIX "%ld.%llu.%.64s", (long)getpid(), serial, name);
    /* the directory's mode says who may read; files follow the umask */
    int fd = openat(t->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return sys_fail(t, "create", tmp, errno);
    const char *what = NULL;
    int e = 0;
    if (!write_all(fd, blob, bytes)) what = "write";
    else if (t->fsync && fsync(fd) != 0) what = "fsync";
    if (what != NULL) e = errno;
    if (close(fd) != 0 && what == NULL) {
        what = "close";
        e = errno;
    }
    if (what == NULL && renameat(t->dirfd, tmp, t->dirfd, name) != 0) {
        what = "rename";
        e = errno;
    }
    if (what == NULL) return KVP_OK;
    (void)unlinkat(t->dirfd, tmp, 0);
    return sys_fail(t, what, tmp, e);
}

/* Make the renames durable. Some file systems cannot sync a directory
 * (EINVAL): there is nothing more to do there. */
static int sync_dir(file_tier_t *t) {
    if (fsync(t->dirfd) == 0 || errno == EINVAL) return KVP_OK;
    return sys_fail(t, "fsync", NULL, errno);
}

/* Mark a blob used now, in the file (for other processes and later scans)
 * and in the index. Both are best effort: a file of another user may not
 * take a new access time, and a full index only loses precision. */
static void touch(file_tier_t *t, int fd, const kvp_hash_t *key, uint64_t bytes) {
    const struct timespec times[2] = {{.tv_sec = 0, .tv_nsec = UTIME_NOW},
                                      {.tv_sec = 0, .tv_nsec = UTIME_OMIT}};
    (void)futimens(fd, times);
    if (index_find(t, key) != NULL || index_reserve(t, 1)) index_set(t, key, bytes, wall_ns());
}

/* One blob into `buf`; `*size` stays 0 for a miss: no file, not a regular
 * file (nothing this tier wrote), empty, larger than `cap`, or shorter than
 * its size said. */
static int read_blob(file_tier_t *t, const kvp_hash_t *key, void *buf, uint64_t cap,
                     uint64_t *size) {
    char name[NAME_LEN + 1];
    blob_name(key, name);
    *size = 0;
    /* O_NONBLOCK: a FIFO under a blob's name must not hang the engine */
    int fd = openat(t->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) index_remove(t, key); /* evicted by another process */
        if (e == ENOENT || e == ELOOP) return KVP_OK;
        return sys_fail(t, "open", name, e);
    }
    struct stat st;
    int rc = KVP_OK;
    uint64_t got = 0;
    if (fstat(fd, &st) != 0) {
        rc = sys_fail(t, "stat", name, errno);
    } else if (S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size <= cap) {
        if (!read_all(fd, buf, (uint64_t)st.st_size, &got)) rc = sys_fail(t, "read", name, errno);
        else if (got == (uint64_t)st.st_size) *size = got;
    }
    if (*size > 0) touch(t, fd, key, *size);
    close(fd);
    return rc;
}

/* ---- the tier's functions --------------------------------------------------------- */

static int ft_get(void *self, int32_t n, const kvp_hash_t *keys, void *const *bufs,
                  const uint64_t *caps, uint64_t *sizes) {
    file_tier_t *t = self;
    for (int32_t i = 0; i < n; i++) {
        int rc = read_blob(t, &keys[i], bufs[i], caps[i], &sizes[i]);
        if (rc != KVP_OK) return rc;
    }
    return KVP_OK;
}

static int ft_put(void *self, int32_t n, const kvp_hash_t *keys, const void *const *blobs,
                  const uint64_t *sizes) {
    file_tier_t *t = self;
    for (int32_t i = 0; i < n; i++)
        if (t->max_bytes != 0 && sizes[i] > t->max_bytes)
            return fail(t, KVP_EINVAL,
                        "blob %d is %llu bytes, more than the tier's cap of %llu bytes",
                        (int)i, (unsigned long long)sizes[i],
                        (unsigned long long)t->max_bytes);
    int rc = KVP_OK;
    int32_t written = 0;
    for (int32_t i = 0; i < n && rc == KVP_OK; i++) {
        rc = make_room(t, &keys[i], sizes[i]);
        if (rc == KVP_OK && !index_reserve(t, 1))
            rc = fail(t, KVP_ENOMEM, "cannot grow the index of %s past %zu blobs", t->path,
                      t->count);
        if (rc == KVP_OK) rc = write_blob(t, &keys[i], blobs[i], sizes[i]);
        if (rc != KVP_OK) break;
        index_set(t, &keys[i], sizes[i], wall_ns());
        written++;
    }
    if (written > 0 && t->fsync) {
        int synced = sync_dir(t);
        if (rc == KVP_OK) rc = synced;
    }
    return rc;
}

static int ft_exists(void *self, int32_t n, const kvp_hash_t *keys, uint8_t *present) {
    file_tier_t *t = self;
    for (int32_t i = 0; i < n; i++) {
        char name[NAME_LEN + 1];
        blob_name(&keys[i], name);
        struct stat st;
        if (fstatat(t->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
            present[i] = S_ISREG(st.st_mode) && st.st_size > 0;
        else if (errno == ENOENT)
            present[i] = 0;
        else
            return sys_fail(t, "stat", name, errno);
    }
    return KVP_OK;
}

static int ft_remove(void *self, int32_t n, const kvp_hash_t *keys) {
    file_tier_t *t = self;
    for (int32_t i = 0; i < n; i++) {
        char name[NAME_LEN + 1];
        blob_name(&keys[i], name);
        if (unlinkat(t->dirfd, name, 0) != 0 && errno != ENOENT)
            return sys_fail(t, "remove", name, errno);
        index_remove(t, &keys[i]);
    }
    return KVP_OK;
}

static int ft_usage(void *self, uint64_t *entries, uint64_t *bytes) {
    const file_tier_t *t = self;
    *entries = t->count;
    *bytes = t->total;
    return KVP_OK;
}

static const char *ft_last_error(void *self) {
    const file_tier_t *t = self;
    return t->err;
}

static void ft_destroy(void *self) {
    file_tier_t *t = self;
    if (t == NULL) return;
    kvp_allocator_t a = t->alloc;
    if (t->dirfd >= 0) close(t->dirfd);
    kvp__free(&a, t->slots);
    kvp__free(&a, t->path);
    kvp__free(&a, t);
}

/* ---- creation ----------------------------------------------------------------------- */

void kvp_file_tier_params_init(kvp_file_tier_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->fsync = 1;
}

static int check_params(const kvp_file_tier_params_t *p, char *err, size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->fsync != 0 && p->fsync != 1)
        return kvp__errf(err, err_size, KVP_EINVAL, "params->fsync is %d, expected 0 or 1",
                         (int)p->fsync);
    if (p->path == NULL || p->path[0] == '\0')
        return kvp__errf(err, err_size, KVP_EINVAL, "params->path is %s (set the directory)",
                         p->path == NULL ? "NULL" : "empty");
    return kvp__allocator_check(&p->allocator, err, err_size);
}

/* Create the directory if it is missing (private to its user: blobs hold
 * what prompts made), open it, and index what it holds. */
static int open_dir(file_tier_t *t) {
    if (mkdir(t->path, 0700) != 0 && errno != EEXIST)
        return sys_fail(t, "create directory", NULL, errno);
    t->dirfd = open(t->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (t->dirfd < 0) return sys_fail(t, "open directory", NULL, errno);
    return scan_dir(t, NULL, 0);
}

static file_tier_t *file_tier_alloc(const kvp_file_tier_params_t *p) {
    kvp_allocator_t hooks = p->allocator;
    file_tier_t *t = kvp__calloc(&hooks, 1, sizeof *t, 0);
    if (t == NULL) return NULL;
    t->alloc = hooks;
    t->dirfd = -1;
    size_t len = strlen(p->path);
    t->path = kvp__malloc(&hooks, len + 1, 0);
    t->slots = kvp__calloc(&hooks, INDEX_MIN, sizeof *t->slots, 0);
    if (t->path == NULL || t->slots == NULL) {
        ft_destroy(t);
        return NULL;
    }
    memcpy(t->path, p->path, len + 1);
    t->mask = INDEX_MIN - 1;
    t->fsync = p->fsync;
    t->max_bytes = p->max_bytes;
    return t;
}

int kvp_file_tier_create(const kvp_file_tier_params_t *params, kvp_blob_tier_t **out,
                         char *err, size_t err_size) {
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    int rc = check_params(params, err, err_size);
    if (rc != KVP_OK) return rc;
    file_tier_t *t = file_tier_alloc(params);
    if (t == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the file tier");
    rc = open_dir(t);
    if (rc != KVP_OK) {
        kvp__errf(err, err_size, rc, "%s", t->err);
        ft_destroy(t);
        return rc;
    }
    kvp_blob_tier_ops_t ops;
    memset(&ops, 0, sizeof ops);
    ops.struct_size = sizeof ops;
    ops.get = ft_get;
    ops.put = ft_put;
    ops.exists = ft_exists;
    ops.remove = ft_remove;
    ops.usage = ft_usage;
    ops.last_error = ft_last_error;
    ops.destroy = ft_destroy;
    rc = kvp__blob_tier_create(&ops, t, "file", &t->alloc, out, err, err_size);
    if (rc != KVP_OK) ft_destroy(t);
    return rc;
}
