/* test_net_ps_optim.c - a ps shard with an nn_optim optimizer over loopback:
 * construction rules (global-norm clipping on a partial shard, apply and
 * optim together), Adam on two shards equal to Adam run locally, the full
 * state (params, step, optimizer state and step) through the client, and
 * the workers' model state (PUT_STATE / MEAN_STATE) averaged by the ps. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "net/ps.h"
#include "net/sock.h"
#include "nn/nn_optim.h"

#define TOTAL 37
#define NPS   2
#define STEPS 5

static const uint8_t secret[32] = "0123456789abcdef0123456789abcdef";

static void *serve_main(void *arg)
{
    SgError err;
    int rc = ps_server_serve((PsServer *)arg, 20.0, &err);
    if (rc != 1)
        fprintf(stderr, "serve returned %d: %s\n", rc, rc < 0 ? err.msg : "");
    return (void *)(long)rc;
}

static float grad(int t, int i)
{
    return (float)((t * 31 + i * 17) % 23 - 11) / 7.0f;
}

static void test_construction_rules(void)
{
    OptimConfig oc;
    optim_config_default(&oc, OPTIM_ADAM);
    oc.clip_norm = 1.0f;
    Optimizer *o = NULL;
    SgError err;
    CHECK(optim_create(&o, &oc, 10, &err) == 0);
    PsServerConfig cfg = {.total = 20, .offset = 10, .count = 10, .num_workers = 1, .optim = o};
    PsServer *s = NULL;
    CHECK(ps_server_new(-1, secret, sizeof secret, &cfg, &s, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "global norm") != NULL && s == NULL);
    cfg.total = 10, cfg.offset = 0; /* the whole buffer: accepted */
    CHECK(ps_server_new(-1, secret, sizeof secret, &cfg, &s, &err) == 0);
    ps_server_free(s);
    s = NULL;
    cfg.apply = ps_apply_sgd;
    CHECK(ps_server_new(-1, secret, sizeof secret, &cfg, &s, &err) == SG_EINVAL && s == NULL);
    optim_free(o);
}

