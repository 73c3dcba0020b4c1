/*
 * Layer: core — version, status codes, error detail, allocation hooks,
 * versioned structs, format names.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>

#include "internal.h"
#include "kvpage_cuda.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "testutil.h"

static void test_version(void **state) {
    (void)state;
    assert_int_equal(kvp_version_number(), KVP_VERSION_NUMBER);
    assert_string_equal(kvp_version_string(), KVP_VERSION_STRING);
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", KVP_VERSION_MAJOR, KVP_VERSION_MINOR,
             KVP_VERSION_PATCH);
    assert_string_equal(kvp_version_string(), expect);
    assert_int_equal(KVP_VERSION_NUMBER,
                     KVP_VERSION_MAJOR * 10000 + KVP_VERSION_MINOR * 100 + KVP_VERSION_PATCH);
}

/* Every code in the table: distinct, OK is 0 and the rest negative, with a
 * message and a name that round-trip through the X-macro. */
static void test_status_table(void **state) {
    (void)state;
#define ROW(name, value, msg) {value, #name, msg},
    static const struct { int value; const char *name, *msg; } rows[] = {
        KVP_STATUS_TABLE(ROW)};
#undef ROW
    size_t n = sizeof rows / sizeof rows[0];
    assert_true(n >= 11);
    assert_int_equal(rows[0].value, KVP_OK);
    assert_int_equal(KVP_OK, 0);
    for (size_t i = 0; i < n; i++) {
        if (i > 0) assert_true(rows[i].value < 0);
        for (size_t j = 0; j < i; j++) assert_int_not_equal(rows[i].value, rows[j].value);
        assert_string_equal(kvp_status_name(rows[i].value), rows[i].name);
        assert_string_equal(kvp_strerror(rows[i].value), rows[i].msg);
    }
    /* values are part of the ABI: never renumbered */
    assert_int_equal(KVP_EINVAL, -1);
    assert_int_equal(KVP_ENOMEM, -2);
    assert_int_equal(KVP_ENOSPC, -3);
    assert_int_equal(KVP_ENOENT, -4);
    assert_int_equal(KVP_ENOTSUP, -5);
    assert_int_equal(KVP_ENODEV, -6);
    assert_int_equal(KVP_ECUDA, -7);
    assert_int_equal(KVP_ESTATE, -8);
    assert_int_equal(KVP_EINTERNAL, -9);
    assert_int_equal(KVP_EHOSTFULL, -10);
    assert_int_equal(KVP_EBADBLOB, -11);
    assert_int_equal(KVP_EIO, -12);
    assert_int_equal(KVP_EACCES, -13);
    assert_int_equal(rows[n - 1].value, KVP_EACCES); /* appended last */
}

static void test_status_unknown(void **state) {
    (void)state;
    assert_string_equal(kvp_strerror(12345), "unknown status");
    assert_string_equal(kvp_strerror(-1000), "unknown status");
    assert_string_equal(kvp_status_name(1), "KVP_UNKNOWN");
    assert_string_equal(kvp_status_name(-1000), "KVP_UNKNOWN");
}

static void test_errf(void **state) {
    (void)state;
    char buf[16];
    memset(buf, 'x', sizeof buf);
    assert_int_equal(kvp__errf(buf, sizeof buf, KVP_EINVAL, "value %d is bad", 42), KVP_EINVAL);
    assert_string_equal(buf, "value 42 is bad");
    /* truncation keeps a terminated string */
    memset(buf, 'x', sizeof buf);
    kvp__errf(buf, 8, KVP_EINVAL, "a very long message %s", "indeed");
    assert_int_equal(strlen(buf), 7);
    assert_int_equal(buf[8], 'x'); /* nothing written past err_size */
    /* size 1: empty string; NULL or size 0: nothing written, status returned */
    kvp__errf(buf, 1, KVP_ENOSPC, "abc");
    assert_string_equal(buf, "");
    assert_int_equal(kvp__errf(NULL, 100, KVP_ENOSPC, "abc"), KVP_ENOSPC);
    buf[0] = 'q';
    assert_int_equal(kvp__errf(buf, 0, KVP_ENOSPC, "abc"), KVP_ENOSPC);
    assert_int_equal(buf[0], 'q');
}

