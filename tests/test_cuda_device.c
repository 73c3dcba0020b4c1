/*
 * Layer: cuda (device discovery). The same test runs on every build:
 * CPU-only builds must say ENOTSUP; CUDA builds without a GPU must say
 * ENODEV cleanly; with a GPU, the device is described.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "kvpage_cuda.h"

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
    if (!kvp_build_has_cuda()) {
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_device_discovery),
    };
    return cmocka_run_group_tests_name("cuda_device", tests, NULL, NULL);
}