static void test_adam_on_two_shards(void)
{
    SgError err;
    int lfd[NPS], port[NPS];
    const char *hosts[NPS];
    Optimizer *opt[NPS];
    PsServer *srv[NPS];
    pthread_t th[NPS];
    float init[TOTAL], local[TOTAL], g[TOTAL], got[TOTAL];
    for (int i = 0; i < TOTAL; i++)
        init[i] = local[i] = (float)i / TOTAL - 0.5f;
    OptimConfig oc;
    optim_config_default(&oc, OPTIM_ADAM);
    oc.lr = 0.05f;
    for (int k = 0; k < NPS; k++) {
        uint64_t off, cnt;
        CHECK(ps_shard_range(TOTAL, NPS, k, &off, &cnt, &err) == 0);
        CHECK(net_listen("127.0.0.1", 0, 8, &lfd[k], &port[k], NULL, 0, &err) == 0);
        CHECK(optim_create(&opt[k], &oc, (size_t)cnt, &err) == 0);
        PsServerConfig cfg = {.total = TOTAL,
                              .offset = off,
                              .count = cnt,
                              .num_workers = 1,
                              .mode = PS_MODE_ASYNC,
                              .init = init + off,
                              .optim = opt[k],
                              .security = NET_SEC_ENCRYPT};
        CHECK(ps_server_new(lfd[k], secret, sizeof secret, &cfg, &srv[k], &err) == 0);
        CHECK(ps_server_optim_state_size(srv[k]) == 2 * cnt);
        hosts[k] = "127.0.0.1";
        CHECK(pthread_create(&th[k], NULL, serve_main, srv[k]) == 0);
    }
    PsClient *c = NULL;
    CHECK(ps_client_connect(hosts, port, NPS, secret, sizeof secret, NET_SEC_ENCRYPT, TOTAL, NULL,
                            0, 0, 10.0, &c, &err) == 0);
    Optimizer *ref = NULL;
    CHECK(optim_create(&ref, &oc, TOTAL, &err) == 0);
    uint64_t step = 0;
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < TOTAL; i++)
            g[i] = grad(t, i);
        CHECK(ps_client_exchange(c, PS_OP_PUSH_PULL, g, got, &step, NULL, &err) == 0 &&
              step == (uint64_t)t + 1);
        CHECK(optim_step(ref, local, g, TOTAL, &err) == 0);
    }
    CHECK(memcmp(got, local, sizeof got) == 0); /* elementwise rule, same code: bit-identical */

    PsOptState st[NPS];
    float params[TOTAL];
    CHECK(ps_client_get_state(c, params, &step, st, &err) == 0);
    CHECK(step == STEPS && memcmp(params, local, sizeof params) == 0);
    for (int k = 0; k < NPS; k++) {
        uint64_t off, cnt;
        ps_shard_range(TOTAL, NPS, k, &off, &cnt, &err);
        CHECK(st[k].present && st[k].step == STEPS && st[k].len == 2 * cnt);
        /* Adam's first moment of shard k equals the reference's slice */
        CHECK(st[k].state != NULL &&
              memcmp(st[k].state, optim_state(ref) + off, cnt * sizeof(float)) == 0);
    }
    /* restore an earlier point: step 2, moments halved */
    for (int k = 0; k < NPS; k++) {
        for (size_t i = 0; i < st[k].len; i++)
            st[k].state[i] *= 0.5f;
        st[k].step = 2;
    }
    CHECK(ps_client_set_state(c, init, 2, st, &err) == 0);
    for (int k = 0; k < NPS; k++) {
        float p[TOTAL];
        uint64_t s;
        int64_t os;
        float *slots = malloc(ps_server_optim_state_size(srv[k]) * sizeof(float));
        CHECK(ps_server_get_state(srv[k], p, &s, slots, &os, &err) == 0);
        CHECK(s == 2 && os == 2 && memcmp(slots, st[k].state, st[k].len * sizeof(float)) == 0);
        free(slots);
    }
    st[1].len = 3; /* wrong size: refused by the shard, nothing changes */
    CHECK(ps_client_set_state(c, local, 9, st, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "optimizer state has 3 floats") != NULL);
    ps_opt_states_free(st, NPS);
    CHECK(ps_client_done(c, &err) == 0);
    for (int k = 0; k < NPS; k++) {
        void *rc;
        pthread_join(th[k], &rc);
        CHECK((long)rc == 1);
        ps_server_free(srv[k]);
        optim_free(opt[k]);
        net_close(&lfd[k]);
    }
    ps_client_free(c);
    optim_free(ref);
}

#define NSTATE 5

/* Two workers on two "auth" shards put their model states; the mean is
 * theirs, a second put replaces the first, sizes must agree. */
