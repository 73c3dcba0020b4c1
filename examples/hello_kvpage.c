/*
 * The smallest outside user of libkvpage: built against the *installed*
 * library with nothing but `pkg-config --cflags --libs kvpage`.
 *
 *   cc hello_kvpage.c $(pkg-config --cflags --libs kvpage)
 *
 * It checks that header and library agree, then asks the planner how many
 * 8k-token requests for Llama-3.1-8B fit on an H100 80GB, per KV format.
 */
#include <kvpage.h>
#include <kvpage_ext.h>  /* kvp_version_string, kvp_status_name, kvp_build_has */
#include <kvpage_plan.h> /* the planner and its presets */

#include <stdio.h>

int main(void) {
    if (kvp_version_number() != KVP_VERSION_NUMBER) {
        fprintf(stderr, "header %s but library %s\n", KVP_VERSION_STRING, kvp_version_string());
        return 1;
    }
    printf("libkvpage %s (CUDA backend: %s)\n", kvp_version_string(),
           kvp_build_has(KVP_FEATURE_CUDA) ? "built" : "not built");

    kvp_model_preset_t model = {.struct_size = sizeof model};
    kvp_gpu_preset_t gpu = {.struct_size = sizeof gpu};
    char err[KVP_ERR_SIZE];
    if (kvp_model_preset_find("llama-3.1-8b", &model, err, sizeof err) != KVP_OK ||
        kvp_gpu_preset_find("h100-80g", &gpu, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "lookup failed: %s\n", err);
        return 1;
    }

    kvp_plan_params_t p;
    kvp_plan_params_init(&p);
    p.layers = model.layers;
    p.kv_heads = model.kv_heads;
    p.head_dim = model.head_dim;
    p.q_heads = model.q_heads;
    p.memory_bytes = gpu.memory_bytes;
    p.context = 8192;
    int rc = kvp_weight_bytes(model.params, "bf16", &p.weight_bytes, err, sizeof err);
    if (rc != KVP_OK) {
        fprintf(stderr, "%s: %s\n", kvp_status_name(rc), err);
        return 1;
    }

    const int32_t formats[] = {KVP_FORMAT_FP16, KVP_FORMAT_INT8, KVP_FORMAT_INT4};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        p.k_format = p.v_format = formats[i];
        kvp_plan_t plan = {.struct_size = sizeof plan};
        rc = kvp_plan_compute(&p, &plan, err, sizeof err);
        if (rc != KVP_OK) {
            fprintf(stderr, "%s: %s\n", kvp_status_name(rc), err);
            return 1;
        }
        printf("%s on %s, %s KV: %llu sequences of %llu tokens (%llu pages of %llu bytes)\n",
               model.name, gpu.name, kvp_format_name(formats[i]),
               (unsigned long long)plan.max_seqs, (unsigned long long)plan.context,
               (unsigned long long)plan.num_pages, (unsigned long long)plan.page_bytes);
    }

    /* Bad input is a status and a sentence, never a crash. */
    p.layers = 0;
    kvp_plan_t plan = {.struct_size = sizeof plan};
    rc = kvp_plan_compute(&p, &plan, err, sizeof err);
    printf("layers=0 -> %s: %s\n", kvp_status_name(rc), err);
    return rc == KVP_EINVAL ? 0 : 1;
}