static void test_malloc_libc_and_hooks(void **state) {
    (void)state;
    void *p = kvp__malloc(NULL, 100, 64);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    kvp__free(NULL, p);
    kvp__free(NULL, NULL);
    assert_null(kvp__malloc(NULL, 0, 16));  /* size 0 is a failure, not a surprise */
    assert_null(kvp__malloc(NULL, 16, 24)); /* not a power of two */

    test_alloc_state s = {0, -1, 0, 0};
    kvp_allocator_t a = test_allocator(&s);
    p = kvp__malloc(&a, 1000, 256);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 256, 0);
    assert_int_equal(s.live, 1);
    assert_int_equal(s.live_bytes, 1000);
    kvp__free(&a, p);
    assert_int_equal(s.live, 0);

    s.fail_at = s.calls; /* the next call fails */
    assert_null(kvp__malloc(&a, 10, 16));
    assert_int_equal(s.live, 0);

    int *z = kvp__calloc(&a, 10, sizeof(int), 16);
    assert_non_null(z);
    for (int i = 0; i < 10; i++) assert_int_equal(z[i], 0);
    kvp__free(&a, z);
    assert_null(kvp__calloc(&a, SIZE_MAX / 2, 4, 16)); /* n*size overflows */
    assert_int_equal(s.live, 0);
}

static void test_allocator_check(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    kvp_allocator_t a = {0};
    assert_int_equal(kvp__allocator_check(NULL, err, sizeof err), KVP_OK);
    assert_int_equal(kvp__allocator_check(&a, err, sizeof err), KVP_OK);
    a.alloc = kvt_alloc;
    assert_int_equal(kvp__allocator_check(&a, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "both"));
    a.alloc = NULL;
    a.free = kvt_free;
    assert_int_equal(kvp__allocator_check(&a, err, sizeof err), KVP_EINVAL);
}

/* A caller compiled against an older, shorter struct gets only its bytes. */
static void test_copy_out_respects_struct_size(void **state) {
    (void)state;
    typedef struct { uint32_t struct_size; uint32_t a, b, c; } full_t;
    full_t src = {sizeof(full_t), 1, 2, 3};
    full_t dst;
    memset(&dst, 0xEE, sizeof dst);
    dst.struct_size = (uint32_t)offsetof(full_t, c); /* knows a and b only */
    kvp__copy_out(&dst, &src, sizeof src);
    assert_int_equal(dst.struct_size, offsetof(full_t, c));
    assert_int_equal(dst.a, 1);
    assert_int_equal(dst.b, 2);
    assert_int_equal(dst.c, 0xEEEEEEEEu);
    /* a newer, longer caller struct gets ours and keeps its tail */
    unsigned char big[sizeof(full_t) + 8];
    memset(big, 0x77, sizeof big);
    uint32_t declared = sizeof big;
    memcpy(big, &declared, sizeof declared);
    kvp__copy_out(big, &src, sizeof src);
    assert_int_equal(big[sizeof(full_t)], 0x77);

    char err[KVP_ERR_SIZE];
    full_t small = {4, 0, 0, 0};
    assert_int_equal(kvp__check_struct(&small, sizeof small, "thing", err, sizeof err),
                     KVP_EINVAL);
    assert_non_null(strstr(err, "thing->struct_size"));
    assert_int_equal(kvp__check_struct(NULL, sizeof small, "thing", err, sizeof err),
                     KVP_EINVAL);
    assert_int_equal(kvp__check_struct(&src, sizeof src, "thing", err, sizeof err), KVP_OK);
}