static void test_model_state_is_averaged_over_the_workers(void)
{
    SgError err;
    int lfd[NPS], port[NPS];
    const char *hosts[NPS];
    PsServer *srv[NPS];
    pthread_t th[NPS];
    float init[TOTAL] = {0};
    for (int k = 0; k < NPS; k++) {
        uint64_t off, cnt;
        CHECK(ps_shard_range(TOTAL, NPS, k, &off, &cnt, &err) == 0);
        CHECK(net_listen("127.0.0.1", 0, 8, &lfd[k], &port[k], NULL, 0, &err) == 0);
        PsServerConfig cfg = {.total = TOTAL,
                              .offset = off,
                              .count = cnt,
                              .num_workers = 2,
                              .mode = PS_MODE_SYNC,
                              .init = init + off,
                              .lr = 0.1f,
                              .security = NET_SEC_AUTH};
        CHECK(ps_server_new(lfd[k], secret, sizeof secret, &cfg, &srv[k], &err) == 0);
        hosts[k] = "127.0.0.1";
        CHECK(pthread_create(&th[k], NULL, serve_main, srv[k]) == 0);
    }
    PsClient *c[2] = {NULL, NULL};
    for (int w = 0; w < 2; w++)
        CHECK(ps_client_connect(hosts, port, NPS, secret, sizeof secret, NET_SEC_AUTH, TOTAL, NULL,
                                0, w, 10.0, &c[w], &err) == 0);
    float a[NSTATE], b[NSTATE], got[NSTATE], keep[NSTATE];
    for (int i = 0; i < NSTATE; i++) {
        a[i] = (float)i; /* means of these are exact in float32 */
        b[i] = 3.0f * (float)i + 0.5f;
        got[i] = keep[i] = -7.0f;
    }
    int n = -1;
    /* before any put: 0 workers, the buffer left as it is */
    CHECK(ps_client_mean_state(c[0], got, NSTATE, &n, &err) == 0 && n == 0);
    CHECK(memcmp(got, keep, sizeof got) == 0);

    CHECK(ps_client_put_state(c[0], a, NSTATE, &n, &err) == 0 && n == 1);
    CHECK(ps_client_mean_state(c[1], got, NSTATE, &n, &err) == 0 && n == 1);
    CHECK(memcmp(got, a, sizeof got) == 0);
    CHECK(ps_client_put_state(c[1], b, NSTATE, &n, &err) == 0 && n == 2);
    CHECK(ps_client_mean_state(c[0], got, NSTATE, &n, &err) == 0 && n == 2);
    for (int i = 0; i < NSTATE; i++)
        CHECK(got[i] == 2.0f * (float)i + 0.25f);

    /* worker 0 puts again: its own state is replaced, still two workers */
    for (int i = 0; i < NSTATE; i++)
        a[i] = -b[i] + 2.0f;
    CHECK(ps_client_put_state(c[0], a, NSTATE, &n, &err) == 0 && n == 2);
    CHECK(ps_client_mean_state(c[1], got, NSTATE, &n, &err) == 0 && n == 2);
    for (int i = 0; i < NSTATE; i++)
        CHECK(got[i] == 1.0f);

    /* another size: refused naming both sizes and the worker, nothing changes */
    float big[NSTATE + 1] = {0};
    CHECK(ps_client_put_state(c[1], big, NSTATE + 1, &n, &err) == SG_ECLUSTER);
    CHECK(strstr(err.msg, "worker 1 put 6 floats of model state") != NULL);
    CHECK(strstr(err.msg, "put 5") != NULL);
    CHECK(ps_client_mean_state(c[0], got, NSTATE - 1, &n, &err) == SG_ECLUSTER);
    CHECK(strstr(err.msg, "mean of 4 floats") != NULL && strstr(err.msg, "put 5") != NULL);
    /* the refusals left both clients usable and the state as it was */
    CHECK(ps_client_mean_state(c[1], got, NSTATE, &n, &err) == 0 && n == 2);
    for (int i = 0; i < NSTATE; i++)
        CHECK(got[i] == 1.0f);
    /* above the cap: refused before anything is sent or read */
    CHECK(ps_client_put_state(c[0], a, (size_t)PS_STATE_MAX + 1, &n, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "at most 268435456") != NULL);

    for (int w = 0; w < 2; w++) {
        CHECK(ps_client_done(c[w], &err) == 0);
        ps_client_free(c[w]);
    }
    for (int k = 0; k < NPS; k++) {
        void *rc;
        pthread_join(th[k], &rc);
        CHECK((long)rc == 1);
        ps_server_free(srv[k]);
        net_close(&lfd[k]);
    }
}

int main(void)
{
    test_construction_rules();
    test_adam_on_two_shards();
    test_model_state_is_averaged_over_the_workers();
    return check_report("test_net_ps_optim");
}
