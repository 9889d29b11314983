/*
 * gemm_peak.c - the GEMM rate oneDNN reaches on this machine: an N x N x N
 * matmul (f32 or bf16 inputs, f32 output) with both inputs in the layouts
 * the primitive picks (format_tag any, reordered once outside the timer),
 * as a skilled caller of oneDNN runs it. bench_train.py takes the best of
 * this, NumPy's BLAS and torch.mm as the machine's fp32 GEMM bound, and
 * reports each beside it. `make bench` builds it.
 *
 *   gemm_peak N f32|bf16 [ROUNDS]
 *
 * Threads are OpenMP's (OMP_NUM_THREADS). Each round times 5 products after
 * 3 untimed ones; prints one JSON object: dtype, n, the implementation
 * oneDNN chose, the best and the median of the rounds in GFLOP/s.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

#define MAX_ROUNDS 50
#define PER_ROUND  5

static void check(dnnl_status_t s, const char *what)
{
    if (s != dnnl_success) {
        fprintf(stderr, "gemm_peak: %s failed: oneDNN status %d\n", what, (int)s);
        exit(1);
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A memory object of desc md filled with small values (no NaN, no denormal). */
static dnnl_memory_t filled(const_dnnl_memory_desc_t md, dnnl_engine_t eng, dnnl_data_type_t dt)
{
    dnnl_memory_t m;
    check(dnnl_memory_create(&m, md, eng, DNNL_MEMORY_ALLOCATE), "memory_create");
    void *p;
    check(dnnl_memory_get_data_handle(m, &p), "get_data_handle");
    size_t bytes = dnnl_memory_desc_get_size(md);
    if (dt == dnnl_bf16) {
        uint16_t *v = p;
        for (size_t i = 0; i < bytes / 2; i++)
            v[i] = (uint16_t)(0x3f00u | (i % 128u)); /* 0.5 .. 0.99 */
    } else {
        float *v = p;
        for (size_t i = 0; i < bytes / 4; i++)
            v[i] = 0.5f + (float)(i % 128u) / 256.0f;
    }
    return m;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[2], "f32") != 0 && strcmp(argv[2], "bf16") != 0)) {
        fprintf(stderr, "usage: gemm_peak N f32|bf16 [ROUNDS]\n");
        return 2;
    }
    long n = strtol(argv[1], NULL, 10);
    int rounds = argc > 3 ? atoi(argv[3]) : 7;
    if (n < 16 || n > 16384 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "gemm_peak: N must be in [16, 16384] and ROUNDS in [1, %d]\n", MAX_ROUNDS);
        return 2;
    }
    dnnl_data_type_t dt = strcmp(argv[2], "bf16") == 0 ? dnnl_bf16 : dnnl_f32;

    dnnl_engine_t eng;
    dnnl_stream_t st;
    check(dnnl_engine_create(&eng, dnnl_cpu, 0), "engine_create");
    check(dnnl_stream_create(&st, eng, dnnl_stream_default_flags), "stream_create");
    dnnl_dims_t dims = {n, n};
    dnnl_memory_desc_t a, b, c;
    check(dnnl_memory_desc_create_with_tag(&a, 2, dims, dt, dnnl_format_tag_any), "src desc");
    check(dnnl_memory_desc_create_with_tag(&b, 2, dims, dt, dnnl_format_tag_any), "weights desc");
    check(dnnl_memory_desc_create_with_tag(&c, 2, dims, dnnl_f32, dnnl_ab), "dst desc");
    dnnl_primitive_desc_t pd;
    check(dnnl_matmul_primitive_desc_create(&pd, eng, a, b, NULL, c, NULL), "matmul desc");
    const char *impl = "?";
    check(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl), "impl query");
    dnnl_primitive_t mm;
    check(dnnl_primitive_create(&mm, pd), "primitive_create");
    dnnl_memory_t ma = filled(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), eng, dt);
    dnnl_memory_t mb = filled(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), eng, dt);
    dnnl_memory_t mc;
    check(dnnl_memory_create(&mc, c, eng, DNNL_MEMORY_ALLOCATE), "dst memory");
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};

    for (int i = 0; i < 3; i++)
        check(dnnl_primitive_execute(mm, st, 3, args), "execute");
    check(dnnl_stream_wait(st), "stream_wait");
    double rate[MAX_ROUNDS];
    const double flop = 2.0 * (double)n * (double)n * (double)n * PER_ROUND;
    for (int r = 0; r < rounds; r++) {
        double t = now();
        for (int i = 0; i < PER_ROUND; i++)
            check(dnnl_primitive_execute(mm, st, 3, args), "execute");
        check(dnnl_stream_wait(st), "stream_wait");
        rate[r] = flop / (now() - t) / 1e9;
    }
    qsort(rate, (size_t)rounds, sizeof rate[0], cmp_double);
    printf("{\"dtype\": \"%s\", \"n\": %ld, \"impl\": \"%s\", \"best_gflops\": %.2f, "
           "\"median_gflops\": %.2f}\n",
           argv[2], n, impl, rate[rounds - 1], rate[rounds / 2]);

    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    dnnl_primitive_destroy(mm);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_desc_destroy(a);
    dnnl_memory_desc_destroy(b);
    dnnl_memory_desc_destroy(c);
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return 0;
}