static void test_format_names(void **state) {
    (void)state;
    static const char *const names[KVP_FORMAT_COUNT] = {"fp32", "fp16", "bf16",     "fp8_e4m3",
                                                         "int8", "int4_v1", "int4"};
    for (int32_t f = 0; f < KVP_FORMAT_COUNT; f++) {
        assert_string_equal(kvp_format_name(f), names[f]);
        int32_t back = -1;
        assert_int_equal(kvp_format_parse(names[f], &back, NULL, 0), KVP_OK);
        assert_int_equal(back, f);
    }
    assert_null(kvp_format_name(-1));
    assert_null(kvp_format_name(KVP_FORMAT_COUNT));
    int32_t f = -1;
    assert_int_equal(kvp_format_parse("INT8", &f, NULL, 0), KVP_OK);
    assert_int_equal(f, KVP_FORMAT_INT8);
    assert_int_equal(kvp_format_parse("fp8", &f, NULL, 0), KVP_OK);
    assert_int_equal(f, KVP_FORMAT_FP8_E4M3);

    char err[KVP_ERR_SIZE];
    f = 77;
    assert_int_equal(kvp_format_parse("int3", &f, err, sizeof err), KVP_EINVAL);
    assert_int_equal(f, 77); /* untouched on failure */
    assert_non_null(strstr(err, "int3"));
    assert_int_equal(kvp_format_parse("", &f, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_format_parse("fp16 ", &f, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_format_parse(NULL, &f, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_format_parse("fp16", NULL, err, sizeof err), KVP_EINVAL);
}

/* kvp_build_has(): KVP_FEATURE_CUDA is 1 exactly when the CUDA backend is
 * built in, which the CUDA entry points tell independently (a build without
 * it answers KVP_ENOTSUP, "built without CUDA"); unknown features are 0. */
static void test_build_has(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    int32_t count = -1;
    int rc = kvp_cuda_device_count(&count, err, sizeof err);
    int cuda_built = rc != KVP_ENOTSUP;
    if (!cuda_built) assert_non_null(strstr(err, "without CUDA"));
    assert_int_equal(kvp_build_has(KVP_FEATURE_CUDA), cuda_built);
#ifdef KVP_HAVE_CUDA
    assert_int_equal(kvp_build_has(KVP_FEATURE_CUDA), 1);
#endif
    assert_int_equal(KVP_FEATURE_CUDA, 1); /* part of the ABI */
    assert_int_equal(KVP_FEATURE_BLOB, 2);
#ifdef KVP_HAVE_BLOB
    assert_int_equal(kvp_build_has(KVP_FEATURE_BLOB), 1);
#else
    assert_int_equal(kvp_build_has(KVP_FEATURE_BLOB), 0);
#endif
    assert_int_equal(kvp_build_has(0), 0);
    assert_int_equal(kvp_build_has(3), 0);
    assert_int_equal(kvp_build_has(-1), 0);
    assert_int_equal(kvp_build_has(INT32_MAX), 0);
    assert_int_equal(kvp_build_has(INT32_MIN), 0);
}

static void test_strcasecmp(void **state) {
    (void)state;
    assert_int_equal(kvp__strcasecmp("H100-80G", "h100-80g"), 0);
    assert_true(kvp__strcasecmp("a", "b") < 0);
    assert_true(kvp__strcasecmp("ab", "a") > 0);
    assert_int_equal(kvp__strcasecmp("", ""), 0);
}

static void test_checked_arithmetic(void **state) {
    (void)state;
    uint64_t r;
    assert_true(kvp__mul_u64(1ull << 31, 1ull << 32, &r));
    assert_int_equal(r, 1ull << 63);
    assert_false(kvp__mul_u64(1ull << 32, 1ull << 32, &r));
    assert_true(kvp__add_u64(UINT64_MAX - 1, 1, &r));
    assert_false(kvp__add_u64(UINT64_MAX, 1, &r));
    assert_int_equal(kvp__round_up_u64(17, 16), 32);
    assert_int_equal(kvp__round_up_u64(32, 16), 32);
    assert_int_equal(kvp__round_up_u64(0, 256), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_status_table),
        cmocka_unit_test(test_status_unknown),
        cmocka_unit_test(test_errf),
        cmocka_unit_test(test_malloc_libc_and_hooks),
        cmocka_unit_test(test_allocator_check),
        cmocka_unit_test(test_copy_out_respects_struct_size),
        cmocka_unit_test(test_format_names),
        cmocka_unit_test(test_build_has),
        cmocka_unit_test(test_strcasecmp),
        cmocka_unit_test(test_checked_arithmetic),
    };
    return cmocka_run_group_tests_name("core", tests, NULL, NULL);
}
