/*
 * Layer: cuda (device discovery). The same test runs on every build:
 * CPU-only builds must say ENOTSUP; CUDA builds without a GPU must say
 * ENODEV cleanly; with a GPU, the device is described.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "kvpage_cuda.h"
#include "kvpage_ext.h"
#include "kvpage_tier.h"

static void test_bad_arguments(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    assert_int_equal(kvp_cuda_device_count(NULL, err, sizeof err), KVP_EINVAL);
    kvp_cuda_device_info_t info;
    memset(&info, 0, sizeof info); /* struct_size 0 */
    assert_int_equal(kvp_cuda_device_query(0, &info, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_cuda_device_query(0, NULL, err, sizeof err), KVP_EINVAL);
    info.struct_size = sizeof info;
    assert_int_equal(kvp_cuda_device_query(-1, &info, err, sizeof err), KVP_EINVAL);
}

static void test_device_discovery(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    int32_t count = -7;
    int rc = kvp_cuda_device_count(&count, err, sizeof err);
    kvp_cuda_device_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (!kvp_build_has(KVP_FEATURE_CUDA)) {
        assert_int_equal(rc, KVP_ENOTSUP);
        assert_non_null(strstr(err, "without CUDA"));
        assert_int_equal(count, -7);
        assert_int_equal(kvp_cuda_device_query(0, &info, err, sizeof err), KVP_ENOTSUP);
        print_message("CPU-only build: CUDA entry points report KVP_ENOTSUP\n");
        return;
    }
    if (rc == KVP_ENODEV) {
        assert_true(strlen(err) > 0);
        assert_int_equal(count, -7);
        assert_int_equal(kvp_cuda_device_query(0, &info, err, sizeof err), KVP_ENODEV);
        print_message("CUDA build, no usable GPU: %s\n", err);
        return;
    }
    assert_int_equal(rc, KVP_OK);
    assert_true(count >= 1);
    assert_int_equal(kvp_cuda_device_query(0, &info, err, sizeof err), KVP_OK);
    assert_true(info.total_bytes > 0);
    assert_true(info.free_bytes <= info.total_bytes);
    assert_true(info.cc_major >= 5);
    assert_true(strlen(info.name) > 0);
    print_message("GPU 0: %s, cc %d.%d, %llu bytes\n", info.name, info.cc_major, info.cc_minor,
                  (unsigned long long)info.total_bytes);
    assert_int_equal(kvp_cuda_device_query(count, &info, err, sizeof err), KVP_ENODEV);
}

/* Stores, contexts and kernels: ENOTSUP in a CPU-only build, ENODEV in a
 * CUDA build without a usable GPU (the simulated test suite covers the rest);
 * both cleanly, with the reason. */
static void test_entry_points_without_gpu(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    int32_t count = 0;
    bool gpu = kvp_build_has(KVP_FEATURE_CUDA) && kvp_cuda_device_count(&count, err, sizeof err) == KVP_OK;
    if (gpu) {
        print_message("a GPU is present: make test-cuda tests the backend on it\n");
        return;
    }
    int want = kvp_build_has(KVP_FEATURE_CUDA) ? KVP_ENODEV : KVP_ENOTSUP;
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = 1;
    sp.kv_heads = 1;
    sp.head_dim = 64;
    sp.num_pages = 4;
    kvp_cuda_params_t cp;
    kvp_cuda_params_init(&cp);
    assert_int_equal(cp.struct_size, sizeof cp);
    assert_int_equal(cp.device, 0);
    kvp_store_t *s = NULL;
    err[0] = '\0';
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), want);
    assert_null(s);
    assert_true(strlen(err) > 0);
    kvp_ctx_params_t xp;
    kvp_ctx_params_init(&xp);
    kvp_ctx_t *c = NULL;
    err[0] = '\0';
    assert_int_equal(kvp_cuda_ctx_create(&xp, &cp, &c, err, sizeof err), want);
    assert_null(c);
    assert_true(strlen(err) > 0);
    kvp_cache_params_t kp;
    kvp_cache_params_init(&kp);
    kp.layers = 1;
    kp.kv_heads = 1;
    kp.head_dim = 64;
    kp.num_pages = 4;
    kp.host_bytes = 1 << 20;
    kvp_cache_t *cache = NULL;
    err[0] = '\0';
    assert_int_equal(kvp_cuda_cache_create(&kp, &cp, &cache, err, sizeof err), want);
    assert_null(cache);
    assert_true(strlen(err) > 0);
    void *p = NULL;
    int rc = kvp_cuda_host_alloc(64, &p, err, sizeof err);
    if (kvp_build_has(KVP_FEATURE_CUDA)) assert_true(rc == KVP_OK || rc == KVP_ENODEV || rc == KVP_ENOMEM);
    else assert_int_equal(rc, KVP_ENOTSUP);
    kvp_cuda_host_free(rc == KVP_OK ? p : NULL);
    kvp_quant_desc_t q;
    memset(&q, 0, sizeof q);
    q.struct_size = sizeof q;
    q.format = KVP_FORMAT_FP16;
    q.page_size = 16;
    q.head_dim = 64;
    q.heads = 1;
    q.dtype = KVP_FORMAT_FP32;
    float x[16 * 64];
    uint8_t blk[2048];
    if (!kvp_build_has(KVP_FEATURE_CUDA)) {
        assert_int_equal(kvp_cuda_quantize(&q, x, 1, blk, NULL, err, sizeof err), KVP_ENOTSUP);
        assert_int_equal(kvp_cuda_dequantize(&q, blk, 1, x, NULL, err, sizeof err), KVP_ENOTSUP);
    }
    /* the CUDA-only calls on a CPU store or context say what is wrong, on
     * the object */
    int cpu_want = kvp_build_has(KVP_FEATURE_CUDA) ? KVP_EINVAL : KVP_ENOTSUP;
    kvp_store_t *cpu = NULL;
    assert_int_equal(kvp_store_create(&sp, &cpu, err, sizeof err), KVP_OK);
    assert_string_equal(kvp_store_last_error(cpu), "");
    assert_int_equal(kvp_cuda_store_set_stream(cpu, NULL), cpu_want);
    assert_true(strlen(kvp_store_last_error(cpu)) > 0);
    if (!kvp_build_has(KVP_FEATURE_CUDA))
        assert_non_null(strstr(kvp_store_last_error(cpu), "without CUDA"));
    /* the generic page I/O works on the CPU store */
    assert_int_equal(kvp_store_page_to_host(cpu, 0, 0, blk, 8), KVP_OK);
    kvp_store_destroy(cpu);
    kvp_ctx_t *cpu_ctx = NULL;
    assert_int_equal(kvp_ctx_create(&xp, &cpu_ctx, err, sizeof err), KVP_OK);
    assert_string_equal(kvp_ctx_last_error(cpu_ctx), "");
    assert_int_equal(kvp_cuda_ctx_set_stream(cpu_ctx, NULL), cpu_want);
    assert_true(strlen(kvp_ctx_last_error(cpu_ctx)) > 0);
    double secs = -1.0;
    assert_int_equal(kvp_cuda_ctx_set_timing(cpu_ctx, 1), cpu_want);
    assert_int_equal(kvp_cuda_ctx_kernel_time(cpu_ctx, &secs), cpu_want);
    assert_true(secs == -1.0); /* untouched on error */
    assert_int_equal(kvp_cuda_ctx_set_pipeline(cpu_ctx, 0), cpu_want);
    kvp_ctx_destroy(cpu_ctx);
    assert_int_equal(kvp_cuda_store_set_stream(NULL, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_set_stream(NULL, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_set_timing(NULL, 1), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_kernel_time(NULL, &secs), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_set_pipeline(NULL, 1), KVP_EINVAL);
}

/* kvp_build_has(KVP_FEATURE_CUDA) agrees with what the CUDA entry points
 * do: a build without CUDA answers KVP_ENOTSUP ("built without CUDA"), a
 * build with it answers OK or KVP_ENODEV. Unknown features are 0. */
static void test_build_has_cuda(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    int32_t count = -1;
    int rc = kvp_cuda_device_count(&count, err, sizeof err);
    if (kvp_build_has(KVP_FEATURE_CUDA)) {
        assert_int_equal(kvp_build_has(KVP_FEATURE_CUDA), 1);
        assert_true(rc == KVP_OK || rc == KVP_ENODEV);
    } else {
        assert_int_equal(kvp_build_has(KVP_FEATURE_CUDA), 0);
        assert_int_equal(rc, KVP_ENOTSUP);
        assert_non_null(strstr(err, "without CUDA"));
    }
    assert_int_equal(kvp_build_has(0), 0);
    assert_int_equal(kvp_build_has(KVP_FEATURE_BLOB + 1), 0);
    assert_int_equal(kvp_build_has(-1), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_build_has_cuda),
        cmocka_unit_test(test_device_discovery),
        cmocka_unit_test(test_entry_points_without_gpu),
    };
    return cmocka_run_group_tests_name("cuda_device", tests, NULL, NULL);
}
